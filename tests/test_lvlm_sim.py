"""The simulated vLLM model server (tests.lvlm_sim): locating views, answers from ground truth, faults."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from p2p.mining.lab.synth.dataset import load_annotations, write_dataset
from p2p.mining.lvlm.prompts import FigureContext, Mark, build_context, build_messages, load_prompt
from p2p.mining.lvlm.schemas import ANSWERS, answer_schema
from p2p.shared.geometry import from_inclusive
from tests.lvlm_sim import DEFAULT_MODEL, FigureIndex, SimFaults, SimServer, locate

Box = tuple[float, float, float, float]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lvlm-sim")
    write_dataset(folder, 6, 23, size=(800, 640))
    return folder


@pytest.fixture(scope="module")
def entries(dataset: Path) -> dict[str, Any]:
    return load_annotations(dataset)


@pytest.fixture
def sim(dataset: Path) -> Iterator[SimServer]:
    server = SimServer([dataset], faults=SimFaults(seed=5))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- helpers -----------------------------------------------------------------------------------------


def figure_pixels(folder: Path, name: str) -> np.ndarray:
    return np.asarray(Image.open(folder / name).convert("RGB"))


def view(image: np.ndarray, crop: Box, size: tuple[int, int]) -> np.ndarray:
    """crop (figure pixels, exclusive) resized to ``size`` — what the product sends."""
    pil = Image.fromarray(image).crop(tuple(round(v) for v in crop))  # type: ignore[arg-type]
    return np.asarray(pil.resize(size, Image.Resampling.BICUBIC))


def size28(width: float, height: float) -> tuple[int, int]:
    return max(28, round(width / 28) * 28), max(28, round(height / 28) * 28)


def ask(
    sim: SimServer,
    prompt_name: str,
    image: np.ndarray,
    caption: str,
    *,
    marks: list[Mark] | None = None,
    subcaption: str | None = None,
    max_tokens: int | None = None,
) -> httpx.Response:
    prompt = load_prompt(prompt_name)
    context = build_context(
        FigureContext(caption=caption, title="A paper"),
        image_size=(image.shape[1], image.shape[0]),
        subcaption=subcaption,
        marks=marks,
    )
    body = {
        "model": DEFAULT_MODEL,
        "messages": build_messages(prompt, image, context),
        "max_tokens": max_tokens or max(prompt.max_tokens, 4096),
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.05,
        "structured_outputs": {"json": answer_schema(prompt_name)},
    }
    return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)


def answer_of(response: httpx.Response, prompt_name: str) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    ANSWERS[prompt_name].model_validate_json(content)  # the product's schema accepts it
    result: dict[str, Any] = json.loads(content)
    return result


def gt_panels(entry: dict[str, Any]) -> dict[str, Box]:
    return {p["label"]: from_inclusive(p["box"]) for p in entry["panels"]}


def entry_with_markers(entries: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return next((n, e) for n, e in sorted(entries.items()) if any(m.get("text") for m in e["markers"]))


def first(entries: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return sorted(entries.items())[0]


# -- locating ----------------------------------------------------------------------------------------


def test_locate_recovers_crop_and_scale(dataset: Path, entries: dict[str, Any]) -> None:
    cases = [
        (0.0, 0.0, 1.0, 1.0, 0.6),
        (0.05, 0.1, 0.8, 0.85, 0.35),
        (0.2, 0.0, 1.0, 0.75, 1.9),
        (0, 0, 1, 1, 1.4),
    ]
    for name in sorted(entries)[:3]:
        image = figure_pixels(dataset, name)
        index = FigureIndex(image)
        h, w = image.shape[:2]
        for fx1, fy1, fx2, fy2, scale in cases:
            crop = (round(fx1 * w), round(fy1 * h), round(fx2 * w), round(fy2 * h))
            received = view(image, crop, size28((crop[2] - crop[0]) * scale, (crop[3] - crop[1]) * scale))
            placement = locate(index, received)
            assert placement is not None, (name, crop, scale)
            error = max(abs(a - b) for a, b in zip(placement.view, crop, strict=True))
            assert error <= 1.0, (name, crop, scale, placement)


def test_locate_panel_and_region_crops(dataset: Path, entries: dict[str, Any]) -> None:
    name, entry = entry_with_markers(entries)
    image = figure_pixels(dataset, name)
    index = FigureIndex(image)
    panel = from_inclusive(entry["panels"][0]["box"])
    placement = locate(index, view(image, panel, size28(panel[2] - panel[0], panel[3] - panel[1])))
    assert placement is not None
    assert max(abs(a - b) for a, b in zip(placement.view, panel, strict=True)) <= 2.0
    t = from_inclusive(next(m for m in entry["markers"] if m.get("text"))["target_box"])
    region = (t[0] - 10, t[1] - 10, t[2] + 10, t[3] + 10)
    placement = locate(
        index, view(image, region, size28(3 * (region[2] - region[0]), 3 * (region[3] - region[1])))
    )
    assert placement is not None
    assert max(abs(a - b) for a, b in zip(placement.view, region, strict=True)) <= 3.0


# -- answers -----------------------------------------------------------------------------------------


def test_protocol_health_models_and_usage(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    assert httpx.get(f"{sim.url}/health").status_code == 200
    models = httpx.get(f"{sim.url}/v1/models").json()
    assert models["data"][0]["id"] == DEFAULT_MODEL
    name, entry = first(entries)
    image = figure_pixels(dataset, name)
    received = view(
        image, (0, 0, image.shape[1], image.shape[0]), size28(image.shape[1] / 2, image.shape[0] / 2)
    )
    response = ask(sim, "describe", received, entry["caption"])
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == DEFAULT_MODEL
    assert data["choices"][0]["finish_reason"] == "stop"
    usage = data["usage"]
    image_tokens = (received.shape[1] // 28) * (received.shape[0] // 28)
    assert usage["prompt_tokens"] > image_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sim.stats.requests["describe"] == 1
    assert sim.stats.status_codes[200] == 1
    bad_model = httpx.post(f"{sim.url}/v1/chat/completions", json={"model": "other", "messages": []})
    assert bad_model.status_code == 404
    assert "error" in bad_model.json()


def test_panels_whole_figure_maps_back_to_ground_truth(
    sim: SimServer, dataset: Path, entries: dict[str, Any]
) -> None:
    for name, entry in sorted(entries.items())[:3]:
        image = figure_pixels(dataset, name)
        h, w = image.shape[:2]
        size = size28(w * 0.6, h * 0.6)
        received = view(image, (0, 0, w, h), size)
        # a generous budget: long shared subcaptions of many panels exceed the prompt's 1536 tokens
        answer = answer_of(ask(sim, "panels", received, entry["caption"], max_tokens=4096), "panels")
        sx, sy = size[0] / w, size[1] / h
        truth = gt_panels(entry)
        assert {p["panel_id"] for p in answer["panels"]} == set(truth)
        assert answer["single_panel"] == (len(truth) == 1)
        for panel in answer["panels"]:
            back = (
                panel["bbox"][0] / sx,
                panel["bbox"][1] / sy,
                panel["bbox"][2] / sx,
                panel["bbox"][3] / sy,
            )
            assert (
                max(abs(a - b) for a, b in zip(back, truth[panel["panel_id"]], strict=True)) <= 2.0 / 0.6 + 1
            )
            assert panel["subcaption"] == entry["subcaptions"].get(panel["panel_id"], "")
            assert panel["description"]


def test_panels_crop_drops_cut_panels(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    name, entry = max(sorted(entries.items()), key=lambda item: len(item[1]["panels"]))
    image = figure_pixels(dataset, name)
    h, w = image.shape[:2]
    crop = (round(0.27 * w), 0, w, round(0.8 * h))
    size = size28((crop[2] - crop[0]) * 0.9, (crop[3] - crop[1]) * 0.9)
    answer = answer_of(
        ask(sim, "panels", view(image, crop, size), entry["caption"], max_tokens=4096), "panels"
    )
    truth = gt_panels(entry)
    inside = {
        label
        for label, b in truth.items()
        if b[0] >= crop[0] - 1 and b[1] >= crop[1] - 1 and b[2] <= crop[2] + 1 and b[3] <= crop[3] + 1
    }
    assert len(inside) < len(truth)  # the crop really cuts something
    assert {p["panel_id"] for p in answer["panels"]} == inside
    sx, sy = size[0] / (crop[2] - crop[0]), size[1] / (crop[3] - crop[1])
    for panel in answer["panels"]:
        t = truth[panel["panel_id"]]
        expected = (
            (t[0] - crop[0]) * sx,
            (t[1] - crop[1]) * sy,
            (t[2] - crop[0]) * sx,
            (t[3] - crop[1]) * sy,
        )
        assert max(abs(a - b) for a, b in zip(panel["bbox"], expected, strict=True)) <= 2.0


def test_markers_objects_and_describe_on_a_panel_crop(
    sim: SimServer, dataset: Path, entries: dict[str, Any]
) -> None:
    name, entry = entry_with_markers(entries)
    marker = next(m for m in entry["markers"] if m.get("text"))
    panel = next(p for p in entry["panels"] if p["label"] == marker["panel"])
    image = figure_pixels(dataset, name)
    box = from_inclusive(panel["box"])
    size = size28((box[2] - box[0]) * 1.5, (box[3] - box[1]) * 1.5)
    received = view(image, box, size)
    sx, sy = size[0] / (box[2] - box[0]), size[1] / (box[3] - box[1])
    subcaption = entry["subcaptions"].get(panel["label"], "")
    markers = answer_of(ask(sim, "markers", received, entry["caption"], subcaption=subcaption), "markers")
    in_panel = [m for m in entry["markers"] if m["panel"] == panel["label"]]
    assert len(markers["markers"]) == len(in_panel)
    assert [m["marker_id"] for m in markers["markers"]] == [f"m{i + 1}" for i in range(len(in_panel))]
    t = from_inclusive(marker["target_box"])
    expected = ((t[0] - box[0]) * sx, (t[1] - box[1]) * sy, (t[2] - box[0]) * sx, (t[3] - box[1]) * sy)
    assert any(
        m["caption"] == marker["text"]
        and max(abs(a - b) for a, b in zip(m["target_bbox"], expected, strict=True)) <= 3.0
        for m in markers["markers"]
    )
    objects = answer_of(ask(sim, "objects", received, entry["caption"], subcaption=subcaption), "objects")
    assert marker["text"] in {o["phrase"] for o in objects["objects"]}
    described = answer_of(ask(sim, "describe", received, entry["caption"]), "describe")
    assert panel["type"] in described["description"]
    region = (t[0] - 6, t[1] - 6, t[2] + 6, t[3] + 6)
    small = view(image, region, size28(4 * (region[2] - region[0]), 4 * (region[3] - region[1])))
    described = answer_of(ask(sim, "describe", small, entry["caption"]), "describe")
    assert marker["text"] in described["description"]


def test_verify_panels_and_describe_marks(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    name, entry = entry_with_markers(entries)
    image = figure_pixels(dataset, name)
    h, w = image.shape[:2]
    size = size28(w * 0.8, h * 0.8)
    sx, sy = size[0] / w, size[1] / h
    truth = gt_panels(entry)
    labels = sorted(truth)
    marks = [
        Mark(i + 1, "panel", (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy))
        for i, b in enumerate(truth[label] for label in labels[1:])
    ]
    marks.append(Mark(len(marks) + 1, "panel", (0, 0, 20, 20)))  # not a panel
    received = view(image, (0, 0, w, h), size).copy()
    draw = ImageDraw.Draw(pil := Image.fromarray(received))
    for mark in marks:
        draw.rectangle(mark.box, outline=(255, 0, 0), width=2)
        draw.text((mark.box[0] + 3, mark.box[1] + 3), str(mark.number), fill=(255, 0, 0))
    drawn = np.asarray(pil)
    answer = answer_of(ask(sim, "verify_panels", drawn, entry["caption"], marks=marks), "verify_panels")
    verdicts = {v["mark"]: v for v in answer["marks"]}
    for mark, label in zip(marks[:-1], labels[1:], strict=True):
        assert verdicts[mark.number]["is_panel"] is True
        assert verdicts[mark.number]["panel_id"] == label
        assert max(abs(a - b) for a, b in zip(verdicts[mark.number]["bbox"], mark.box, strict=True)) <= 2.0
    assert verdicts[marks[-1].number]["is_panel"] is False
    assert answer["missing_panels"] == 1  # labels[0] has no mark

    marker = next(m for m in entry["markers"] if m.get("text"))
    t = from_inclusive(marker["target_box"])
    region_marks = [
        Mark(1, "panel", marks[0].box, "a panel"),
        Mark(2, "region", (t[0] * sx, t[1] * sy, t[2] * sx, t[3] * sy), marker["text"]),
        Mark(3, "region", (1, 1, 6, 6), "nothing"),
    ]
    answer = answer_of(
        ask(sim, "describe_marks", drawn, entry["caption"], marks=region_marks), "describe_marks"
    )
    keep = {d["mark"]: d["keep"] for d in answer["descriptions"]}
    assert keep == {1: True, 2: True, 3: False}
    assert marker["text"] in answer["descriptions"][1]["description"]


def test_unknown_caption_gets_an_empty_valid_answer(
    sim: SimServer, dataset: Path, entries: dict[str, Any]
) -> None:
    name, _ = first(entries)
    image = view(figure_pixels(dataset, name), (0, 0, 200, 200), (112, 112))
    for prompt_name in ("panels", "markers", "objects", "describe", "verify_panels"):
        answer = answer_of(ask(sim, prompt_name, image, "A caption nobody wrote."), prompt_name)
        assert not answer.get("panels") and not answer.get("markers") and not answer.get("objects")
    assert sim.stats.unknown_figures == 5


# -- faults ------------------------------------------------------------------------------------------


def whole(dataset: Path, entries: dict[str, Any], scale: float = 0.5) -> tuple[np.ndarray, dict[str, Any]]:
    name, entry = first(entries)
    image = figure_pixels(dataset, name)
    h, w = image.shape[:2]
    return view(image, (0, 0, w, h), size28(w * scale, h * scale)), entry


def test_malformed_answers_are_not_json(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    image, entry = whole(dataset, entries)
    sim.faults.malformed_rate = 1.0
    for _ in range(12):
        content = ask(sim, "panels", image, entry["caption"]).json()["choices"][0]["message"]["content"]
        with pytest.raises(ValueError):
            json.loads(content)
    assert len(sim.stats.malformed) >= 3
    sim.faults.malformed_rate = 0.0
    answer_of(ask(sim, "panels", image, entry["caption"]), "panels")


def test_max_tokens_truncates_the_answer(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    image, entry = whole(dataset, entries)
    data = ask(sim, "panels", image, entry["caption"], max_tokens=20).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert len(data["choices"][0]["message"]["content"]) <= 80
    assert data["usage"]["completion_tokens"] <= 20
    assert sim.stats.truncated == 1


def test_wrong_frame_normalized_jitter_and_labels(
    sim: SimServer, dataset: Path, entries: dict[str, Any]
) -> None:
    image, entry = whole(dataset, entries, scale=0.5)
    truth = gt_panels(entry)
    sim.faults.wrong_frame_rate = 1.0
    answer = answer_of(ask(sim, "panels", image, entry["caption"]), "panels")
    for panel in answer["panels"]:
        assert max(abs(a - b) for a, b in zip(panel["bbox"], truth[panel["panel_id"]], strict=True)) <= 1.0
    sim.faults.wrong_frame_rate = 0.0
    sim.faults.normalized_rate = 1.0
    answer = answer_of(ask(sim, "panels", image, entry["caption"]), "panels")
    assert all(0.0 <= v <= 1.0 for p in answer["panels"] for v in p["bbox"])
    sim.faults.reset()
    sim.faults.wrong_label_rate = 1.0
    answer = answer_of(ask(sim, "panels", image, entry["caption"]), "panels")
    centres = {label: ((b[0] + b[2]) / 4, (b[1] + b[3]) / 4) for label, b in truth.items()}
    for panel in answer["panels"]:
        b = panel["bbox"]
        nearest = min(
            centres,
            key=lambda k: abs(centres[k][0] - (b[0] + b[2]) / 2) + abs(centres[k][1] - (b[1] + b[3]) / 2),
        )
        assert panel["panel_id"] != nearest
    sim.faults.reset()
    sim.faults.miss_rate = 1.0
    assert answer_of(ask(sim, "panels", image, entry["caption"]), "panels")["panels"] == []


def test_hallucinated_objects_are_recorded(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    name, entry = entry_with_markers(entries)
    image = figure_pixels(dataset, name)
    panel = from_inclusive(entry["panels"][0]["box"])
    received = view(image, panel, size28(panel[2] - panel[0], panel[3] - panel[1]))
    sim.faults.hallucinate_rate = 1.0
    answer = answer_of(ask(sim, "objects", received, entry["caption"]), "objects")
    assert len(sim.stats.hallucinated_objects) == 1
    record = sim.stats.hallucinated_objects[0]
    assert record["figure"] == name
    box = record["box"]
    assert panel[0] - 1 <= box[0] < box[2] <= panel[2] + 1 and panel[1] - 1 <= box[1] < box[3] <= panel[3] + 1
    assert record["phrase"] in {o["phrase"] for o in answer["objects"]}
    sim.stats.reset()
    assert sim.stats.hallucinated_objects == [] and sim.stats.total_requests == 0


def test_rate_limits_errors_and_down(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    image, entry = whole(dataset, entries, scale=0.3)
    sim.faults.rate_limit_rate = 1.0
    response = ask(sim, "describe", image, entry["caption"])
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == 429
    sim.faults.rate_limit_rate = 0.0
    sim.faults.error_rate = 1.0
    codes = {ask(sim, "describe", image, entry["caption"]).status_code for _ in range(8)}
    assert codes <= {500, 503} and codes
    sim.faults.error_rate = 0.0
    sim.faults.down = True
    assert httpx.get(f"{sim.url}/health").status_code == 503
    assert ask(sim, "describe", image, entry["caption"]).status_code == 503
    sim.faults.down = False
    assert httpx.get(f"{sim.url}/health").status_code == 200
    assert ask(sim, "describe", image, entry["caption"]).status_code == 200
    assert sim.stats.status_codes[429] == 1 and sim.stats.status_codes[503] >= 1


def test_die_after_drops_connections(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    image, entry = whole(dataset, entries, scale=0.3)
    sim.faults.die_after = 2
    assert ask(sim, "describe", image, entry["caption"]).status_code == 200
    assert ask(sim, "describe", image, entry["caption"]).status_code == 200
    for _ in range(2):
        with pytest.raises(httpx.TransportError):
            ask(sim, "describe", image, entry["caption"])
    assert sim.dead
    assert httpx.get(f"{sim.url}/health").status_code == 503
    assert sim.stats.dropped == 2
    sim.revive()
    assert ask(sim, "describe", image, entry["caption"]).status_code == 200


def test_concurrent_requests_overlap(sim: SimServer, dataset: Path, entries: dict[str, Any]) -> None:
    image, entry = whole(dataset, entries, scale=0.3)
    prompt = load_prompt("describe")
    context = build_context(
        FigureContext(caption=entry["caption"]), image_size=(image.shape[1], image.shape[0])
    )
    body = {"model": DEFAULT_MODEL, "messages": build_messages(prompt, image, context), "max_tokens": 128}
    ask(sim, "describe", image, entry["caption"])  # warm the locator cache
    sim.faults.latency_s = 0.5

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(
                *(client.post(f"{sim.url}/v1/chat/completions", json=body) for _ in range(32))
            )
        return [r.status_code for r in responses]

    started = time.monotonic()
    codes = asyncio.run(run())
    elapsed = time.monotonic() - started
    assert codes == [200] * 32
    assert elapsed < 4.0
    assert sim.stats.max_in_flight >= 16


def test_the_registry_reads_real_annotations_with_target_points_only(tmp_path: Path) -> None:
    """Real annotations (real-dev) give a marker's target point, no target box, and label
    null on unlabelled figures: the simulated server answers from them all the same."""
    from tests.lvlm_sim.registry import figure_from_entry

    entry = {
        "width": 400,
        "height": 200,
        "caption": None,
        "panels": [{"label": None, "box": [0, 0, 199, 199], "type": "image"}],
        "markers": [{"kind": "arrow", "target_point": [100, 50], "panel": None}],
    }
    figure = figure_from_entry(tmp_path, "real.png", entry)
    assert figure.panels[0].label == ""
    x1, y1, x2, y2 = figure.markers[0].target_box
    assert x1 < 100 < x2 and y1 < 50 < y2 and x2 - x1 == 10.0
