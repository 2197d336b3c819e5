"""Photographic panel content: images bundled with installed packages, plus procedural micrographs.

Only files that ship inside the installed wheels are read (scikit-image's ``data`` folder, pydicom's
``data/test_files``, matplotlib's ``mpl-data/sample_data``); nothing is ever downloaded. A file that
is missing or cannot be decoded is skipped. Each draw takes a random crop (random zoom and position),
flips, quarter turns, a small rotation, colour jitter, pseudo-colour for grey sources and noise, so
panels from one source still vary. Procedural sources (fluorescence, electron micrographs, blots)
are drawn at the requested size.
"""

from __future__ import annotations

import contextlib
import gzip
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np

# (display name, modality, weight). Modality names are what captions talk about.
MODALITY_WEIGHTS = {
    "ihc": 2.0,
    "phase": 1.0,
    "fundus": 0.8,
    "ct": 1.0,
    "mri": 1.0,
    "ultrasound": 0.6,
    "fluorescence": 2.0,
    "em": 1.6,
    "blot": 0.5,
    "photo": 0.2,
    "map": 0.2,
}


@dataclass(frozen=True)
class Source:
    name: str  # e.g. "skimage:ihc.png"
    modality: str
    pixels: np.ndarray  # uint8, (H, W) grey or (H, W, 3) RGB
    inner: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)  # usable fraction (x0, y0, x1, y1)


def _to_uint8(arr: np.ndarray, lo_pct: float = 0.5, hi_pct: float = 99.7) -> np.ndarray:
    a = arr.astype(np.float32)
    lo, hi = np.percentile(a, lo_pct), np.percentile(a, hi_pct)
    if hi <= lo:
        hi = lo + 1.0
    return np.clip((a - lo) * (255.0 / (hi - lo)), 0, 255).astype(np.uint8)


def _read_png(path: Path) -> np.ndarray:
    data = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if data is None:
        raise OSError(f"cannot read {path}")
    if data.ndim == 3:
        data = cv2.cvtColor(data[..., :3], cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(data)


def _skimage_sources() -> list[Source]:
    import skimage.data

    root = Path(skimage.data.__file__).parent
    table = (
        ("ihc.png", "ihc"),
        ("cell.png", "phase"),
        ("retina.jpg", "fundus"),
        ("microaneurysms.png", "fundus"),
        ("hubble_deep_field.jpg", "fluorescence"),
        ("coffee.png", "photo"),
    )
    out = []
    for name, modality in table:
        path = root / name
        if not path.is_file():
            continue
        try:
            pix = _read_png(path)
        except OSError:
            continue
        if modality == "fluorescence":  # star field -> grey puncta, pseudo-coloured at draw time
            pix = cv2.cvtColor(pix, cv2.COLOR_RGB2GRAY)
        out.append(Source(f"skimage:{name}", modality, pix))
    return out


def _pydicom_sources() -> list[Source]:
    try:
        import pydicom
        from pydicom.data import data_manager
    except ImportError:  # pragma: no cover - pydicom is part of the ml extra
        return []
    root = Path(data_manager.DATA_ROOT) / "test_files"
    table = (
        ("CT_small.dcm", "ct", (0.0, 0.0, 1.0, 1.0)),
        ("J2K_pixelrep_mismatch.dcm", "ct", (0.05, 0.05, 0.95, 0.95)),
        ("MR_small.dcm", "mri", (0.0, 0.0, 1.0, 1.0)),
        ("examples_overlay.dcm", "mri", (0.0, 0.0, 1.0, 1.0)),
        ("examples_palette.dcm", "ultrasound", (0.33, 0.1, 0.72, 0.55)),
        ("examples_rgb_color.dcm", "ultrasound", (0.12, 0.25, 0.88, 0.8)),
        ("examples_ybr_color.dcm", "ultrasound", (0.2, 0.15, 0.8, 0.85)),
    )
    out = []
    for name, modality, inner in table:
        path = root / name
        if not path.is_file():
            continue
        try:
            ds = pydicom.dcmread(path)
            pix = np.asarray(ds.pixel_array)
            if getattr(ds, "PhotometricInterpretation", "") == "PALETTE COLOR":
                from pydicom.pixels import apply_color_lut

                pix = np.asarray(apply_color_lut(pix, ds))
        except Exception:  # undecodable in this install: skip the file
            continue
        if pix.ndim == 4 or (pix.ndim == 3 and pix.shape[-1] not in (3, 4)):
            pix = pix[0]
        if pix.ndim == 3 and pix.shape[-1] == 4:
            pix = pix[..., :3]
        if pix.dtype != np.uint8 or pix.ndim == 2:
            pix = _to_uint8(pix)
        out.append(Source(f"pydicom:{name}", modality, np.ascontiguousarray(pix), inner))
    return out


def _matplotlib_sources() -> list[Source]:
    import matplotlib

    root = Path(matplotlib.get_data_path()) / "sample_data"
    out = []
    mri = root / "s1045.ima.gz"
    if mri.is_file():
        with contextlib.suppress(OSError, ValueError):
            with gzip.open(mri, "rb") as fh:
                raw = fh.read()
            side = math.isqrt(len(raw) // 2)
            arr = np.frombuffer(raw[: side * side * 2], dtype="<u2").reshape(side, side)
            out.append(Source("matplotlib:s1045.ima.gz", "mri", _to_uint8(arr)))
    dem = root / "jacksboro_fault_dem.npz"
    if dem.is_file():
        with contextlib.suppress(OSError, KeyError, ValueError):
            with np.load(dem) as data:
                elev = np.asarray(data["elevation"], dtype=np.float32)
            out.append(Source("matplotlib:jacksboro_fault_dem.npz", "map", _hillshade(elev)))
    photo = root / "grace_hopper.jpg"
    if photo.is_file():
        with contextlib.suppress(OSError):
            out.append(Source("matplotlib:grace_hopper.jpg", "photo", _read_png(photo)))
    return out


def _hillshade(elev: np.ndarray) -> np.ndarray:
    gy, gx = np.gradient(elev)
    shade = 0.5 + 0.5 * (gx - gy) / (np.abs(gx).max() + np.abs(gy).max() + 1e-6) * 3.0
    norm = (elev - elev.min()) / (np.ptp(elev) + 1e-6)
    import matplotlib

    rgb = matplotlib.colormaps["terrain"](norm)[..., :3] * np.clip(shade, 0.3, 1.2)[..., None]
    return np.clip(rgb * 255.0, 0, 255).astype(np.uint8)


@lru_cache(maxsize=1)
def bundled_sources() -> tuple[Source, ...]:
    """Every bundled image that loads offline in this install, in a fixed order."""
    return tuple(_skimage_sources() + _pydicom_sources() + _matplotlib_sources())


PROCEDURAL = {"fluorescence": "procedural:fluorescence", "em": "procedural:em", "blot": "procedural:blot"}


def available_modalities() -> list[str]:
    have = {s.modality for s in bundled_sources()} | set(PROCEDURAL)
    return [m for m in MODALITY_WEIGHTS if m in have]


def choose_modality(rng: np.random.Generator, exclude: tuple[str, ...] = ()) -> str:
    mods = [m for m in available_modalities() if m not in exclude] or available_modalities()
    w = np.array([MODALITY_WEIGHTS[m] for m in mods], dtype=np.float64)
    return mods[int(rng.choice(len(mods), p=w / w.sum()))]


# ---------------------------------------------------------------------------------------------
# Augmentation of bundled images


def _pseudo_colour(grey: np.ndarray, rng: np.random.Generator, modality: str) -> np.ndarray:
    g = grey.astype(np.float32) / 255.0
    if modality in ("fluorescence",):
        colours = ((0.1, 1.0, 0.2), (1.0, 0.15, 0.1), (1.0, 0.1, 1.0), (0.2, 0.5, 1.0), (0.1, 1.0, 1.0))
        c = np.array(colours[int(rng.integers(len(colours)))], dtype=np.float32)
        return np.clip(g[..., None] * c[None, None, :] * 255.0, 0, 255).astype(np.uint8)
    if modality == "phase" and rng.random() < 0.2:
        g = 1.0 - g
    return np.repeat((g * 255.0).astype(np.uint8)[..., None], 3, axis=2)


def _colour_jitter(rgb: np.ndarray, rng: np.random.Generator, modality: str) -> np.ndarray:
    """Hue/saturation shift (colour sources), then contrast, brightness and gamma as one LUT, then noise."""
    img = rgb
    if modality in ("ihc", "fundus", "photo", "map", "ultrasound") and rng.random() < 0.7:
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
        shift = int(rng.integers(-6, 7))
        hue = hsv[..., 0].astype(np.int16) + shift
        hsv[..., 0] = np.mod(hue, 180).astype(np.uint8)
        sat = np.clip(np.arange(256) * float(rng.uniform(0.7, 1.3)), 0, 255).astype(np.uint8)
        hsv[..., 1] = cv2.LUT(hsv[..., 1], sat)
        img = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    contrast = float(rng.uniform(0.8, 1.25))
    brightness = float(rng.uniform(-0.08, 0.08))
    gamma = float(rng.uniform(0.8, 1.25))
    x = np.arange(256, dtype=np.float32) / 255.0
    lut = np.clip((x - 0.5) * contrast + 0.5 + brightness, 0, 1) ** gamma
    img = cv2.LUT(np.ascontiguousarray(img), np.clip(lut * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if rng.random() < 0.3:
        sigma = float(rng.uniform(1.0, 7.0))
        noise = rng.standard_normal(img.shape, dtype=np.float32) * sigma
        img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    return img


def _crop_warp(src: Source, rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    pix = src.pixels
    k = int(rng.integers(4)) if src.modality not in ("ct", "mri", "ultrasound", "photo") else 0
    sh, sw = pix.shape[:2]
    ix0, iy0 = int(src.inner[0] * sw), int(src.inner[1] * sh)
    ix1, iy1 = int(src.inner[2] * sw), int(src.inner[3] * sh)
    pix = pix[iy0:iy1, ix0:ix1]
    if k:
        pix = np.ascontiguousarray(np.rot90(pix, k))
    sh, sw = pix.shape[:2]
    aspect = w / max(h, 1)
    # Largest crop of the requested aspect, then a random zoom into it.
    cw_max = min(sw, sh * aspect)
    min_zoom = {"ct": 0.6, "mri": 0.6, "phase": 0.6, "fundus": 0.5, "ultrasound": 0.7}.get(src.modality, 0.35)
    zoom = float(rng.uniform(min_zoom, 1.0))
    cw = max(4.0, cw_max * zoom)
    ch = cw / aspect
    angle = float(rng.uniform(-20, 20)) if rng.random() < 0.25 else 0.0
    if angle:  # shrink so the rotated crop stays inside the source
        rad = math.radians(abs(angle))
        fit = min(
            sw / (cw * math.cos(rad) + ch * math.sin(rad)), sh / (cw * math.sin(rad) + ch * math.cos(rad))
        )
        if fit < 1.0:
            cw, ch = cw * fit, ch * fit
    cx = float(rng.uniform(cw / 2, max(cw / 2, sw - cw / 2)))
    cy = float(rng.uniform(ch / 2, max(ch / 2, sh - ch / 2)))
    factor = w / cw
    if factor < 0.5:  # pre-shrink with area averaging to avoid aliasing
        pre = min(1.0, factor * 2.0)
        pix = cv2.resize(pix, (max(1, int(sw * pre)), max(1, int(sh * pre))), interpolation=cv2.INTER_AREA)
        cx, cy, cw, ch = cx * pre, cy * pre, cw * pre, ch * pre
        factor = w / cw
    rot = cv2.getRotationMatrix2D((cx, cy), angle, factor)
    rot[0, 2] += w / 2.0 - cx
    rot[1, 2] += h / 2.0 - cy
    out = cv2.warpAffine(pix, rot, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT101)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    if rng.random() < 0.3 and src.modality not in ("ct", "mri", "ultrasound", "photo"):
        out = out[::-1]
    return np.ascontiguousarray(out)


# ---------------------------------------------------------------------------------------------
# Procedural micrographs


def _fluorescence(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    img = np.zeros((h, w, 3), np.float32)
    scale = float(rng.uniform(0.6, 2.0)) * max(6.0, min(w, h) / 18.0)
    n = int(np.clip(w * h / (scale * scale * rng.uniform(4, 14)), 3, 400))
    nuclei: np.ndarray = np.zeros((h, w), np.float32)
    cyto = np.zeros((h, w), np.float32)
    for _ in range(n):
        x, y = int(rng.integers(w)), int(rng.integers(h))
        ax, ay = scale * rng.uniform(0.35, 0.6), scale * rng.uniform(0.3, 0.5)
        ang = float(rng.uniform(0, 180))
        cv2.ellipse(
            nuclei, (x, y), (max(1, int(ax)), max(1, int(ay))), ang, 0, 360, float(rng.uniform(0.5, 1)), -1
        )
        cv2.ellipse(
            cyto,
            (x, y),
            (max(2, int(ax * 2.2)), max(2, int(ay * 2.0))),
            ang,
            0,
            360,
            float(rng.uniform(0.2, 0.9)),
            -1,
        )
    nuclei = cv2.GaussianBlur(nuclei, (0, 0), max(0.6, scale * 0.08))
    texture = cv2.GaussianBlur(rng.random((h, w), dtype=np.float32), (0, 0), max(0.8, scale * 0.15))
    cyto = cv2.GaussianBlur(cyto, (0, 0), max(1.0, scale * 0.3)) * (0.5 + texture)
    palette = rng.permutation(
        np.array([[0.1, 0.9, 0.2], [0.95, 0.15, 0.1], [0.9, 0.1, 0.9], [0.1, 0.8, 0.9]])
    )
    nuc_col = np.array([0.15, 0.3, 1.0]) if rng.random() < 0.8 else np.array([0.8, 0.8, 0.8])
    img += nuclei[..., None] * nuc_col[None, None, :]
    if rng.random() < 0.85:
        img += cyto[..., None] * palette[0][None, None, :] * float(rng.uniform(0.5, 1.0))
    if rng.random() < 0.5:
        dots = (rng.random((h, w)) < 0.002).astype(np.float32)
        dots = cv2.GaussianBlur(dots, (0, 0), 1.0) * 12.0 * (cyto > 0.1)
        img += np.clip(dots, 0, 1)[..., None] * palette[1][None, None, :]
    img += 0.03 + 0.015 * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img * 255.0, 0, 255).astype(np.uint8)


def _electron_micrograph(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    kind = rng.random()
    if kind < 0.35:  # lattice fringes (HR-TEM)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        img: np.ndarray = np.zeros((h, w), np.float32)
        for _ in range(int(rng.integers(1, 3))):
            ang = float(rng.uniform(0, math.pi))
            period = float(rng.uniform(3.0, 9.0))
            img += np.cos((xx * math.cos(ang) + yy * math.sin(ang)) * 2 * math.pi / period)
        img = 0.5 + 0.18 * img
        img += cv2.GaussianBlur(0.25 * rng.standard_normal((h, w), dtype=np.float32), (0, 0), 6.0)
    else:  # nanoparticles on a support film (TEM / SEM)
        img = np.full((h, w), float(rng.uniform(0.45, 0.75)), np.float32)
        img += cv2.GaussianBlur(0.3 * rng.standard_normal((h, w), dtype=np.float32), (0, 0), 8.0)
        n = int(rng.integers(5, 60))
        r_mean = float(rng.uniform(3, max(4.0, min(w, h) / 10)))
        dark = rng.random() < 0.6
        for _ in range(n):
            r = max(2, int(r_mean * rng.uniform(0.5, 1.5)))
            x, y = int(rng.integers(w)), int(rng.integers(h))
            val = float(rng.uniform(0.05, 0.3)) if dark else float(rng.uniform(0.85, 1.0))
            cv2.circle(img, (x, y), r, val, -1, lineType=cv2.LINE_AA)
            if rng.random() < 0.4:  # hollow shell
                cv2.circle(img, (x, y), max(1, r // 2), (val + 0.5) / 2, -1, lineType=cv2.LINE_AA)
        img = cv2.GaussianBlur(img, (0, 0), 0.8)
    img += float(rng.uniform(0.02, 0.08)) * rng.standard_normal((h, w), dtype=np.float32)
    grey = np.clip(img * 255.0, 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def _blot(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    img: np.ndarray = np.full((h, w), float(rng.uniform(0.78, 0.9)), np.float32)
    lanes = int(rng.integers(3, 11))
    rows = int(rng.integers(1, 4))
    lane_w = w / lanes
    for r in range(rows):
        cy = (r + 0.5) * h / rows + rng.uniform(-0.1, 0.1) * h / rows
        bh = max(2.0, h / rows * float(rng.uniform(0.12, 0.3)))
        base = float(rng.uniform(0.2, 0.9))
        for lane in range(lanes):
            strength = np.clip(base + rng.normal(0, 0.25), 0.0, 1.0)
            cx = (lane + 0.5) * lane_w
            cv2.ellipse(
                img,
                (int(cx), int(cy)),
                (max(1, int(lane_w * 0.38)), max(1, int(bh / 2))),
                0,
                0,
                360,
                float(0.85 - 0.75 * strength),
                -1,
                lineType=cv2.LINE_AA,
            )
    img = np.asarray(cv2.GaussianBlur(img, (0, 0), max(0.8, min(w, h) / 120)), dtype=np.float32)
    img += 0.015 * rng.standard_normal((h, w), dtype=np.float32)
    grey = np.clip(img * 255.0, 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def _cap_brightness(rgb: np.ndarray) -> np.ndarray:
    """Keep the image extent inked (min RGB < 225) so a tight ink box equals the image extent."""
    lo = rgb[::2, ::2].min(axis=2)
    top = float(np.percentile(lo, 99.5)) if lo.size else 0.0
    if top <= 212:
        return rgb
    return (rgb.astype(np.float32) * (212.0 / top)).astype(np.uint8)


def render_image(
    rng: np.random.Generator, w: int, h: int, modality: str | None = None
) -> tuple[np.ndarray, str, str]:
    """An image panel of exactly ``w`` x ``h`` pixels: (RGB uint8, modality, source name)."""
    w, h = max(1, int(w)), max(1, int(h))
    modality = modality or choose_modality(rng)
    bundled = [s for s in bundled_sources() if s.modality == modality]
    procedural = modality in PROCEDURAL and (not bundled or rng.random() < 0.6)
    if procedural:
        maker = {"fluorescence": _fluorescence, "em": _electron_micrograph, "blot": _blot}[modality]
        rgb = maker(rng, w, h)
        name = PROCEDURAL[modality]
    elif bundled:
        src = bundled[int(rng.integers(len(bundled)))]
        out = _crop_warp(src, rng, w, h)
        rgb = _pseudo_colour(out, rng, modality) if out.ndim == 2 else out
        rgb = _colour_jitter(rgb, rng, modality)
        name = src.name
    else:
        rgb = _electron_micrograph(rng, w, h)
        modality, name = "em", PROCEDURAL["em"]
    return _cap_brightness(np.ascontiguousarray(rgb)), modality, name
