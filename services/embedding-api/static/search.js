// The search page: one query (text or image) against every checked level; results as a grid.
"use strict";

(() => {
  const { el, request, setImage, setStatus, fmt } = P2P;
  const form = document.getElementById("search-form");
  const textInput = document.getElementById("query-text");
  const imageInput = document.getElementById("query-image");
  const kInput = document.getElementById("query-k");
  const status = document.getElementById("status");
  const results = document.getElementById("results");
  const toggles = Array.from(document.querySelectorAll("#level-toggles input[data-level]"));
  let hits = [];
  let lastQuery = null;
  const fetched = new Set();

  P2P.bindKeyInput(document.getElementById("api-key"));

  function checkedLevels() {
    return toggles.filter((t) => t.checked).map((t) => t.dataset.level);
  }

  function card(hit) {
    const img = el("img", { alt: hit.level + " " + hit.id, loading: "lazy" });
    setImage(img, hit.crop_url);
    const title = hit.article && hit.article.title ? hit.article.title : (hit.figure.figure_label || "");
    const label = hit.panel && hit.panel.label ? " " + hit.panel.label : "";
    return el(
      "div",
      {
        class: "hit",
        "data-level": hit.level,
        "data-id": hit.id,
        title: hit.text || "",
        onclick: () => {
          window.location.href = "/figures/" + hit.figure_id + "?focus=" + hit.level + ":" + hit.id;
        },
      },
      el("div", { class: "thumb" }, img),
      el(
        "div",
        { class: "meta" },
        el("span", { class: "badge " + hit.level, text: hit.level + label }),
        el("span", { class: "score", text: fmt(hit.score) }),
        el("div", { class: "text", text: hit.text || "" }),
        el("div", { class: "provenance", text: title })
      )
    );
  }

  function render() {
    const shown = new Set(checkedLevels());
    const visible = hits.filter((h) => shown.has(h.level)).sort((a, b) => b.score - a.score);
    results.replaceChildren(...visible.map(card));
    if (lastQuery) {
      setStatus(status, visible.length + " result" + (visible.length === 1 ? "" : "s") + " for " + lastQuery.label);
    }
  }

  async function searchLevel(level) {
    const k = Math.max(1, parseInt(kInput.value, 10) || 12);
    if (lastQuery.file) {
      const data = new FormData();
      data.append("image", lastQuery.file);
      data.append("level", level);
      data.append("k", String(k));
      return request("POST", "/v1/search", data);
    }
    return request("POST", "/v1/search", { text: lastQuery.text, level, k });
  }

  async function fetchLevels(levels) {
    const todo = levels.filter((l) => !fetched.has(l));
    if (!todo.length) return;
    setStatus(status, "Searching " + todo.join(", ") + "…");
    const answers = await Promise.all(todo.map(searchLevel));
    for (const [i, answer] of answers.entries()) {
      fetched.add(todo[i]);
      hits = hits.concat(answer.hits);
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = imageInput.files && imageInput.files[0];
    const text = textInput.value.trim();
    if (!file && !text) {
      setStatus(status, "Type a query or choose an image.", true);
      return;
    }
    lastQuery = file ? { file, label: "image " + file.name } : { text, label: "“" + text + "”" };
    hits = [];
    fetched.clear();
    results.replaceChildren();
    try {
      await fetchLevels(checkedLevels());
      render();
    } catch (error) {
      setStatus(status, error.message, true);
    }
  });

  for (const toggle of toggles) {
    toggle.addEventListener("change", async () => {
      if (!lastQuery) return;
      try {
        await fetchLevels(checkedLevels());
        render();
      } catch (error) {
        setStatus(status, error.message, true);
      }
    });
  }

  imageInput.addEventListener("change", () => {
    if (imageInput.files && imageInput.files.length) textInput.value = "";
  });

  request("GET", "/readyz")
    .then((ready) => {
      const space = ready.space || {};
      document.getElementById("model").textContent = "model: " + (space.model || "?") + " · " + (space.search || "");
    })
    .catch(() => {});
})();
