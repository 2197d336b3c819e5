"""The synthetic figure generator: determinism, ground truth against pixels, captions, CLI."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from p2p.mining.lab.synth import generate_figure, load_annotations, write_dataset
from p2p.mining.lab.synth.cli import synth_command
from p2p.mining.lab.synth.labels import LABEL_STYLES
from p2p.mining.lab.synth.util import scale_inclusive
from p2p.mining.types import MARKER_KINDS, PANEL_TYPES

SMALL = {"width": 480, "height": 360}
REAL_KEYS = {
    "width",
    "height",
    "panels",
    "label_boxes",
    "markers",
    "extra_markers",
    "scale_bars",
    "subcaptions",
    "subcaption_pieces",
    "caption",
    "title",
    "article_url",
    "license",
    "image_url",
    "notes",
}


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(np.int32)


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


# -- caption parsing, written independently of the generator -------------------------------------

ATOM = r"(?:\d{1,2}[a-z]|\d{1,2}|[ivx]{1,4}|[A-Za-z])"
SEP = r"(?:,\s?|\s?and\s|[\u2013-])"
PAREN = re.compile(rf"\(({ATOM}(?:{SEP}{ATOM})*)\):?\s")
BARE = re.compile(rf"({ATOM}(?:{SEP}{ATOM})*),?\s(?=[A-Z(])")


def expand(core: str, sequence: list[str]) -> list[str]:
    out: list[str] = []
    for part in re.split(r",\s?|\s?and\s", core):
        part = part.strip()
        rng = re.fullmatch(rf"({ATOM})[\u2013-]({ATOM})", part)
        if rng:
            a, b = sequence.index(rng.group(1)), sequence.index(rng.group(2))
            out += sequence[a : b + 1]
        elif part:
            out.append(part)
    return out


def fragment_tokens(caption: str, sequence: list[str]) -> list[tuple[int, list[str]]]:
    """(offset, labels) of every label token that opens a fragment (caption or sentence start)."""
    found = []
    for start in [0] + [m.end() for m in re.finditer(r"[.:;]\s", caption)]:
        for rx in (PAREN, BARE):
            m = rx.match(caption, start)
            if not m:
                continue
            try:
                labels = expand(m.group(1), sequence)
            except ValueError:
                continue
            if labels and all(lab in sequence for lab in labels):
                found.append((start, labels))
                break
    return found


# -- determinism ---------------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes_and_truth() -> None:
    a_img, a_gt = generate_figure(11, **SMALL)
    b_img, b_gt = generate_figure(11, **SMALL)
    assert png_bytes(a_img) == png_bytes(b_img)
    assert json.dumps(a_gt, sort_keys=True) == json.dumps(b_gt, sort_keys=True)
    c_img, c_gt = generate_figure(12, **SMALL)
    assert png_bytes(c_img) != png_bytes(a_img)
    assert c_gt["caption"] != a_gt["caption"] or c_gt["panels"] != a_gt["panels"]


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(TypeError):
        generate_figure(0, colour_scheme="dark")
    with pytest.raises(ValueError):
        generate_figure(0, label_style="Z")


# -- ground truth against pixels -----------------------------------------------------------------


def check_truth_against_pixels(img: Image.Image, gt: dict[str, Any]) -> None:
    a = pixels(img)
    h, w = a.shape[:2]
    assert (gt["width"], gt["height"]) == (w, h)
    assert set(gt) >= REAL_KEYS
    ink = a.min(axis=2) < 225
    covered = np.zeros((h, w), bool)
    for p in gt["panels"]:
        assert p["type"] in PANEL_TYPES
        x0, y0, x1, y1 = p["box"]
        assert 0 <= x0 <= x1 < w and 0 <= y0 <= y1 < h
        region = ink[y0 : y1 + 1, x0 : x1 + 1]
        # tight box: every edge row and column holds ink
        assert region[0].any() and region[-1].any() and region[:, 0].any() and region[:, -1].any(), p
        covered[y0 : y1 + 1, x0 : x1 + 1] = True
    for label, (x0, y0, x1, y1) in gt["label_boxes"].items():
        glyph = a[y0 : y1 + 1, x0 : x1 + 1]
        dark = (glyph.max(axis=2) < 90).sum()
        bright = (glyph.min(axis=2) > 200).sum()
        assert dark + bright >= 3, f"label {label} box holds no glyph pixels"
        covered[y0 : y1 + 1, x0 : x1 + 1] = True
    frame = gt["synth"]["frame"]
    if frame:
        fw = gt["synth"]["frame_width"]
        covered[:fw] = covered[-fw:] = True
        covered[:, :fw] = covered[:, -fw:] = True
    # gutters, margins and label strips are background: no ink outside panels and labels
    assert not (ink & ~covered).any()
    # distinct panels never overlap
    boxes = [p["box"] for p in gt["panels"]]
    for i, b1 in enumerate(boxes):
        for b2 in boxes[i + 1 :]:
            assert b1[2] < b2[0] or b2[2] < b1[0] or b1[3] < b2[1] or b2[3] < b1[1]
    for m in gt["markers"]:
        assert m["kind"] in MARKER_KINDS
        panel = gt["panels"][m["panel_index"]]
        assert m["panel"] == panel["label"] and panel["type"] == "image"
        px0, py0, px1, py1 = panel["box"]
        g = m["glyph_box"]
        assert px0 <= g[0] <= g[2] <= px1 and py0 <= g[1] <= g[3] <= py1
        if m["kind"] in ("arrow", "arrowhead"):
            x, y = m["target_point"]
            window = a[max(0, y - 1) : y + 2, max(0, x - 1) : x + 2].reshape(-1, 3)
            closest = np.abs(window - np.array(m["color"])).sum(axis=1).min()
            assert closest < 120, f"no {m['kind']} colour at its tip {m}"
            assert 0.0 <= m["direction_deg"] < 360.0
        else:
            assert "direction_deg" not in m


POOL_OPTIONS = {
    "width": 360,
    "height": 280,
    "marker_rate": 0.9,
    "panel_types": {"image": 8, "plot": 1, "table": 1},
}


@pytest.fixture(scope="module")
def pool() -> list[tuple[Image.Image, dict[str, Any]]]:
    """Small figures shared by the tests below (seeds 0-63)."""
    return [generate_figure(seed, **POOL_OPTIONS) for seed in range(64)]


def test_boxes_are_consistent_with_pixels(pool: list[tuple[Image.Image, dict[str, Any]]]) -> None:
    for img, gt in pool:
        check_truth_against_pixels(img, gt)


def test_all_panel_types_are_drawn_with_consistent_boxes() -> None:
    types: set[str] = set()
    for seed in range(3):
        img, gt = generate_figure(
            seed,
            n_panels=4,
            panel_types={"plot": 1, "schematic": 1, "table": 1, "image": 1},
            width=900,
            height=700,
        )
        check_truth_against_pixels(img, gt)
        types.update(p["type"] for p in gt["panels"])
    assert types == set(PANEL_TYPES)


@pytest.mark.parametrize("gutter", [0, 12])
def test_gutter_sizes(gutter: int) -> None:
    img, gt = generate_figure(4, gutter=gutter, n_panels=6, layout="grid", **SMALL)
    check_truth_against_pixels(img, gt)
    cells = gt["synth"]["cells"]
    gaps = [b[0] - a[2] - 1 for a in cells for b in cells if b[1] == a[1] and b[0] > a[2]]
    assert gaps and min(gaps) == gutter
    if gutter == 0:  # touching cells: labels go inside the image panels
        assert gt["synth"]["label_position"] == "inside"


def test_arrow_tip_is_the_extreme_pixel_in_its_direction(
    pool: list[tuple[Image.Image, dict[str, Any]]],
) -> None:
    seen = 0
    for _, gt in pool:
        for m in gt["markers"]:
            if m["kind"] != "arrow":
                continue
            x0, y0, x1, y1 = m["glyph_box"]
            tx, ty = m["target_point"]
            ux, uy = math.cos(math.radians(m["direction_deg"])), math.sin(math.radians(m["direction_deg"]))
            reach = max(cx * ux + cy * uy for cx in (x0, x1) for cy in (y0, y1))
            assert tx * ux + ty * uy >= reach - 3.0
            tb = m["target_box"]  # the tip touches the structure it points at
            assert tb[0] - 3 <= tx <= tb[2] + 3 and tb[1] - 3 <= ty <= tb[3] + 3
            seen += 1
    assert seen >= 20


def test_every_label_style_and_marker_kind_appears(pool: list[tuple[Image.Image, dict[str, Any]]]) -> None:
    styles: set[str] = set()
    kinds: set[str] = set()
    positions: set[str] = set()
    decorations: set[str] = set()
    for _, gt in pool:
        s = gt["synth"]
        styles.add(s["label_style"])
        positions.add(s["label_position"])
        decorations.add(s["label_decoration"])
        kinds.update(m["kind"] for m in gt["markers"])
        if s["label_style"] == "none":
            assert gt["label_boxes"] == {} and all(p["label"] is None for p in gt["panels"])
        else:
            assert sorted(gt["label_boxes"]) == sorted(p["label"] for p in gt["panels"])
    assert styles == {*LABEL_STYLES, "none"}
    assert kinds == set(MARKER_KINDS)
    assert positions == {"inside", "outside"} and decorations == {"plain", "circled"}


# -- captions ------------------------------------------------------------------------------------


def test_captions_parse_into_the_labels(pool: list[tuple[Image.Image, dict[str, Any]]]) -> None:
    for _, gt in pool:
        caption = gt["caption"]
        labels = [p["label"] for p in gt["panels"] if p["label"] is not None]
        pieces = gt["subcaption_pieces"]
        assert set(pieces) == set(gt["subcaptions"]) == {"preamble", *labels}
        for key, parts in pieces.items():
            assert all(part in caption for part in parts)
            assert gt["subcaptions"][key] == " ".join(parts)
        if not labels:
            assert gt["subcaptions"]["preamble"] == caption
            continue
        tokens = fragment_tokens(caption, gt["synth"]["label_sequence"])
        named = [lab for _, labs in tokens for lab in labs]
        assert sorted(named) == sorted(labels) and len(named) == len(set(named)), caption
        first = min(start for start, _ in tokens)
        assert caption[:first].strip() == gt["subcaptions"]["preamble"]
        for start, labs in tokens:  # each fragment is the first piece of every panel it names
            for lab in labs:
                assert caption[start:].startswith(pieces[lab][0])


def test_caption_conventions_cover_the_real_forms(pool: list[tuple[Image.Image, dict[str, Any]]]) -> None:
    for _, gt in pool:
        for m in gt["markers"]:
            if m["text"] is not None:
                assert m["text"] in gt["caption"]
    joined = "\n".join(gt["caption"] for _, gt in pool)
    assert re.search(r"\([A-Za-z]\) [A-Z]", joined)  # (A) ...
    assert re.search(r"(^|\. )[A-Za-z], [A-Z]", joined, re.M)  # A, ...
    assert re.search(r"\([A-Za-z], ?[A-Za-z]\)", joined)  # (B, C)
    assert re.search(r"\([A-Za-z][\u2013-][A-Za-z]\)", joined)  # (D-F)
    assert re.search(r"[Aa]rrows? (in [^ ]+ )?(indicates?|points? to)", joined)
    assert re.search(r"[Aa]sterisks? (in [^ ]+ )?(marks?|denotes?)", joined)
    assert re.search(r"Scale bars?, \d", joined)
    assert "upper" in joined and "lower" in joined


def test_last_fragment_keeps_its_notes_until_a_sentence_reads_as_shared() -> None:
    from p2p.mining.lab.synth.captions import _last_fragment_pieces

    head = "(D\u2013F) Confocal images."
    group = ["D", "E", "F"]
    labels = ["A", "B", "C", *group]
    after = [
        ("Scale bars, 1 mm (D) and 5 µm (E, F).", group, "bar"),
        ("Arrows indicate puncta.", None, "marker"),
        ("Arrows in E mark nuclei.", ["E"], "trailing"),  # the same text as a note: the group's
        ("Data are mean.", None, "trailing"),
        ("Stars in F mark cysts.", ["F"], "trailing"),
    ]
    own = f"{head} Scale bars, 1 mm (D) and 5 µm (E, F). Arrows indicate puncta. Arrows in E mark nuclei."
    assert _last_fragment_pieces(head, after, group, labels) == [
        (own, group),
        ("Data are mean.", labels),
        ("Stars in F mark cysts.", ["F"]),
    ]
    # A sentence naming another panel starts the shared part.
    outside = [
        ("Arrows in A and E mark nuclei.", ["A", "E"], "trailing"),
        ("Stars in E mark cysts.", ["E"], "trailing"),
    ]
    assert _last_fragment_pieces(head, outside, group, labels) == [
        (head, group),
        ("Arrows in A and E mark nuclei.", ["A", "E"]),
        ("Stars in E mark cysts.", ["E"]),
    ]


# -- rescaling and JPEG --------------------------------------------------------------------------


def test_rescaling_keeps_boxes_exact() -> None:
    opts = dict(
        n_panels=4, gutter=24, margin=12, label_position="outside", label_style="A", width=800, height=600
    )
    _, full = generate_figure(5, **opts)
    half_img, half = generate_figure(5, scale=0.5, **opts)
    assert half_img.size == (400, 300) and (half["width"], half["height"]) == (400, 300)
    for p_full, p_half in zip(full["panels"], half["panels"], strict=True):
        assert p_half["box"] == scale_inclusive(p_full["box"], 0.5, 0.5)
    for lab, box in full["label_boxes"].items():
        assert half["label_boxes"][lab] == scale_inclusive(box, 0.5, 0.5)
    # ...and the scaled boxes still sit tightly on the rescaled ink (labels masked out)
    ink = pixels(half_img).min(axis=2) < 225
    for x0, y0, x1, y1 in half["label_boxes"].values():
        ink[max(0, y0 - 1) : y1 + 2, max(0, x0 - 1) : x1 + 2] = False
    for p in half["panels"]:
        x0, y0, x1, y1 = p["box"]
        window = ink[max(0, y0 - 4) : y1 + 5, max(0, x0 - 4) : x1 + 5]
        ys, xs = np.nonzero(window)
        got = (
            xs.min() + max(0, x0 - 4),
            ys.min() + max(0, y0 - 4),
            xs.max() + max(0, x0 - 4),
            ys.max() + max(0, y0 - 4),
        )
        assert all(abs(g - b) <= 1 for g, b in zip(got, p["box"], strict=True)), (got, p["box"])


def test_jpeg_round_trip_keeps_truth() -> None:
    img, gt = generate_figure(9, jpeg_quality=60, **SMALL)
    plain_img, plain = generate_figure(9, **SMALL)
    assert img.size == plain_img.size
    assert gt["panels"] == plain["panels"] and gt["caption"] == plain["caption"]
    assert png_bytes(img) != png_bytes(plain_img)


# -- dataset writer and CLI ----------------------------------------------------------------------


def test_cli_writes_figures_and_annotations(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(synth_command)
    runner = CliRunner()
    out = tmp_path / "synth"
    result = runner.invoke(app, [str(out), "--count", "4", "--seed", "3", "--size", "400x300"])
    assert result.exit_code == 0, result.output
    images = sorted(p for p in out.iterdir() if p.suffix in (".png", ".jpg"))
    assert len(images) == 4
    assert len(list(out.glob("synth_*.json"))) == 4
    data = json.loads((out / "annotations.json").read_text(encoding="utf-8"))
    assert "_notes" in data
    entries = load_annotations(out)
    assert sorted(entries) == [p.name for p in images]
    for path in images:
        entry = entries[path.name]
        with Image.open(path) as im:
            assert im.size == (entry["width"], entry["height"])
        assert json.loads(path.with_suffix(".json").read_text(encoding="utf-8")) == entry
    bad = runner.invoke(app, [str(out), "--size", "big"])
    assert bad.exit_code != 0


def test_write_dataset_is_byte_identical_by_seed(tmp_path: Path) -> None:
    a = write_dataset(tmp_path / "a", 3, 17, size=(360, 270))
    b = write_dataset(tmp_path / "b", 3, 17, size=(360, 270))
    assert [p.name for p in a] == [p.name for p in b]
    for pa, pb in zip(a, b, strict=True):
        assert pa.read_bytes() == pb.read_bytes()
    assert (tmp_path / "a" / "annotations.json").read_bytes() == (
        tmp_path / "b" / "annotations.json"
    ).read_bytes()


def test_only_bare_letters_and_numbers_are_circled(pool: list[tuple[Image.Image, dict[str, Any]]]) -> None:
    """A circle drawn round "(viii)" or "4a." is nothing a paper prints (and a 60-px disc)."""
    from p2p.mining.lab.synth.figure import CIRCLED_STYLES

    circled = {gt["synth"]["label_style"] for _, gt in pool if gt["synth"]["label_decoration"] == "circled"}
    assert circled and circled <= set(CIRCLED_STYLES)


# What each image source is called in a caption: a panel's subcaption must name its own source.
MODALITY_WORDS = {
    "ihc": r"Immunohistochemical|IHC",
    "phase": r"Phase-contrast",
    "fundus": r"fundus",
    "fluorescence": r"Immunofluorescence|Confocal",
    "em": r"\b(HR-)?TEM\b|\bSEM\b",
    "ct": r"\bCT\b",
    "mri": r"\bMR",
    "ultrasound": r"ultrasound",
    "blot": r"Western blot",
    "map": r"map",
    "photo": r"Photograph",
}


def test_captions_describe_the_image_source_each_panel_shows(
    pool: list[tuple[Image.Image, dict[str, Any]]],
) -> None:
    for _, gt in pool:
        shown = {p.get("modality") for p in gt["panels"] if p["type"] == "image"}
        for p in gt["panels"]:
            if p["type"] != "image" or p["label"] is None:
                continue
            words = MODALITY_WORDS[p["modality"]]
            assert re.search(words, gt["subcaptions"][p["label"]]), (p["modality"], gt["caption"])
        preamble = gt["subcaptions"]["preamble"]
        if "nanostructures" in preamble:
            assert "em" in shown
        elif preamble and "em" in shown:
            raise AssertionError(f"a biology preamble over electron micrographs: {gt['caption']}")
        if "patients with" in preamble:
            assert shown and shown <= {"ct", "mri", "ultrasound", "fundus", "ihc", "photo"}, gt["caption"]
