// The figure page: the image with its panel and region boxes over it (SVG in image pixels),
// toggles per level, and each box's texts (subcaption; region caption text and description).
"use strict";

(() => {
  const { el, svg, request, setImage, setStatus, fmt } = P2P;
  const status = document.getElementById("status");
  const figureId = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop() || "");
  const focus = new URLSearchParams(window.location.search).get("focus") || "";
  const focusId = focus.includes(":") ? focus.split(":")[1] : "";

  P2P.bindKeyInput(document.getElementById("api-key"));

  function provenance(value) {
    if (!value || typeof value !== "object") return "";
    return Object.entries(value)
      .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v))
      .join(" · ");
  }

  function row(label, value) {
    if (value === null || value === undefined || value === "") return null;
    return el("div", { class: "row" }, el("span", { class: "label", text: label }), String(value));
  }

  function rect(box, level, id, label) {
    const [x0, y0, x1, y1] = box;
    const group = svg("g", { "data-id": id });
    group.append(
      svg("rect", {
        class: "box " + level + (id === focusId ? " focus" : ""),
        x: x0, y: y0, width: Math.max(0, x1 - x0), height: Math.max(0, y1 - y0),
        "data-level": level, "data-id": id,
      })
    );
    if (label) group.append(svg("text", { class: level, x: x0 + 4, y: y0 + (level === "panel" ? 20 : 14), text: label }));
    return group;
  }

  // Both text pathways are always listed, "—" where a pathway gave nothing.
  function pathway(label, value) {
    return el("div", { class: "row" }, el("span", { class: "label", text: label }), value || "—");
  }

  function regionCard(region, index) {
    const name = "region " + (index + 1) + " · " + region.kind + (region.marker_type ? " (" + region.marker_type + ")" : "");
    return el(
      "div",
      { class: "region" + (region.id === focusId ? " focus" : ""), "data-id": region.id },
      el("div", {}, el("span", { class: "badge region", text: "region" }), name),
      pathway("caption text:", region.caption_text),
      pathway("description:", region.description),
      row("confidence:", fmt(region.confidence, 2)),
      el("div", { class: "provenance", text: provenance(region.provenance) })
    );
  }

  function panelCard(panel) {
    return el(
      "div",
      { class: "card" + (panel.id === focusId ? " focus" : ""), "data-id": panel.id, "data-level": "panel" },
      el("h3", {}, el("span", { class: "badge panel", text: "panel" }), panel.label || "(no label)"),
      pathway("subcaption:", panel.subcaption),
      pathway("description:", panel.description),
      row("type:", [panel.figure_type, panel.modality].filter(Boolean).join(" / ")),
      row("confidence:", fmt(panel.confidence, 2)),
      el("div", { class: "provenance", text: provenance(panel.provenance) }),
      panel.regions.length ? el("div", { class: "regions" }, ...panel.regions.map(regionCard)) : null
    );
  }

  function bindToggle(level, group) {
    const toggle = document.getElementById("toggle-" + level);
    const apply = () => group.classList.toggle("hidden", !toggle.checked);
    toggle.addEventListener("change", apply);
    apply();
  }

  async function load() {
    setStatus(status, "Loading figure…");
    const figure = await request("GET", "/v1/figures/" + encodeURIComponent(figureId));
    document.title = "Panel2Patch · " + (figure.figure_label || "figure");
    document.getElementById("figure-title").textContent =
      (figure.figure_label || "Figure") + " · " + figure.width + "×" + figure.height + " · " + figure.status +
      (figure.miner_version ? " · mined by " + figure.miner_version : "");
    const overlay = document.getElementById("overlay");
    overlay.setAttribute("viewBox", "0 0 " + figure.width + " " + figure.height);
    await setImage(document.getElementById("figure-image"), figure.image_url);
    const panels = document.getElementById("panel-boxes");
    const regions = document.getElementById("region-boxes");
    let regionCount = 0;
    for (const panel of figure.panels) {
      panels.append(rect(panel.box, "panel", panel.id, panel.label || ""));
      for (const region of panel.regions) {
        regionCount += 1;
        regions.append(rect(region.box_in_figure, "region", region.id, ""));
      }
    }
    document.getElementById("count-panel").textContent = String(figure.panels.length);
    document.getElementById("count-region").textContent = String(regionCount);
    bindToggle("panel", panels);
    bindToggle("region", regions);
    document.getElementById("caption").textContent = figure.caption || "(no caption)";
    const article = figure.article;
    const box = document.getElementById("article");
    if (article) {
      box.append(
        el("h3", { text: article.title || "(untitled article)" }),
        row("journal:", article.journal),
        row("year:", article.year),
        row("license:", [article.license, article.license_group].filter(Boolean).join(" · ")),
        row("ids:", [article.pmcid, article.doi].filter(Boolean).join(" · "))
      );
    } else {
      box.append(el("div", { class: "provenance", text: "no article metadata" }));
    }
    document.getElementById("items").replaceChildren(...figure.panels.map(panelCard));
    setStatus(status, figure.panels.length ? "" : "This figure has no mined panels yet.");
  }

  load().catch((error) => setStatus(status, error.message, true));
})();
