// Panel2Patch viewer helpers: API calls (with an optional API key) and small DOM builders.
"use strict";

const P2P = (() => {
  // The key lives for the browser session only (sessionStorage), never on disk.
  const KEY = "p2p-api-key";

  function apiKey() {
    return window.sessionStorage.getItem(KEY) || "";
  }

  function bindKeyInput(input) {
    if (!input) return;
    input.value = apiKey();
    input.addEventListener("change", () => {
      const value = input.value.trim();
      if (value) window.sessionStorage.setItem(KEY, value);
      else window.sessionStorage.removeItem(KEY);
    });
  }

  function headers(extra) {
    const out = Object.assign({}, extra || {});
    const key = apiKey();
    if (key) out.Authorization = "Bearer " + key;
    return out;
  }

  async function request(method, url, body) {
    const init = { method, headers: headers() };
    if (body instanceof FormData) init.body = body;
    else if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const response = await fetch(url, init);
    let payload = null;
    try { payload = await response.json(); } catch (_) { payload = null; }
    if (!response.ok) {
      const message = payload && payload.error ? payload.error.message : response.statusText;
      const error = new Error(message || ("HTTP " + response.status));
      error.status = response.status;
      throw error;
    }
    return payload;
  }

  // Images need the API key too when the server requires one: fetch them as blobs then.
  async function setImage(img, url) {
    if (!url) return;
    if (!apiKey()) { img.src = url; return; }
    try {
      const response = await fetch(url, { headers: headers() });
      if (!response.ok) throw new Error("HTTP " + response.status);
      img.src = URL.createObjectURL(await response.blob());
    } catch (_) {
      img.alt = "image unavailable";
    }
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, String(value));
    }
    return node;
  }

  function setStatus(node, message, isError) {
    node.textContent = message || "";
    node.classList.toggle("error", Boolean(isError));
  }

  function fmt(value, digits) {
    return typeof value === "number" ? value.toFixed(digits === undefined ? 3 : digits) : "–";
  }

  return { apiKey, bindKeyInput, request, setImage, el, svg, setStatus, fmt };
})();
