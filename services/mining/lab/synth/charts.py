"""Non-photographic panels: plots (matplotlib Agg), flow diagrams and tables (PIL).

Every renderer draws on a white canvas of the requested size and returns the canvas cropped to its
ink (minimum RGB < 225), so the returned array's extent is the panel's tight content box: for plots
the axes frame plus tick labels, axis titles, legend, colour bar and in-plot text.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image, ImageDraw

from p2p.mining.lab.synth import vocab
from p2p.mining.lab.synth.fonts import BODY_FONTS, BOLD_OF, PLOT_FAMILIES, get_font
from p2p.mining.lab.synth.util import crop_to_ink

PLOT_KINDS = ("bar", "line", "scatter", "heatmap", "hist", "box", "survival", "spectrum")
SPECTRUM_AXES = (  # (x axis, from, to, what the caption calls the curves)
    ("Energy loss (eV)", 350.0, 700.0, "EELS spectra"),
    ("Binding energy (eV)", 330.0, 380.0, "XPS spectra"),
    ("2\u03b8 (degree)", 20.0, 80.0, "XRD patterns"),
    ("Wavenumber (cm$^{-1}$)", 400.0, 1800.0, "FTIR spectra"),
    ("Energy (keV)", 0.0, 10.0, "EDS spectra"),
)
PEAK_NAMES = ("Ag M4,5", "O K", "Mn L2,3", "Pd 3d", "(111)", "(200)", "C=O", "Amide I", "Cu K\u03b1")
CATEGORY_SETS = (
    ("Air electrode", "Ag", "BM", "PM", "SMNp", "Pt/C"),
    ("Control", "LPS", "LPS + Dex", "IL-4", "IL-13"),
    ("Day 0", "Day 3", "Day 7", "Day 14"),
)
PIL_KINDS = ("bar", "line", "scatter")
PALETTES = (
    ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"),
    ("#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00"),
    ("#000000", "#7f7f7f", "#bfbfbf", "#404040", "#a0a0a0"),
    ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"),
    ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9"),
)
HEAT_CMAPS = ("viridis", "RdBu_r", "coolwarm", "magma", "bwr", "YlOrRd", "PuOr_r")

Info = dict[str, Any]


def _axes_rect(
    w: int, h: int, fs_px: float, right_extra: float = 0.0, bottom_extra: float = 0.0, title: bool = False
) -> tuple[float, float, float, float]:
    """Margins wide enough for tick labels and axis titles; the result is cropped to ink anyway."""
    left = min(0.5, (fs_px * 6.0 + 6) / w)
    bottom = min(0.5, (fs_px * 3.6 + 6 + bottom_extra) / h)
    top = 1.0 - min(0.25, (fs_px * (2.4 if title else 1.0) + 4) / h)
    right = 1.0 - min(0.35, (fs_px * 1.5 + 4 + right_extra) / w)
    return (left, bottom, max(0.05, right - left), max(0.05, top - bottom))


def render_plot(
    rng: np.random.Generator,
    w: int,
    h: int,
    kind: str | None = None,
    engine: str | None = None,
    *,
    title: bool = True,
) -> tuple[np.ndarray, Info]:
    """A plot panel drawn into ``w`` x ``h`` pixels and cropped to its ink.

    ``engine`` "matplotlib" (all kinds) or "pil" (a plainer, faster look for bar/line/scatter plots);
    by default about a third of bar/line/scatter plots use the PIL engine. ``title=False`` never
    draws the title a quarter of matplotlib plots get (the real set's conventions keep a title
    above the axes out of the panel's box); the draw from ``rng`` happens either way.
    """
    w, h = max(40, int(w)), max(40, int(h))
    kind = kind or vocab.pick(rng, PLOT_KINDS)
    if engine is None:
        engine = "pil" if kind in PIL_KINDS and rng.random() < 0.35 else "matplotlib"
    if engine == "pil" and kind in PIL_KINDS:
        return _render_plot_pil(rng, w, h, kind)
    family = vocab.pick(rng, PLOT_FAMILIES)
    fs_pt = float(np.clip(min(w, h) / 28.0, 5.5, 10.0)) * float(rng.uniform(0.85, 1.1))
    dpi = 100.0
    fs_px = fs_pt * dpi / 72.0
    palette = vocab.pick(rng, PALETTES)
    groups = vocab.pick(rng, vocab.GROUPS)
    quantity_axis, quantity = vocab.pick(rng, vocab.QUANTITIES)
    info: Info = {"kind": kind, "quantity": quantity, "groups": list(groups)}
    rc = {
        "font.family": family,
        "font.size": fs_pt,
        "axes.linewidth": float(rng.uniform(0.6, 1.4)),
        "xtick.labelsize": fs_pt * 0.9,
        "ytick.labelsize": fs_pt * 0.9,
        "legend.fontsize": fs_pt * 0.85,
        "legend.frameon": bool(rng.random() < 0.4),
        "mathtext.default": "regular",
    }
    with rc_context(cast(Any, rc)):
        fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi, facecolor="white")
        canvas = FigureCanvasAgg(fig)
        right_extra = fs_px * 5.0 if kind == "heatmap" else 0.0
        rotate = kind in ("bar", "box") and rng.random() < 0.3
        titled = bool(rng.random() < 0.25) and title
        info["rotate"] = rotate
        bottom_extra = fs_px * 2.5 if rotate else 0.0
        ax = fig.add_axes(_axes_rect(w, h, fs_px, right_extra, bottom_extra, titled))
        if kind != "heatmap":
            ax.yaxis.set_major_locator(MaxNLocator(int(rng.integers(3, 6))))
        if kind != "heatmap" and rng.random() < 0.6:
            ax.spines["top"].set_visible(False)
            ax.spines["right"].set_visible(False)
        _draw_kind(ax, fig, rng, kind, palette, groups, quantity_axis, info)
        if titled:
            ax.set_title(vocab.pick(rng, vocab.PROTEINS), fontsize=fs_pt)
        for lab in (*ax.get_xticklabels(), *ax.get_yticklabels()):
            lab.set_clip_on(False)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
        rgb = np.ascontiguousarray(rgba[..., :3])
    return crop_to_ink(rgb), info


def _draw_kind(
    ax: Any,
    fig: Figure,
    rng: np.random.Generator,
    kind: str,
    palette: tuple[str, ...],
    groups: tuple[str, ...],
    quantity_axis: str,
    info: Info,
) -> None:
    if rng.random() < 0.4:
        ax.tick_params(direction="in")
    if kind == "bar":
        if rng.random() < 0.3:  # more, longer categories (materials, samples)
            groups = tuple(vocab.pick(rng, CATEGORY_SETS))
            info["groups"] = list(groups)
        n = len(groups)
        means = rng.uniform(0.3, 1.0, n) * float(rng.choice([1, 10, 100]))
        errs = means * rng.uniform(0.05, 0.2, n)
        x = np.arange(n)
        colours = [palette[i % len(palette)] for i in range(n)]
        if rng.random() < 0.3:  # gradient-filled bars, drawn as vertical slices
            for i in range(n):
                base = np.array(to_rgb(colours[i]))
                for j, frac in enumerate(np.linspace(0, 1, 10)):
                    shade = np.clip(base * (0.55 + 0.45 * frac) + 0.35 * frac, 0, 1)
                    ax.bar(x[i] - 0.325 + j * 0.065, means[i], width=0.066, align="edge", color=shade, lw=0)
            ax.errorbar(x, means, yerr=errs, fmt="none", ecolor="black", capsize=2.5)
        else:
            ax.bar(x, means, yerr=errs, color=colours, capsize=2.5, width=0.65)
        if rng.random() < 0.6:  # individual data points
            for i in range(n):
                pts = means[i] + rng.normal(0, errs[i], 5)
                ax.scatter(i + rng.uniform(-0.12, 0.12, 5), pts, s=6, color="black", zorder=3)
        ax.set_xticks(x, list(groups), rotation=45 if info["rotate"] else 0)
        ax.set_ylabel(quantity_axis)
        if rng.random() < 0.6:
            top = float((means + errs).max())
            ax.text(n - 1, top * 1.05, vocab.pick(rng, ("*", "**", "***", "ns")), ha="center", va="bottom")
            ax.set_ylim(0, top * 1.25)
    elif kind == "line":
        t = np.linspace(0, float(rng.choice([24, 48, 7, 60])), int(rng.integers(5, 10)))
        xlabel = vocab.pick(rng, vocab.TIME_AXES)
        for i, g in enumerate(groups):
            y = np.cumsum(rng.uniform(0, 1, t.size)) * (1 + i * 0.5)
            ax.errorbar(
                t, y, yerr=y * 0.08, marker="os^D"[i % 4], ms=3, lw=1.2, color=palette[i], label=g, capsize=2
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(quantity_axis)
        if rng.random() < 0.3:  # curve names next to the curves, with callout arrows
            for i, g in enumerate(groups):
                yv = float(np.cumsum(np.full(t.size, 0.5))[t.size // 2]) * (1 + i * 0.5)
                ax.annotate(
                    g,
                    xy=(float(t[t.size // 2]), yv),
                    xytext=(float(t[1]), yv * 1.4 + 0.5),
                    color=palette[i],
                    arrowprops={"arrowstyle": "->", "color": palette[i], "lw": 1.0},
                )
        else:
            ax.legend(loc="upper left")
        info["x"] = xlabel
    elif kind == "scatter":
        n = int(rng.integers(20, 120))
        xv = rng.normal(0, 1, n)
        r = float(rng.uniform(-0.9, 0.9))
        y = r * xv + math.sqrt(1 - r * r) * rng.normal(0, 1, n)
        ax.scatter(xv, y, s=float(rng.uniform(4, 14)), color=palette[0], alpha=0.8, edgecolors="none")
        coef = np.polyfit(xv, y, 1)
        xs = np.array([xv.min(), xv.max()])
        ax.plot(xs, coef[0] * xs + coef[1], color="black", lw=1)
        a, b = (vocab.GENES[i] for i in rng.permutation(len(vocab.GENES))[:2])
        ax.set_xlabel(f"{a} expression (log2)")
        ax.set_ylabel(f"{b} expression (log2)")
        ax.text(0.05, 0.92, f"r = {r:.2f}", transform=ax.transAxes, va="top")
        info.update(x=a, y=b, r=round(r, 2))
    elif kind == "heatmap":
        rows, cols = int(rng.integers(5, 13)), int(rng.integers(4, 11))
        data = rng.normal(0, 1, (rows, cols)) + np.linspace(-1, 1, cols)[None, :] * rng.normal(
            0, 1, (rows, 1)
        )
        im = ax.imshow(data, cmap=vocab.pick(rng, HEAT_CMAPS), aspect="auto", interpolation="nearest")
        genes = [vocab.GENES[i % len(vocab.GENES)] for i in rng.permutation(len(vocab.GENES))[:rows]]
        ax.set_yticks(range(rows), genes)
        ax.set_xticks(range(cols), [f"S{i + 1}" for i in range(cols)])
        cb = fig.colorbar(im, ax=ax, fraction=0.08, pad=0.03)
        cb.ax.tick_params(labelsize=7)
        info["quantity"] = "z-scored expression"
    elif kind == "spectrum":
        xlabel, lo, hi, what = vocab.pick(rng, SPECTRUM_AXES)
        xv = np.linspace(lo, hi, 400)
        peaks = np.sort(rng.uniform(lo + (hi - lo) * 0.1, hi - (hi - lo) * 0.05, int(rng.integers(2, 6))))
        n_curves = int(rng.integers(1, 4))
        names = vocab.pick(rng, (("A", "B", "C"), groups, ("Ag", "Pd", "Ag-Pd")))
        for i in range(n_curves):
            y = 1.0 + 0.3 * np.exp(-(xv - lo) / (hi - lo) * 3)
            for pk in peaks:
                y += float(rng.uniform(0.3, 2.0)) * np.exp(-(((xv - pk) / ((hi - lo) * 0.012)) ** 2))
            y += rng.normal(0, 0.03, xv.size) + i * 1.2
            ax.plot(xv, y, color=palette[i % len(palette)], lw=1.0)
            if n_curves > 1:
                ax.text(
                    lo + (hi - lo) * 0.03, float(y[5]) + 0.25, str(names[i % len(names)]), color=palette[i]
                )
            if i == 0 and rng.random() < 0.4:
                ax.fill_between(xv, y, y.min(), color=palette[0], alpha=0.25, lw=0)
        span = float(y.max() - 1.0 + 0.3)
        for pk in peaks[:: max(1, int(rng.integers(1, 3)))][:3]:
            top = float(y[int(np.argmin(np.abs(xv - pk)))])
            ax.text(float(pk), top + 0.06 * span, vocab.pick(rng, PEAK_NAMES), ha="center", fontsize="small")
        ax.set_ylim(0.8, float(y.max()) + 0.3 * span)
        ax.set_xlim(lo, hi)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("Intensity (a.u.)")
        if rng.random() < 0.5:
            ax.set_yticks([])
        info["quantity"] = what
    elif kind == "hist":
        for i, g in enumerate(groups[:2]):
            ax.hist(rng.normal(i * 1.2, 1, 300), bins=20, alpha=0.6, color=palette[i], label=g)
        ax.set_xlabel(quantity_axis)
        ax.set_ylabel("Count")
        ax.legend(loc="upper right")
    elif kind == "box":
        samples = [rng.normal(i * 0.5, 1, 40) for i in range(len(groups))]
        ax.boxplot(samples, widths=0.5)
        ax.set_xticks(range(1, len(groups) + 1), list(groups), rotation=45 if info["rotate"] else 0)
        ax.set_ylabel(quantity_axis)
    else:  # survival
        for i, g in enumerate(groups[:3]):
            times = np.sort(rng.exponential(20 + 15 * i, 40))
            surv = 1.0 - np.arange(1, times.size + 1) / times.size
            ax.step(np.r_[0, times], np.r_[1, surv] * 100, where="post", color=palette[i], label=g, lw=1.3)
        ax.set_xlabel("Time (months)")
        ax.set_ylabel("Survival (%)")
        ax.legend(loc="lower left")
        info["quantity"] = "overall survival"


# ---------------------------------------------------------------------------------------------
# A plainer plot engine drawn with PIL (bar, line, scatter)


def _nice_step(span: float, n: int) -> float:
    raw = max(span, 1e-9) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt_tick(v: float, step: float) -> str:
    for digits in range(5):
        scaled = step * 10**digits
        if abs(scaled - round(scaled)) < 1e-6:
            return f"{v:.{digits}f}"
    return f"{v:.4f}"


def _render_plot_pil(rng: np.random.Generator, w: int, h: int, kind: str) -> tuple[np.ndarray, Info]:
    font_name = vocab.pick(rng, BODY_FONTS)
    fs = int(np.clip(min(w, h) / 20.0, 8, 14))
    font = get_font(font_name, fs)
    palette = vocab.pick(rng, PALETTES)
    groups = vocab.pick(rng, vocab.GROUPS)
    quantity_axis, quantity = vocab.pick(rng, vocab.QUANTITIES)
    info: Info = {"kind": kind, "quantity": quantity, "groups": list(groups), "engine": "pil"}
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    left, bottom, top, right = int(fs * 5.2), int(fs * 3.4), int(fs * 1.2), w - int(fs * 1.2)
    x0, x1, y0, y1 = left, right, top, h - bottom
    if x1 - x0 < 30 or y1 - y0 < 30:
        return render_plot(rng, w, h, kind, engine="matplotlib")
    ink = (25, 25, 25)
    lw = int(rng.integers(1, 3))
    # data
    if kind == "bar":
        n = len(groups)
        ys = rng.uniform(0.3, 1.0, n) * float(rng.choice([1, 10, 100]))
        errs = ys * rng.uniform(0.05, 0.2, n)
        ymin, ymax = 0.0, float((ys + errs).max()) * 1.15
        xs = np.arange(n, dtype=np.float64)
        xmin, xmax = -0.6, n - 0.4
    elif kind == "line":
        xs = np.linspace(0, float(rng.choice([24, 48, 7, 60])), int(rng.integers(5, 10)))
        series = [np.cumsum(rng.uniform(0, 1, xs.size)) * (1 + i * 0.5) for i in range(len(groups))]
        ymin, ymax = 0.0, float(max(s.max() for s in series)) * 1.1
        xmin, xmax = float(xs.min()), float(xs.max())
    else:
        xs = rng.normal(0, 1, int(rng.integers(20, 100)))
        ys = 0.6 * xs + 0.8 * rng.normal(0, 1, xs.size)
        ymin, ymax = float(ys.min()) - 0.3, float(ys.max()) + 0.3
        xmin, xmax = float(xs.min()) - 0.3, float(xs.max()) + 0.3

    def px(v: float) -> float:
        return x0 + (v - xmin) / (xmax - xmin) * (x1 - x0)

    def py(v: float) -> float:
        return y1 - (v - ymin) / (ymax - ymin) * (y1 - y0)

    # axes and y ticks
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill=ink, width=lw)
    if rng.random() < 0.4:
        draw.line([(x0, y0), (x1, y0), (x1, y1)], fill=ink, width=lw)
    step = _nice_step(ymax - ymin, int(rng.integers(3, 6)))
    v = math.ceil(ymin / step) * step
    while v <= ymax + 1e-9:
        y = py(v)
        draw.line([(x0 - 4, y), (x0, y)], fill=ink, width=1)
        text = _fmt_tick(v, step)
        draw.text((x0 - 6 - font.getlength(text), y - fs * 0.6), text, fill=ink, font=font)
        v += step
    if kind == "bar":
        bw = (x1 - x0) / (xmax - xmin) * 0.6
        for i, g in enumerate(groups):
            cx = px(float(xs[i]))
            draw.rectangle(
                [cx - bw / 2, py(float(ys[i])), cx + bw / 2, y1], fill=palette[i % len(palette)], outline=ink
            )
            top_e, bot_e = py(float(ys[i] + errs[i])), py(float(ys[i] - errs[i]))
            draw.line([(cx, top_e), (cx, bot_e)], fill=ink, width=1)
            draw.line([(cx - bw / 6, top_e), (cx + bw / 6, top_e)], fill=ink, width=1)
            draw.text((cx - font.getlength(g) / 2, y1 + 5), g, fill=ink, font=font)
    else:
        xstep = _nice_step(xmax - xmin, 4)
        v = math.ceil(xmin / xstep) * xstep
        while v <= xmax + 1e-9:
            x = px(v)
            draw.line([(x, y1), (x, y1 + 4)], fill=ink, width=1)
            text = _fmt_tick(v, xstep)
            draw.text((x - font.getlength(text) / 2, y1 + 5), text, fill=ink, font=font)
            v += xstep
        xlabel = (
            vocab.pick(rng, vocab.TIME_AXES) if kind == "line" else f"{vocab.pick(rng, vocab.GENES)} (log2)"
        )
        draw.text(
            ((x0 + x1) / 2 - font.getlength(xlabel) / 2, y1 + 6 + fs * 1.3), xlabel, fill=ink, font=font
        )
        if kind == "line":
            for i, (g, ser) in enumerate(zip(groups, series, strict=False)):
                col = palette[i % len(palette)]
                pts = [(px(float(a)), py(float(b))) for a, b in zip(xs, ser, strict=True)]
                draw.line(pts, fill=col, width=2)
                for x, y in pts:
                    draw.ellipse([x - 2.5, y - 2.5, x + 2.5, y + 2.5], fill=col)
                ly = y0 + 4 + i * fs * 1.3
                draw.line([(x0 + 8, ly + fs * 0.6), (x0 + 26, ly + fs * 0.6)], fill=col, width=2)
                draw.text((x0 + 30, ly), g, fill=ink, font=font)
        else:
            for a, b in zip(xs, ys, strict=True):
                x, y = px(float(a)), py(float(b))
                draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=palette[0])
    # rotated y label
    label = Image.new("L", (int(font.getlength(quantity_axis)) + 4, fs + 6), 0)
    ImageDraw.Draw(label).text((2, 1), quantity_axis, fill=255, font=font)
    rot = label.rotate(90, expand=True)
    lx = max(0, int(x0 - fs * 4.6))
    ly = int((y0 + y1) / 2 - rot.size[1] / 2)
    if ly >= 0 and ly + rot.size[1] <= h:
        img.paste(Image.new("RGB", rot.size, ink), (lx, ly), rot)
    return crop_to_ink(np.asarray(img)), info


# ---------------------------------------------------------------------------------------------
# Diagrams and tables (PIL)


def _wrap(text: str, font: Any, max_w: int) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for word in words:
        trial = f"{cur} {word}".strip()
        if cur and font.getlength(trial) > max_w:
            lines.append(cur)
            cur = word
        else:
            cur = trial
    if cur:
        lines.append(cur)
    return lines


def _arrow(
    draw: ImageDraw.ImageDraw, p0: tuple[float, float], p1: tuple[float, float], color: Any, width: int
) -> None:
    ang = math.atan2(p1[1] - p0[1], p1[0] - p0[0])
    head = 4 + width * 2.5
    base = (p1[0] - head * math.cos(ang), p1[1] - head * math.sin(ang))
    draw.line([p0, base], fill=color, width=width)
    left = (base[0] + head * 0.5 * math.sin(ang), base[1] - head * 0.5 * math.cos(ang))
    right = (base[0] - head * 0.5 * math.sin(ang), base[1] + head * 0.5 * math.cos(ang))
    draw.polygon([p1, left, right], fill=color)


def render_schematic(
    rng: np.random.Generator, w: int, h: int, style: str | None = None
) -> tuple[np.ndarray, Info]:
    """A flow diagram (labelled boxes joined by arrows) or a cartoon illustration (shaded objects)."""
    w, h = max(40, int(w)), max(40, int(h))
    style = style or ("cartoon" if rng.random() < 0.35 else "flow")
    if style == "cartoon":
        return _render_cartoon(rng, w, h)
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    layout = vocab.pick(rng, ("row", "column", "tree", "snake"))
    if layout == "row" and w < h:
        layout = "column"
    elif layout == "column" and h < w * 0.6:
        layout = "row"
    n = int(rng.integers(3, 6))
    if layout == "row":
        n = max(2, min(n, w // 80))
    elif layout == "column":
        n = max(2, min(n, h // 32))
    names = [vocab.FLOW_NODES[i] for i in rng.permutation(len(vocab.FLOW_NODES))[:n]]
    if layout == "row":
        centres = [((i + 0.5) * w / n, h / 2) for i in range(n)]
        bw, bh = w / n * 0.75, min(h * float(rng.uniform(0.3, 0.6)), w / n * 0.9)
    elif layout == "column":
        centres = [(w / 2, (i + 0.5) * h / n) for i in range(n)]
        bw, bh = min(w * float(rng.uniform(0.4, 0.8)), h / n * 4.0), h / n * 0.62
    elif layout == "snake":
        n = max(4, n)
        names = [vocab.FLOW_NODES[i] for i in rng.permutation(len(vocab.FLOW_NODES))[:n]]
        per_row = math.ceil(n / 2)
        centres = []
        for i in range(n):
            r, c = divmod(i, per_row)
            if r == 1:
                c = per_row - 1 - c
            centres.append(((c + 0.5) * w / per_row, (r + 0.5) * h / 2))
        bw, bh = w / per_row * 0.7, h / 2 * 0.45
    else:  # tree: one root feeding 2-3 children, optionally one grandchild
        kids = min(3, n - 1)
        centres = [(w / 2, h * 0.17)] + [((i + 0.5) * w / kids, h * 0.55) for i in range(kids)]
        if n > kids + 1:
            centres.append((0.5 * w / kids, h * 0.88))
        centres = centres[:n]
        names = names[: len(centres)]
        bw, bh = w / kids * 0.75, h * 0.2
    font_name = vocab.pick(rng, BODY_FONTS)
    size = int(np.clip(min(bh * 0.3, bw / 7.5), 7, 16))
    font = get_font(font_name, size)
    outline = vocab.pick(rng, ((40, 40, 40), (30, 60, 120), (0, 0, 0), (90, 40, 40)))
    fills = (
        (220, 234, 250),
        (253, 230, 206),
        (226, 240, 217),
        (255, 255, 255),
        (235, 225, 245),
        (250, 250, 200),
    )
    shape = vocab.pick(rng, ("rect", "round", "ellipse", "mixed"))
    lw = int(rng.integers(1, 3))
    boxes = []
    for i, (cx, cy) in enumerate(centres):
        x0, y0, x1, y1 = cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2
        fill = vocab.pick(rng, fills)
        this = shape if shape != "mixed" else vocab.pick(rng, ("rect", "round", "ellipse"))
        if this == "ellipse":
            draw.ellipse([x0, y0, x1, y1], fill=fill, outline=outline, width=lw)
        elif this == "round":
            draw.rounded_rectangle(
                [x0, y0, x1, y1], radius=max(2, int(bh * 0.25)), fill=fill, outline=outline, width=lw
            )
        else:
            draw.rectangle([x0, y0, x1, y1], fill=fill, outline=outline, width=lw)
        lines = _wrap(names[i], font, int(bw * (0.7 if this == "ellipse" else 0.9)))
        line_h = size * 1.15
        ty = cy - line_h * len(lines) / 2
        for line in lines:
            draw.text((cx - font.getlength(line) / 2, ty), line, fill=(20, 20, 20), font=font)
            ty += line_h
        boxes.append((x0, y0, x1, y1))
    edges: list[tuple[int, int]]
    if layout == "tree":
        edges = [(0, i) for i in range(1, min(len(centres), 4))]
        if len(centres) > 4:
            edges.append((1, 4))
    else:
        edges = [(i, i + 1) for i in range(len(centres) - 1)]
    for a, b in edges:
        ax0, ay0, ax1, ay1 = boxes[a]
        bx0, by0, bx1, by1 = boxes[b]
        acx, acy = (ax0 + ax1) / 2, (ay0 + ay1) / 2
        bcx, bcy = (bx0 + bx1) / 2, (by0 + by1) / 2
        if abs(bcy - acy) < 1e-3:
            sign = 1 if bcx > acx else -1
            p0, p1 = (ax1 + 2 if sign > 0 else ax0 - 2, acy), (bx0 - 2 if sign > 0 else bx1 + 2, bcy)
        else:
            sign = 1 if bcy > acy else -1
            p0 = (acx, ay1 + 2 if sign > 0 else ay0 - 2)
            p1 = (bcx, by0 - 2 if sign > 0 else by1 + 2)
        if math.dist(p0, p1) > 8:
            _arrow(draw, p0, p1, outline, lw)
    rgb = crop_to_ink(np.asarray(img))
    return rgb, {"kind": "flow", "nodes": names}


def _shaded_ball(canvas: np.ndarray, cx: float, cy: float, r: float, colour: np.ndarray) -> None:
    """A sphere lit from the upper left, blended onto ``canvas`` (float RGB in 0..1)."""
    h, w = canvas.shape[:2]
    x0, x1 = max(0, int(cx - r - 1)), min(w, int(cx + r + 2))
    y0, y1 = max(0, int(cy - r - 1)), min(h, int(cy + r + 2))
    if x1 <= x0 or y1 <= y0:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2) / max(r, 1e-3)
    alpha = np.clip((1.0 - d) * r, 0.0, 1.0)[..., None]
    light = np.clip(
        1.0 - np.sqrt((xx - cx + r * 0.35) ** 2 + (yy - cy + r * 0.35) ** 2) / (r * 1.6), 0.0, 1.0
    )
    shade = colour[None, None, :] * (0.45 + 0.55 * light[..., None]) + 0.5 * light[..., None] ** 4
    region = canvas[y0:y1, x0:x1]
    canvas[y0:y1, x0:x1] = region * (1 - alpha) + np.clip(shade, 0, 1) * alpha


def _render_cartoon(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, Info]:
    """Illustration-style schematic: clusters of shaded spheres, cells and slabs, arrows, text labels."""
    canvas = np.ones((h, w, 3), np.float32)
    n = int(rng.integers(2, 5))
    if w < 200:
        n = min(n, 2)
    slots = [((i + 0.5) * w / n, h * float(rng.uniform(0.35, 0.55))) for i in range(n)]
    size = min(w / n, h) * 0.32
    palette = np.array(
        [[0.25, 0.6, 0.9], [0.85, 0.35, 0.3], [0.95, 0.75, 0.2], [0.4, 0.75, 0.4], [0.6, 0.6, 0.65]]
    )
    kinds = []
    for cx, cy in slots:
        kind = vocab.pick(rng, ("cluster", "cell", "slab", "ball"))
        kinds.append(kind)
        colour = palette[int(rng.integers(len(palette)))]
        if kind == "cluster":
            for _ in range(int(rng.integers(4, 14))):
                r = size * float(rng.uniform(0.15, 0.3))
                _shaded_ball(
                    canvas, cx + rng.normal(0, size * 0.4), cy + rng.normal(0, size * 0.4), r, colour
                )
        elif kind == "ball":
            _shaded_ball(canvas, cx, cy, size * 0.8, colour)
        elif kind == "cell":
            img = Image.fromarray((canvas * 255).astype(np.uint8))
            d = ImageDraw.Draw(img)
            fill = tuple(int(c * 255) for c in (colour * 0.4 + 0.6))
            d.ellipse(
                [cx - size, cy - size * 0.7, cx + size, cy + size * 0.7],
                fill=fill,
                outline=(60, 60, 60),
                width=2,
            )
            nuc = tuple(int(c * 255) for c in colour * 0.7)
            d.ellipse([cx - size * 0.35, cy - size * 0.3, cx + size * 0.35, cy + size * 0.3], fill=nuc)
            canvas = np.asarray(img).astype(np.float32) / 255.0
        else:
            for k in range(int(rng.integers(2, 5))):
                for j in range(int(rng.integers(3, 7))):
                    _shaded_ball(
                        canvas,
                        cx - size + j * size * 0.4 + k * size * 0.15,
                        cy + k * size * 0.25 - size * 0.3,
                        size * 0.2,
                        colour,
                    )
    img = Image.fromarray(np.clip(canvas * 255.0 + 0.5, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    font = get_font(vocab.pick(rng, BODY_FONTS), int(np.clip(size * 0.35, 8, 15)))
    for i in range(n - 1):
        (ax, ay), (bx, by) = slots[i], slots[i + 1]
        _arrow(draw, (ax + size * 1.05, ay), (bx - size * 1.05, by), (30, 30, 30), 2)
    names = [vocab.FLOW_NODES[i] for i in rng.permutation(len(vocab.FLOW_NODES))[:n]]
    for (cx, cy), name in zip(slots, names, strict=True):
        lines = _wrap(name, font, int(w / n * 0.9))
        ty = cy + size * 1.1
        for line in lines:
            draw.text((cx - font.getlength(line) / 2, ty), line, fill=(20, 20, 20), font=font)
            ty += font.size * 1.15
    return crop_to_ink(np.asarray(img)), {"kind": "cartoon", "objects": kinds, "nodes": names}


def _fmt_cell(rng: np.random.Generator, col_name: str) -> str:
    if col_name == "P value":
        return vocab.pick(rng, ("<0.001", "0.002", "0.04", "0.31", "0.78", "0.12"))
    if col_name == "n":
        return str(int(rng.integers(5, 300)))
    style = rng.random()
    if style < 0.4:
        return f"{rng.uniform(1, 90):.1f} ± {rng.uniform(0.2, 9):.1f}"
    if style < 0.7:
        k = int(rng.integers(1, 80))
        return f"{k} ({int(rng.integers(5, 95))}%)"
    return f"{rng.uniform(0, 100):.1f}"


def render_table(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, Info]:
    """A table of characteristics: bold header, booktabs rules, full grid or zebra rows."""
    w, h = max(40, int(w)), max(40, int(h))
    font_name = vocab.pick(rng, BODY_FONTS)
    n_cols = int(rng.integers(2, 5))
    heads = [vocab.pick(rng, vocab.TABLE_HEADS)] + [
        vocab.TABLE_GROUPS[i] for i in rng.permutation(len(vocab.TABLE_GROUPS))[: n_cols - 1]
    ]
    n_rows = int(rng.integers(3, 11))
    names = [vocab.TABLE_ROWS[i] for i in rng.permutation(len(vocab.TABLE_ROWS))[:n_rows]]
    cells = [[name] + [_fmt_cell(rng, heads[c]) for c in range(1, n_cols)] for name in names]
    style = vocab.pick(rng, ("booktabs", "grid", "zebra"))
    size = int(np.clip(h / (n_rows + 1) / 1.7, 7, 15))
    while True:
        font = get_font(font_name, size)
        bold = get_font(BOLD_OF[font_name], size)
        pad_x = max(3, size // 2)
        col_w = [
            int(max([bold.getlength(heads[c])] + [font.getlength(r[c]) for r in cells]) + 2 * pad_x)
            for c in range(n_cols)
        ]
        row_h = int(size * 1.6)
        total_w, total_h = sum(col_w) + 2, row_h * (n_rows + 1) + 2
        if (total_w <= w and total_h <= h) or size <= 7:
            break
        size -= 1
    while (total_w > w or total_h > h) and (n_rows > 2 or n_cols > 2):
        if total_h > h and n_rows > 2:
            n_rows -= 1
            cells = cells[:n_rows]
        elif n_cols > 2:
            n_cols -= 1
            heads, cells = heads[:n_cols], [r[:n_cols] for r in cells]
            col_w = col_w[:n_cols]
        else:
            break
        total_w, total_h = sum(col_w) + 2, row_h * (n_rows + 1) + 2
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    line = (30, 30, 30)
    x_edges = [1 + sum(col_w[:c]) for c in range(n_cols + 1)]
    y_edges = [1 + row_h * r for r in range(n_rows + 2)]
    if style == "zebra":
        draw.rectangle([x_edges[0], y_edges[0], x_edges[-1] - 1, y_edges[1] - 1], fill=(200, 215, 235))
        for r in range(1, n_rows + 1):
            if r % 2 == 0:
                draw.rectangle(
                    [x_edges[0], y_edges[r], x_edges[-1] - 1, y_edges[r + 1] - 1], fill=(232, 232, 232)
                )
    for r, row in enumerate([heads, *cells]):
        for c, text in enumerate(row):
            f = bold if r == 0 else font
            tx = x_edges[c] + pad_x if c == 0 else x_edges[c] + (col_w[c] - f.getlength(text)) / 2
            draw.text((tx, y_edges[r] + (row_h - size) / 2 - 1), text, fill=(15, 15, 15), font=f)
    right = x_edges[-1] - 1
    if style == "grid":
        for x in [*x_edges[:-1], right]:
            draw.line([(x, y_edges[0]), (x, y_edges[-1] - 1)], fill=line, width=1)
        for y in y_edges:
            draw.line([(x_edges[0], y), (right, y)], fill=line, width=1)
    else:
        for y, wd in ((y_edges[0], 2), (y_edges[1], 1), (y_edges[-1] - 1, 2)):
            draw.line([(x_edges[0], y), (right, y)], fill=line, width=wd)
    rgb = crop_to_ink(np.asarray(img))
    return rgb, {"kind": style, "rows": [r[0] for r in cells], "columns": heads}
