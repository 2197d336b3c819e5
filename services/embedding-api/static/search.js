// The search page. A text search lives in the URL (?q=...&level=panel,region&k=12&page=0), so it
// can be shared and Back returns to it; image searches (a local file) cannot, but page the same way.
// Without a query the page shows the corpus counts and the newest figures.
"use strict";

(() => {
  const { el, request, setImage, setStatus, fmt } = P2P;
  const LEVELS = ["figure", "panel", "region"];
  const form = document.getElementById("search-form");
  const textInput = document.getElementById("query-text");
  const imageInput = document.getElementById("query-image");
  const kInput = document.getElementById("query-k");
  const status = document.getElementById("status");
  const results = document.getElementById("results");
  const pager = document.getElementById("pager");
  const landing = document.getElementById("landing");
  const toggles = Array.from(document.querySelectorAll("#level-toggles input[data-level]"));
  let query = null; // {text} or {file}, with levels, k, page
  let more = false;
  let runs = 0; // only the latest search may draw its answers
  let recentOffset = 0;

  P2P.bindKeyInput(document.getElementById("api-key"));

  function checkedLevels() {
    return toggles.filter((t) => t.checked).map((t) => t.dataset.level);
  }

  function figureLink(figureId, focus) {
    return "/figures/" + encodeURIComponent(figureId) + (focus ? "?focus=" + encodeURIComponent(focus) : "");
  }

  function card(hit) {
    const img = el("img", { alt: hit.level + " " + hit.id, loading: "lazy" });
    setImage(img, hit.crop_url);
    const title = hit.article && hit.article.title ? hit.article.title : (hit.figure.figure_label || "");
    const label = hit.panel && hit.panel.label ? " " + hit.panel.label : "";
    return el(
      "a",
      { class: "hit", href: figureLink(hit.figure_id, hit.level + ":" + hit.id), "data-level": hit.level, "data-id": hit.id, title: hit.text || "" },
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

  function figureCard(figure) {
    const img = el("img", { alt: "figure " + figure.id, loading: "lazy" });
    setImage(img, figure.image_url);
    return el(
      "a",
      { class: "hit", href: figureLink(figure.id), "data-figure": figure.id, title: figure.caption },
      el("div", { class: "thumb" }, img),
      el(
        "div",
        { class: "meta" },
        el("span", { class: "badge figure", text: figure.figure_label || "figure" }),
        el("div", { class: "text", text: figure.caption || "(no caption)" })
      )
    );
  }

  // --- the URL holds the text search -------------------------------------------------------------

  function fromUrl() {
    const params = new URLSearchParams(window.location.search);
    const text = (params.get("q") || "").trim();
    const levels = (params.get("level") || LEVELS.join(",")).split(",").filter((l) => LEVELS.includes(l));
    const k = Math.min(200, Math.max(1, parseInt(params.get("k") || "12", 10) || 12));
    const page = Math.max(0, parseInt(params.get("page") || "0", 10) || 0);
    return { text, levels: levels.length ? levels : LEVELS, k, page };
  }

  function toUrl(q) {
    const params = new URLSearchParams();
    params.set("q", q.text);
    if (q.levels.length !== LEVELS.length) params.set("level", q.levels.join(","));
    if (q.k !== 12) params.set("k", String(q.k));
    if (q.page) params.set("page", String(q.page));
    return "/?" + params.toString();
  }

  function showForm(q) {
    textInput.value = q.text || "";
    kInput.value = String(q.k);
    for (const t of toggles) t.checked = q.levels.includes(t.dataset.level);
  }

  // --- searching -----------------------------------------------------------------------------------

  async function searchLevel(level) {
    const offset = query.page * query.k;
    if (query.file) {
      const data = new FormData();
      data.append("image", query.file);
      data.append("level", level);
      data.append("k", String(query.k));
      data.append("offset", String(offset));
      return request("POST", "/v1/search", data);
    }
    return request("POST", "/v1/search", { text: query.text, level, k: query.k, offset });
  }

  async function run() {
    // The previous hits stay until the new ones arrive: toggling a level swaps the grid at once.
    landing.hidden = true;
    const levels = query.levels;
    if (!levels.length) {
      results.replaceChildren();
      pager.hidden = true;
      setStatus(status, "Tick at least one level.", true);
      return;
    }
    setStatus(status, "Searching " + levels.join(", ") + "…");
    const ticket = ++runs;
    try {
      const answers = await Promise.all(levels.map(searchLevel));
      if (ticket !== runs) return;
      const hits = answers.flatMap((a) => a.hits).sort((a, b) => b.score - a.score);
      more = answers.some((a) => a.hits.length === query.k);
      results.replaceChildren(...hits.map(card));
      const what = query.file ? "image " + query.file.name : "“" + query.text + "”";
      const first = query.page * query.k + 1;
      setStatus(status, hits.length + " result" + (hits.length === 1 ? "" : "s") + " for " + what + (query.page ? " (from hit " + first + " of each level)" : ""));
      pager.hidden = !(more || query.page > 0);
      document.getElementById("prev-page").disabled = query.page === 0;
      document.getElementById("next-page").disabled = !more;
      document.getElementById("page-info").textContent = "page " + (query.page + 1);
    } catch (error) {
      if (ticket === runs) setStatus(status, error.message, true);
    }
  }

  function go(q, push) {
    query = q;
    if (!q.file) {
      showForm(q);
      if (push) window.history.pushState(null, "", toUrl(q));
    }
    return run();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const file = imageInput.files && imageInput.files[0];
    const text = textInput.value.trim();
    const k = Math.min(200, Math.max(1, parseInt(kInput.value, 10) || 12));
    if (!file && !text) {
      setStatus(status, "Type a query or choose an image.", true);
      return;
    }
    go(file ? { file, levels: checkedLevels(), k, page: 0 } : { text, levels: checkedLevels(), k, page: 0 }, true);
  });

  for (const toggle of toggles) {
    toggle.addEventListener("change", () => {
      if (query) go(Object.assign({}, query, { levels: checkedLevels(), page: 0 }), true);
    });
  }

  document.getElementById("prev-page").addEventListener("click", () => {
    if (query && query.page > 0) go(Object.assign({}, query, { page: query.page - 1 }), true);
  });
  document.getElementById("next-page").addEventListener("click", () => {
    if (query && more) go(Object.assign({}, query, { page: query.page + 1 }), true);
  });

  imageInput.addEventListener("change", () => {
    if (imageInput.files && imageInput.files.length) textInput.value = "";
  });

  // --- landing: corpus counts and the newest figures ----------------------------------------------

  async function loadRecent() {
    const corpus = await request("GET", "/v1/corpus?limit=12&offset=" + recentOffset);
    document.getElementById("corpus-counts").textContent =
      corpus.figures + " figures · " + corpus.panels + " panels · " + corpus.regions + " regions · " + corpus.articles + " articles";
    document.getElementById("recent").append(...corpus.recent.map(figureCard));
    recentOffset += corpus.recent.length;
    document.getElementById("more-recent").hidden = recentOffset >= corpus.figures;
  }

  function showLanding() {
    query = null;
    showForm({ text: "", levels: LEVELS, k: 12 });
    results.replaceChildren();
    pager.hidden = true;
    setStatus(status, "");
    landing.hidden = false;
    if (!recentOffset) loadRecent().catch((error) => setStatus(status, error.message, true));
  }

  document.getElementById("more-recent").addEventListener("click", () => {
    loadRecent().catch((error) => setStatus(status, error.message, true));
  });

  function route() {
    const q = fromUrl();
    if (q.text) go(q, false);
    else showLanding();
  }

  window.addEventListener("popstate", route);
  route();

  request("GET", "/readyz")
    .then((ready) => {
      const space = ready.space || {};
      document.getElementById("model").textContent = "model: " + (space.model || "?") + " · " + (space.search || "");
    })
    .catch(() => {});
})();
