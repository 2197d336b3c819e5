// The figure page: the image with its panel and region boxes over it (SVG in image pixels), zoom
// and pan, toggles per level, and a card per panel with its regions. A box and its card light up
// together on hover; the hit opened from a search (?focus=level:id) is highlighted and scrolled to.
// Box tags sit outside the boxes' top-left corners, where the printed panel labels usually are.
"use strict";

(() => {
  const { el, svg, request, setImage, setStatus, fmt } = P2P;
  const status = document.getElementById("status");
  const figureId = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop() || "");
  const focus = new URLSearchParams(window.location.search).get("focus") || "";
  const focusId = focus.includes(":") ? focus.split(":")[1] : "";

  P2P.bindKeyInput(document.getElementById("api-key"));

  function provenance(value) {
    if (!value || typeof value !== "object") return null;
    const rows = Object.entries(value).map(([k, v]) =>
      el("div", {}, el("span", { class: "label", text: k + ":" }), typeof v === "object" ? JSON.stringify(v) : String(v))
    );
    return rows.length ? el("div", { class: "provenance-detail" }, ...rows) : null;
  }

  function row(label, value) {
    if (value === null || value === undefined || value === "" || value === "–") return null;
    return el("div", { class: "row" }, el("span", { class: "label", text: label }), String(value));
  }

  // --- boxes and their tags ---------------------------------------------------------------------

  function tagPlace(box, size) {
    // Above the box's right end; at the figure's top edge, inside its top-right corner.
    const [, y0, x1] = box;
    if (y0 - size - 2 >= 0) return { x: x1, y: y0 - 4, anchor: "end" };
    return { x: x1 - 4, y: y0 + size + 2, anchor: "end" };
  }

  function rect(box, level, id, tag, size) {
    const [x0, y0, x1, y1] = box;
    const group = svg("g", { "data-id": id, "data-level": level, class: "item" + (id === focusId ? " focus" : "") });
    group.append(
      svg("rect", {
        class: "box " + level,
        x: x0, y: y0, width: Math.max(0, x1 - x0), height: Math.max(0, y1 - y0),
        "data-level": level, "data-id": id,
      })
    );
    if (tag) {
      const at = tagPlace(box, size);
      group.append(svg("text", { class: "tag " + level, x: at.x, y: at.y, "text-anchor": at.anchor, "font-size": size, text: tag }));
    }
    return group;
  }

  // --- cards ------------------------------------------------------------------------------------

  function regionName(panel, index) {
    return (panel.label || "") + (index + 1);
  }

  function regionCard(panel, region, index) {
    const kind = region.kind + (region.marker_type ? " (" + region.marker_type + ")" : "");
    return el(
      "div",
      { class: "region" + (region.id === focusId ? " focus" : ""), "data-id": region.id },
      el("div", {}, el("span", { class: "badge region", text: regionName(panel, index) }), kind),
      row("caption text:", region.caption_text),
      row("description:", region.description),
      region.caption_text || region.description ? null : el("div", { class: "muted", text: "no text for this region" }),
      row("confidence:", fmt(region.confidence, 2)),
      provenance(region.provenance)
    );
  }

  function panelCard(panel) {
    return el(
      "div",
      { class: "card" + (panel.id === focusId ? " focus" : ""), "data-id": panel.id, "data-level": "panel" },
      el("h3", {}, el("span", { class: "badge panel", text: "panel" }), panel.label || "(no label)"),
      row("subcaption:", panel.subcaption),
      row("description:", panel.description),
      row("type:", [panel.figure_type, panel.modality].filter(Boolean).join(" / ")),
      row("confidence:", fmt(panel.confidence, 2)),
      provenance(panel.provenance),
      panel.regions.length ? el("div", { class: "regions" }, ...panel.regions.map((r, i) => regionCard(panel, r, i))) : null
    );
  }

  // --- linking boxes and cards ------------------------------------------------------------------

  function linked(id) {
    return Array.from(document.querySelectorAll('[data-id="' + CSS.escape(id) + '"]')).filter(
      (node) => node.tagName === "g" || node.classList.contains("card") || node.classList.contains("region")
    );
  }

  function hover(node) {
    const id = node.dataset.id;
    node.addEventListener("mouseenter", () => linked(id).forEach((n) => n.classList.add("hover")));
    node.addEventListener("mouseleave", () => linked(id).forEach((n) => n.classList.remove("hover")));
  }

  function bindToggle(level, group) {
    const toggle = document.getElementById("toggle-" + level);
    const apply = () => group.classList.toggle("hidden", !toggle.checked);
    toggle.addEventListener("change", apply);
    apply();
  }

  // --- zoom and pan -----------------------------------------------------------------------------

  function zoomable(viewport, stage) {
    let scale = 1, tx = 0, ty = 0, drag = null;
    const apply = () => {
      stage.style.transform = "translate(" + tx + "px, " + ty + "px) scale(" + scale + ")";
      viewport.classList.toggle("zoomed", scale > 1);
    };
    const zoomAt = (factor, cx, cy) => {
      const next = Math.min(8, Math.max(1, scale * factor));
      tx = cx - (cx - tx) * (next / scale);
      ty = cy - (cy - ty) * (next / scale);
      scale = next;
      if (scale === 1) tx = ty = 0;
      apply();
    };
    const centre = () => [viewport.clientWidth / 2, viewport.clientHeight / 2];
    viewport.addEventListener("wheel", (event) => {
      event.preventDefault();
      const r = viewport.getBoundingClientRect();
      zoomAt(event.deltaY < 0 ? 1.2 : 1 / 1.2, event.clientX - r.left, event.clientY - r.top);
    }, { passive: false });
    // The browser's own image drag-and-drop would take over the pointer after its first move.
    viewport.addEventListener("dragstart", (event) => event.preventDefault());
    viewport.addEventListener("pointerdown", (event) => {
      if (scale === 1) return;
      event.preventDefault();
      drag = { x: event.clientX - tx, y: event.clientY - ty };
      viewport.setPointerCapture(event.pointerId);
    });
    viewport.addEventListener("pointermove", (event) => {
      if (!drag) return;
      tx = event.clientX - drag.x;
      ty = event.clientY - drag.y;
      apply();
    });
    viewport.addEventListener("pointerup", () => { drag = null; });
    document.getElementById("zoom-in").addEventListener("click", () => zoomAt(1.5, ...centre()));
    document.getElementById("zoom-out").addEventListener("click", () => zoomAt(1 / 1.5, ...centre()));
    document.getElementById("zoom-reset").addEventListener("click", () => { scale = 1; tx = ty = 0; apply(); });
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
    const image = document.getElementById("figure-image");
    await setImage(image, figure.image_url);
    // the boxes' places on the page (for scrolling to the opened hit) exist once the image has loaded
    await new Promise((resolve) => {
      if (image.complete && image.naturalWidth) resolve();
      else {
        image.addEventListener("load", resolve, { once: true });
        image.addEventListener("error", resolve, { once: true });
      }
    });
    const panels = document.getElementById("panel-boxes");
    const regions = document.getElementById("region-boxes");
    const size = Math.max(12, Math.round(Math.max(figure.width, figure.height) / 45));
    let regionCount = 0;
    for (const panel of figure.panels) {
      panels.append(rect(panel.box, "panel", panel.id, panel.label || "", size));
      panel.regions.forEach((region, index) => {
        regionCount += 1;
        regions.append(rect(region.box_in_figure, "region", region.id, regionName(panel, index), Math.round(size * 0.75)));
      });
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
        row("ids:", [article.pmcid, article.pmid, article.doi].filter(Boolean).join(" · "))
      );
    } else {
      box.append(el("div", { class: "muted", text: "no article metadata" }));
    }
    const items = document.getElementById("items");
    items.replaceChildren(...figure.panels.map(panelCard));
    document.querySelectorAll("#overlay g.item, #items .card, #items .region").forEach(hover);
    const provenanceToggle = document.getElementById("toggle-provenance");
    const showProvenance = () => document.body.classList.toggle("show-provenance", provenanceToggle.checked);
    provenanceToggle.addEventListener("change", showProvenance);
    showProvenance();
    zoomable(document.getElementById("viewport"), document.getElementById("stage"));
    if (focusId) {
      const card = items.querySelector('[data-id="' + CSS.escape(focusId) + '"]');
      if (card) card.scrollIntoView({ block: "center" });
      // and the figure's own column (sticky, scrolling on its own) to the hit's box
      const box = document.querySelector('#overlay g.item[data-id="' + CSS.escape(focusId) + '"]');
      const column = document.getElementById("figure-column");
      if (box) {
        const r = box.getBoundingClientRect(), c = column.getBoundingClientRect();
        column.scrollTop += r.top - c.top - (c.height - r.height) / 2;
      }
    }
    setStatus(status, figure.panels.length ? "" : "This figure has no mined panels yet.");
  }

  load().catch((error) => setStatus(status, error.message, true));
})();
