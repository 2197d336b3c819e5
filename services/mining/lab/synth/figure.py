"""Assemble one synthetic compound figure and its ground truth (``generate_figure``)."""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.lab.synth import charts, sources, vocab
from p2p.mining.lab.synth.captions import MarkerMention, PanelText, build_caption
from p2p.mining.lab.synth.fonts import LABEL_FONTS
from p2p.mining.lab.synth.labels import LABEL_STYLES, LabelPatch, label_sequence, printed, render_label
from p2p.mining.lab.synth.layout import LAYOUT_KINDS, make_layout, split_group
from p2p.mining.lab.synth.markers import MarkerDraw, Painter
from p2p.mining.lab.synth.util import (
    Rect,
    luminance,
    paste_alpha,
    rect_h,
    rect_w,
    scale_inclusive,
    scale_point,
    to_inclusive,
    translate,
    weighted,
)

PROFILES = ("classic", "realistic")
GENERATOR_VERSION = "2"  # 2: only bare letters and numbers are circled
PANEL_TYPE_NAMES = ("image", "plot", "schematic", "table")
STYLE_WEIGHTS = {
    "A": 3.0,
    "a": 3.0,
    "(a)": 1.5,
    "(A)": 1.5,
    "A.": 1.0,
    "a.": 0.8,
    "1": 0.8,
    "(1)": 0.6,
    "i": 0.7,
    "(i)": 0.6,
    "1a": 0.8,
}
CIRCLED_STYLES = ("A", "a", "1")  # label styles that a drawn circle may enclose
MARKER_WEIGHTS = {
    "arrow": 3.0,
    "arrowhead": 1.5,
    "asterisk": 1.0,
    "star": 0.8,
    "box": 1.0,
    "circle": 1.0,
    "inset": 0.9,
}
N_PANEL_WEIGHTS = (0.04, 0.1, 0.12, 0.14, 0.1, 0.14, 0.06, 0.1, 0.06, 0.05, 0.03, 0.06)  # 1..12 panels
SCALE_VALUES = {
    "ihc": ("50 µm", "100 µm", "200 µm", "20 µm"),
    "fluorescence": ("10 µm", "20 µm", "50 µm", "5 \u03bcm"),
    "phase": ("50 µm", "100 µm"),
    "em": ("5 nm", "20 nm", "50 nm", "100 nm", "200 nm", "1 µm"),
    "ct": ("1 cm", "5 mm", "2 cm"),
    "mri": ("1 cm", "5 mm"),
    "ultrasound": ("1 cm",),
    "fundus": ("1 mm",),
}
OVERLAY_TEXT = {
    "fluorescence": ("DAPI", "Merge", "Ki-67", "GFP"),
    "ihc": ("HE", "\u00d740", "\u00d7200"),
    "em": ("t = 10 s", "Δt = 52 s", "SMNp", "BM"),
    "ct": ("R", "L", "Pre", "Post"),
    "mri": ("T2W", "T1W", "FLAIR", "R"),
    "phase": ("Day 7", "0 h", "24 h"),
    "ultrasound": ("LT", "RT"),
}


@dataclass
class FigureOptions:
    """Everything ``generate_figure`` can be told; None means "draw it from the seed"."""

    width: int = 1000
    height: int = 800
    n_panels: int | None = None
    layout: str | None = None  # one of LAYOUT_KINDS
    gutter: int | None = None  # px between cells; 0 = touching panels
    margin: int | None = None
    label_style: str | None = None  # one of LABEL_STYLES, or "none"
    label_position: str | None = None  # "inside" (image panels) or "outside"
    label_decoration: str | None = None  # "plain" or "circled"
    label_font: str | None = None
    label_size: int | None = None
    panel_types: dict[str, float] | None = None  # weights over PANEL_TYPE_NAMES
    marker_rate: float | None = None  # probability an image panel carries markers
    marker_kinds: tuple[str, ...] | None = None
    scale_bars: bool | None = None
    frame: bool | None = None
    token_format: str | None = None
    group_rate: float = 0.1
    max_plots: int = 4
    scale: float = 1.0  # rescale of the whole figure (boxes scaled with it)
    jpeg_quality: int | None = None  # JPEG round trip of the returned image


@dataclass
class _Panel:
    index: int
    cell: Rect
    type: str
    label: str | None
    content: Rect = (0, 0, 0, 0)
    box: Rect = (0, 0, 0, 0)
    strip: str | None = None  # where an outside label sits: "top" / "left"
    modality: str | None = None
    source: str | None = None
    info: dict[str, Any] | None = None
    group: str | None = None
    subs: list[Rect] | None = None
    label_patch: LabelPatch | None = None
    label_pos: tuple[int, int] | None = None
    label_inside: bool = False
    markers: list[MarkerDraw] | None = None
    scale_bar: tuple[Rect, str] | None = None
    overlays: list[tuple[str, Rect]] | None = None
    row: int = 0


_weighted = weighted


def _options(options: dict[str, Any]) -> FigureOptions:
    names = {f.name for f in fields(FigureOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unknown generate_figure options: {', '.join(unknown)}")
    opts = FigureOptions(**options)
    if opts.label_style not in (None, "none", *LABEL_STYLES):
        raise ValueError(f"label_style must be one of {LABEL_STYLES} or 'none'")
    if opts.layout not in (None, *LAYOUT_KINDS):
        raise ValueError(f"layout must be one of {LAYOUT_KINDS}")
    if opts.n_panels is not None and not 1 <= opts.n_panels <= 12:
        raise ValueError("n_panels must be between 1 and 12")
    if opts.width < 120 or opts.height < 90:
        raise ValueError("figure must be at least 120 x 90 pixels")
    return opts


def generate_figure(seed: int, **options: Any) -> tuple[Image.Image, dict[str, Any]]:
    """A synthetic compound figure and its ground truth, fully determined by ``seed`` and options.

    The ground truth has the keys of the real development set's annotations.json entries (width,
    height, panels, label_boxes, markers, extra_markers, scale_bars, subcaptions, subcaption_pieces,
    caption, title, article_url, license, image_url, notes), boxes inclusive, plus marker
    ``target_box``/``direction_deg`` and a ``synth`` block recording how the figure was made.

    ``profile="realistic"`` draws figures composed as real ones are instead (``realistic.py``;
    its own options, see ``RealisticOptions``); the default "classic" profile is unchanged.
    """
    profile = options.pop("profile", "classic")
    if profile == "realistic":
        from p2p.mining.lab.synth.realistic import generate_realistic

        return generate_realistic(seed, **options)
    if profile != "classic":
        raise ValueError(f"profile must be one of {PROFILES}, not {profile!r}")
    opts = _options(options)
    rng = np.random.default_rng(seed)
    W, H = int(opts.width), int(opts.height)
    unit = min(W, H) / 800.0

    # -- global choices -----------------------------------------------------------------------
    n = opts.n_panels or int(rng.choice(12, p=np.array(N_PANEL_WEIGHTS) / sum(N_PANEL_WEIGHTS))) + 1
    style = opts.label_style or ("none" if rng.random() < 0.07 else _weighted(rng, STYLE_WEIGHTS))
    if opts.gutter is not None:
        gutter = int(opts.gutter)
    else:
        band = _weighted(rng, {"zero": 0.12, "narrow": 0.25, "medium": 0.4, "wide": 0.23})
        lo, hi = {"zero": (0, 0), "narrow": (2, 6), "medium": (7, 20), "wide": (21, 45)}[band]
        gutter = int(rng.integers(lo, hi + 1)) if hi else 0
        gutter = round(gutter * max(0.5, unit)) if gutter > 2 else gutter
    position = opts.label_position or ("inside" if rng.random() < 0.4 else "outside")
    if gutter == 0 and opts.label_position is None:
        position = "inside"
    decoration = opts.label_decoration or ("circled" if rng.random() < 0.1 else "plain")
    if opts.label_decoration is None and style not in CIRCLED_STYLES:
        # papers circle a bare letter or number, never "(viii)" or "4a." (a 60-px disc)
        decoration = "plain"
    font_name = opts.label_font or _weighted(rng, dict(LABEL_FONTS))
    label_size = opts.label_size or int(np.clip(round(min(W, H) * float(rng.uniform(0.02, 0.036))), 9, 40))
    frame = opts.frame if opts.frame is not None else bool(rng.random() < 0.08)
    frame_w = int(rng.integers(1, 3)) if frame else 0
    margin = int(opts.margin) if opts.margin is not None else int(rng.choice([0, 0, 2, 4, 8, 12, 20, 30]))
    margin = round(margin * max(0.5, unit)) if margin > 2 else margin
    if frame:
        margin = max(margin, frame_w + 4)
    layout_kind = opts.layout or _weighted(
        rng, {"grid": 0.35, "rows": 0.25, "columns": 0.1, "guillotine": 0.3}
    )
    theme = _weighted(rng, {"images": 0.42, "mixed": 0.38, "plots": 0.12, "diagram": 0.08})
    type_weights = (
        opts.panel_types
        or {
            "images": {"image": 1.0},
            "mixed": {"image": 0.55, "plot": 0.38, "schematic": 0.04, "table": 0.03},
            "plots": {"plot": 0.85, "image": 0.1, "table": 0.05},
            "diagram": {"schematic": 0.4, "table": 0.25, "plot": 0.2, "image": 0.15},
        }[theme]
    )
    marker_rate = (
        opts.marker_rate if opts.marker_rate is not None else float(rng.choice([0.0, 0.35, 0.6, 0.9]))
    )
    with_bars = opts.scale_bars if opts.scale_bars is not None else bool(rng.random() < 0.55)
    bar_corner = "right" if rng.random() < 0.75 else "left"
    inside_corner = _weighted(
        rng, {"top-left": 0.72, "top-right": 0.12, "bottom-left": 0.1, "bottom-right": 0.06}
    )
    inside_pad = int(rng.integers(0, 9) * max(0.6, unit))
    circle_variant = str(rng.choice(["outline", "light", "dark"]))
    strip_side = "top" if rng.random() < 0.7 else "left"
    figure_number = int(rng.integers(1, 9))
    image_border = bool(rng.random() < 0.1)

    # -- labels and layout ---------------------------------------------------------------------
    labels: list[str | None]
    if style == "none":
        labels = [None] * n
        seq: list[str] = []
    else:
        seq = label_sequence(style, n, figure_number)
        labels = list(seq)
    patches = {lab: render_label(printed(style, lab), font_name, label_size, decoration) for lab in seq}
    strip_h = max((p.glyph[3] - p.glyph[1] for p in patches.values()), default=0) + int(rng.integers(2, 6))
    strip_w = max((p.glyph[2] - p.glyph[0] for p in patches.values()), default=0) + int(rng.integers(2, 6))
    area = (margin, margin, W - margin, H - margin)
    cells: list[Rect] = []
    for _ in range(8):
        cells = make_layout(rng, area, n, gutter, layout_kind)
        if min(min(rect_w(c) for c in cells) - strip_w, min(rect_h(c) for c in cells) - strip_h) >= 36:
            break
        n = max(1, n - 1)
        labels = labels[:n]
        seq = seq[:n]
    ys = sorted({c[1] for c in cells})

    panels: list[_Panel] = []
    n_plots = 0
    for i, cell in enumerate(cells):
        kind = _weighted(rng, type_weights)
        cw, ch = rect_w(cell), rect_h(cell)
        need = {"plot": (115, 90), "table": (140, 80), "schematic": (120, 80)}.get(kind)
        if need and (cw - strip_w < need[0] or ch - strip_h < need[1]):
            kind = "image"
        if kind == "plot":
            if n_plots >= opts.max_plots:
                kind = "image"
            else:
                n_plots += 1
        panels.append(_Panel(index=i, cell=cell, type=kind, label=labels[i], row=ys.index(cell[1])))

    canvas = np.full((H, W, 3), 255, np.uint8)
    used_sources: list[str] = []
    prev_modality: str | None = None
    for p in panels:
        patch = patches.get(p.label) if p.label is not None else None
        p.label_patch = patch
        x0, y0, x1, y1 = p.cell
        if patch is not None:
            gw, gh = patch.glyph[2] - patch.glyph[0], patch.glyph[3] - patch.glyph[1]
            fits = gw + inside_pad * 2 < 0.45 * (x1 - x0) and gh + inside_pad * 2 < 0.45 * (y1 - y0)
            p.label_inside = p.type == "image" and position == "inside" and fits
            if not p.label_inside:
                p.strip = strip_side
        if p.strip == "top":
            p.content = (x0, y0 + strip_h, x1, y1)
        elif p.strip == "left":
            p.content = (x0 + strip_w, y0, x1, y1)
        else:
            p.content = p.cell
        cx0, cy0, cx1, cy1 = p.content
        cw, ch = cx1 - cx0, cy1 - cy0
        if p.type == "image":
            if prev_modality is not None and rng.random() < 0.55:
                modality = prev_modality
            else:
                modality = sources.choose_modality(rng)
            p.modality = prev_modality = modality
            arr = np.full((ch, cw, 3), 255, np.uint8)
            if cw >= 120 and ch >= 80 and rng.random() < opts.group_rate:
                gap = int(rng.integers(0, 5))
                arrangement, subs = split_group(rng, (0, 0, cw, ch), gap)
                p.group, p.subs = arrangement, subs
                for sx0, sy0, sx1, sy1 in subs:
                    sub, _, name = sources.render_image(rng, sx1 - sx0, sy1 - sy0, modality)
                    arr[sy0:sy1, sx0:sx1] = sub
                    used_sources.append(name)
            else:
                arr, _, name = sources.render_image(rng, cw, ch, modality)
                arr = arr.copy()
                used_sources.append(name)
            if image_border:
                arr[0, :] = arr[-1, :] = arr[:, 0] = arr[:, -1] = 0
            p.box = p.content
            _decorate_image(rng, p, arr, inside_corner, inside_pad, with_bars, bar_corner, marker_rate, opts)
        else:
            if p.type == "plot":
                arr, info = charts.render_plot(rng, cw, ch)
            elif p.type == "schematic":
                arr, info = charts.render_schematic(rng, cw, ch)
            else:
                arr, info = charts.render_table(rng, cw, ch)
            p.info = info
            ah, aw = arr.shape[:2]
            ox = 0 if rng.random() < 0.7 else (cw - aw) // 2
            p.box = (cx0 + ox, cy0, cx0 + ox + aw, cy0 + ah)
            if p.strip is None and p.label is None:  # unlabelled: centre in the cell
                p.box = translate(p.box, 0, (ch - ah) // 2)
        bx0, by0, bx1, by1 = p.box
        canvas[by0:by1, bx0:bx1] = arr
        _draw_label(rng, canvas, p, inside_corner, inside_pad, circle_variant)

    if frame:
        canvas[:frame_w, :] = canvas[-frame_w:, :] = 0
        canvas[:, :frame_w] = canvas[:, -frame_w:] = 0

    # -- caption --------------------------------------------------------------------------------
    texts = []
    bar_values: dict[str, str] = {}
    for p in panels:
        mentions: dict[str, MarkerMention] = {}
        for m in p.markers or []:
            if m.kind in mentions:
                mentions[m.kind].count += 1
            else:
                mentions[m.kind] = MarkerMention(m.kind, 1, m.color_name, m.style.startswith("dashed"))
        texts.append(
            PanelText(
                label=p.label,
                type=p.type,
                modality=p.modality,
                info=p.info or {},
                markers=list(mentions.values()),
                scale_bar=bar_values.setdefault(p.modality or "", _bar_value(rng, p))
                if p.scale_bar
                else None,
                group=p.group,
                row=p.row,
            )
        )
    cap = build_caption(rng, texts, seq, token_format=opts.token_format)

    # -- output image: rescale, JPEG ------------------------------------------------------------
    image = Image.fromarray(canvas, "RGB")
    sx = sy = 1.0
    if opts.scale != 1.0:
        nw, nh = max(1, round(W * opts.scale)), max(1, round(H * opts.scale))
        image = image.resize(
            (nw, nh), Image.Resampling.LANCZOS if opts.scale < 1 else Image.Resampling.BICUBIC
        )
        sx, sy = nw / W, nh / H
    if opts.jpeg_quality is not None:
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=int(opts.jpeg_quality))
        buf.seek(0)
        with Image.open(buf) as jpg:
            image = jpg.convert("RGB")

    def box_out(r: Rect) -> list[int]:
        inc = to_inclusive(r)
        return inc if (sx, sy) == (1.0, 1.0) else scale_inclusive(inc, sx, sy)

    def point_out(pt: tuple[int, int]) -> list[int]:
        return [int(pt[0]), int(pt[1])] if (sx, sy) == (1.0, 1.0) else scale_point(pt, sx, sy)

    gt_panels, label_boxes, markers, bars, overlays = [], {}, [], [], []
    for p in panels:
        entry: dict[str, Any] = {"label": p.label, "box": box_out(p.box), "type": p.type}
        entry["printed_label"] = printed(style, p.label) if p.label is not None else None
        if p.modality:
            entry["modality"] = p.modality
        if p.info:
            entry["content"] = p.info.get("kind")
        if p.subs:
            entry["group"] = p.group
            entry["subimages"] = [box_out(translate(s, p.box[0], p.box[1])) for s in p.subs]
        gt_panels.append(entry)
        if p.label is not None and p.label_patch is not None and p.label_pos is not None:
            g = p.label_patch.glyph
            label_boxes[p.label] = box_out(translate(g, *p.label_pos))
        for m in p.markers or []:
            ox, oy = p.box[0] + m.offset[0], p.box[1] + m.offset[1]
            mk: dict[str, Any] = {
                "kind": m.kind,
                "glyph_box": box_out(translate(m.glyph, ox, oy)),
                "target_point": point_out((m.target_point[0] + ox, m.target_point[1] + oy)),
                "target_box": box_out(translate(m.target_box, ox, oy)),
                "panel": p.label,
                "panel_index": p.index,
            }
            if m.direction_deg is not None:
                mk["direction_deg"] = m.direction_deg
            mk["color"] = list(m.color)
            mk["note"] = m.note
            mk["text"] = cap.marker_phrases.get((p.index, m.kind))
            if m.tag is not None and m.tag_box is not None:
                mk["tag"] = m.tag
                mk["tag_box"] = box_out(translate(m.tag_box, ox, oy))
            markers.append(mk)
        if p.scale_bar is not None:
            (rect, colour), off = p.scale_bar, _bar_offset(p)
            bars.append(
                (box_out(translate(rect, p.box[0] + off[0], p.box[1] + off[1])), p.label, colour, p.index)
            )
        for text, rect in p.overlays or []:
            overlays.append(
                {"text": text, "box": box_out(translate(rect, p.box[0], p.box[1])), "panel": p.label}
            )

    out_w, out_h = image.size
    gt: dict[str, Any] = {
        "width": out_w,
        "height": out_h,
        "panels": gt_panels,
        "label_boxes": label_boxes,
        "markers": markers,
        "extra_markers": [],
        "scale_bars": [b[0] for b in bars],
        "subcaptions": cap.subcaptions,
        "subcaption_pieces": cap.pieces,
        "caption": cap.caption,
        "title": f"Synthetic compound figure (seed {seed})",
        "article_url": None,
        "license": None,
        "image_url": None,
        "notes": [],
        "synth": {
            "generator": f"p2p.mining.lab.synth {GENERATOR_VERSION}",
            "seed": int(seed),
            "options": {k: v for k, v in asdict(opts).items() if v is not None},
            "canvas": [W, H],
            "scale": [sx, sy],
            "jpeg_quality": opts.jpeg_quality,
            "theme": theme,
            "layout": layout_kind,
            "gutter": gutter,
            "margin": margin,
            "cells": [to_inclusive(p.cell) for p in panels],
            "frame": box_out((0, 0, W, H)) if frame else None,
            "frame_width": frame_w,
            "label_style": style,
            "label_position": position,
            "label_decoration": decoration,
            "label_font": font_name,
            "label_size": label_size,
            "label_sequence": seq,
            "token_format": cap.token_format,
            "caption_fragments": cap.fragments,
            "caption_trailing": cap.trailing,
            "scale_bars": [{"box": b, "panel": lab, "color": c, "panel_index": i} for b, lab, c, i in bars],
            "text_overlays": overlays,
            "sources": sorted(set(used_sources)),
        },
    }
    if style == "none":
        gt["notes"].append("Panels carry no printed labels; the whole caption is preamble.")
    return image, gt


def _bar_offset(p: _Panel) -> tuple[int, int]:
    if p.subs:
        s = max(p.subs, key=lambda r: rect_w(r) * rect_h(r))
        return (s[0], s[1])
    return (0, 0)


def _bar_value(rng: np.random.Generator, p: _Panel) -> str:
    values = SCALE_VALUES.get(p.modality or "", ("50 µm",))
    value = vocab.pick(rng, values)
    return value.replace(" ", "\u2009") if rng.random() < 0.2 else value


def _label_rect(patch: LabelPatch, w: int, h: int, corner: str, pad: int) -> tuple[int, int]:
    """Top-left position of the label patch so its glyph sits ``pad`` px from the panel corner."""
    g = patch.glyph
    gw, gh = g[2] - g[0], g[3] - g[1]
    gx = pad if "left" in corner else w - pad - gw
    gy = pad if "top" in corner else h - pad - gh
    return gx - g[0], gy - g[1]


def _decorate_image(
    rng: np.random.Generator,
    p: _Panel,
    arr: np.ndarray,
    corner: str,
    pad: int,
    with_bars: bool,
    bar_corner: str,
    marker_rate: float,
    opts: FigureOptions,
) -> None:
    """Reserve the inside label, then draw overlays, a scale bar and markers on the panel pixels."""
    ch, cw = arr.shape[:2]
    reserved: list[Rect] = []
    if p.label_inside and p.label_patch is not None:
        lx, ly = _label_rect(p.label_patch, cw, ch, corner, pad)
        g = p.label_patch.glyph
        reserved.append((lx + g[0] - 3, ly + g[1] - 3, lx + g[2] + 3, ly + g[3] + 3))
        p.label_pos = (p.box[0] + lx, p.box[1] + ly)
    # Markers, bars and overlays go on the largest sub-image of a group.
    sub = max(p.subs, key=lambda r: rect_w(r) * rect_h(r)) if p.subs else (0, 0, cw, ch)
    view = arr[sub[1] : sub[3], sub[0] : sub[2]]
    local_reserved = [translate(r, -sub[0], -sub[1]) for r in reserved]
    painter = Painter(rng, view, local_reserved)
    p.overlays = []
    if p.modality in OVERLAY_TEXT and rng.random() < 0.2 and min(cw, ch) >= 100:
        text = vocab.pick(rng, OVERLAY_TEXT[p.modality])
        lum = luminance(view)
        spot = "top-right" if "left" in corner else "top-left"
        rect = painter.text_overlay(text, "white" if lum < 128 else "black", spot)
        if rect is not None:
            p.overlays.append((text, translate(rect, sub[0], sub[1])))
    if with_bars and p.modality in SCALE_VALUES and min(rect_w(sub), rect_h(sub)) >= 60:
        bar = painter.scale_bar(bar_corner)
        if bar is not None:
            p.scale_bar = bar
    p.markers = []
    if min(rect_w(sub), rect_h(sub)) >= 70 and rng.random() < marker_rate:
        allowed = opts.marker_kinds or tuple(MARKER_WEIGHTS)
        table = {k: MARKER_WEIGHTS[k] for k in allowed if k in MARKER_WEIGHTS}
        kinds = [_weighted(rng, table)]
        if rng.random() < 0.3 and len(table) > 1:
            kinds.append(_weighted(rng, table))
        if "inset" in kinds:  # the inset comes first: it copies clean pixels; no other boxes then
            kinds = ["inset"] + [k for k in kinds if k not in ("inset", "box")]
        drawn: list[MarkerDraw] = []
        for kind in dict.fromkeys(kinds):
            if kind == "inset":
                drawn += painter.inset()
                continue
            count = (
                int(rng.integers(1, 4))
                if kind in ("arrow", "arrowhead", "asterisk", "star")
                else int(rng.integers(1, 3))
            )
            style = str(rng.choice(["line", "block", "open", "thin"]))
            colour: str | None = None
            for _ in range(count):
                m: MarkerDraw | None
                if kind in ("arrow", "arrowhead"):
                    m = painter.arrow(kind, style=style, colour=colour)
                elif kind in ("asterisk", "star"):
                    m = painter.symbol(kind, colour=colour)
                else:
                    m = painter.enclosure(kind, colour=colour)
                if m is not None:
                    colour = m.color_name  # one colour per kind within a panel
                    drawn.append(m)
        for m in drawn:
            m.offset = (sub[0], sub[1])
        p.markers = drawn


def _draw_label(
    rng: np.random.Generator, canvas: np.ndarray, p: _Panel, corner: str, pad: int, circle_variant: str
) -> None:
    patch = p.label_patch
    if patch is None or p.label is None:
        return
    if not p.label_inside:  # in the strip reserved above or left of the content
        g = patch.glyph
        if p.strip == "top":
            gx = p.cell[0] if rng.random() < 0.6 else min(p.box[0], p.cell[2] - rect_w(g))
            p.label_pos = (gx - g[0], p.cell[1] - g[1])
        else:
            p.label_pos = (p.cell[0] - g[0], max(p.cell[1], p.box[1]) - g[1])
    assert p.label_pos is not None
    lx, ly = p.label_pos
    g = patch.glyph
    under = canvas[max(0, ly + g[1]) : ly + g[3], max(0, lx + g[0]) : lx + g[2]]
    dark_bg = luminance(under) < 128
    fg = (255, 255, 255) if dark_bg else (0, 0, 0)
    if patch.fill_alpha is not None:
        variant = circle_variant if p.label_inside else ("dark" if circle_variant == "dark" else "outline")
        if variant == "light":
            paste_alpha(canvas, lx, ly, (255, 255, 255), patch.fill_alpha)
            fg = (0, 0, 0)
        elif variant == "dark":
            paste_alpha(canvas, lx, ly, (0, 0, 0), patch.fill_alpha)
            fg = (255, 255, 255)
    paste_alpha(canvas, lx, ly, fg, patch.alpha)


def describe_options() -> dict[str, Any]:
    """Default option values (for documentation and the CLI)."""
    return asdict(FigureOptions())
