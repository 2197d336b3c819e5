"""The LVLM miner (paper-faithful and hybrid) against the simulated vLLM server: outputs, cost
accounting, and every fault the issue names (bad answers, bad coordinates, busy or dead server)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from p2p.mining.lvlm.client import LvlmUnavailable
from p2p.mining.lvlm.miner import LvlmMiner, _reconcile_labels
from p2p.mining.lvlm.prompts import prompt_versions
from p2p.mining.lvlm.run import FigureRun
from p2p.mining.pipeline import CpuMiner
from p2p.mining.types import MiningResult
from p2p.shared import geometry
from tests.lvlm_fixtures import figure_pixels, lvlm_settings
from tests.lvlm_sim import SimServer

FIGURE = "synth_00004.png"  # 4 unlabelled panels (plot, two micrographs with markers, schematic)
LABELLED = "synth_00000.jpg"  # 10 panels a-j, 6 micrographs, 7 markers


def _mine(
    sim: SimServer, cpu: CpuMiner, folder: Path, entries: dict[str, Any], name: str = FIGURE, **settings: Any
) -> MiningResult:
    miner = LvlmMiner(lvlm_settings(sim, **settings), cpu=cpu)
    try:
        return miner.mine(figure_pixels(folder, name), entries[name]["caption"])
    finally:
        miner.close()


def _matched(result: MiningResult, truth: dict[str, Any], level: float = 0.9) -> int:
    gt = [geometry.from_inclusive(p["box"]) for p in truth["panels"]]
    return len(geometry.match_greedy([p.box for p in result.panels], gt, level))


def test_paper_mode_mines_the_hierarchy_with_texts_and_cost(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    truth = lvlm_entries[LABELLED]
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, LABELLED, mode="paper", views=3)
    assert _matched(result, truth) == len(truth["panels"]) == len(result.panels)
    assert [p.label for p in result.panels] == [p["label"] for p in truth["panels"]]
    for panel in result.panels:
        assert panel.subcaption == truth["subcaptions"][panel.label]  # verbatim from the model
        assert panel.description
    assert result.regions, "markers on the micrographs become regions"
    assert all(r.description for r in result.regions)  # the crop-description pathway
    assert any(r.caption_text for r in result.regions)  # the grounded-caption pathway
    image_panels = sum(p.figure_type == "image" for p in result.panels)
    stages = result.cost["stages"]
    assert stages["panels"]["requests"] == 3  # one per view
    assert stages["markers"]["requests"] == stages["objects"]["requests"] == image_panels
    assert stages["describe"]["requests"] == len(result.regions) + len(result.panels)
    assert result.cost["requests"] == sum(s["requests"] for s in stages.values()) == sim.stats.total_requests
    assert result.cost["prompt_tokens"] == sim.stats.prompt_tokens
    assert result.cost["fallbacks"] == 0
    assert result.provenance["mode"] == "paper"
    assert result.provenance["prompts"] == prompt_versions()


def test_hybrid_mode_verifies_and_describes_in_two_requests_when_the_cpu_is_right(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    truth = lvlm_entries[FIGURE]
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="hybrid")
    assert _matched(result, truth) == len(truth["panels"])
    assert result.cost["requests"] == 2
    assert set(result.cost["stages"]) == {"verify", "describe"}
    assert result.cost["outcomes"]["panels"] == "skipped"
    assert all(p.description for p in result.panels)


def test_hybrid_decomposes_when_the_model_disputes_the_cpu_panels(
    sim: SimServer, lvlm_dataset: Path, lvlm_entries: dict[str, Any], cpu_miner: CpuMiner
) -> None:
    class MergingCpu(CpuMiner):
        """The CPU backend gets two panels merged into one: the model must dispute it."""

        def __init__(self, inner: CpuMiner) -> None:
            self.__dict__.update(inner.__dict__)

        def mine(self, image: Any, caption: str, *, context: Any = None) -> MiningResult:
            result = super().mine(image, caption)
            a, b = result.panels[0], result.panels[1]
            a.box = geometry.union_box(a.box, b.box)
            del result.panels[1]
            return result

    truth = lvlm_entries[FIGURE]
    miner = LvlmMiner(lvlm_settings(sim, mode="hybrid"), cpu=MergingCpu(cpu_miner))
    try:
        result = miner.mine(figure_pixels(lvlm_dataset, FIGURE), truth["caption"])
    finally:
        miner.close()
    assert "panels" in result.cost["stages"]  # decomposed by multi-view voting
    assert _matched(result, truth) == len(truth["panels"])
    assert any("disputes the CPU panels" in note for note in result.notes)


@pytest.mark.parametrize("kind", ["fenced", "trailing_prose", "single_quotes"])
def test_repairable_answers_are_repaired_and_recorded(
    kind: str, sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.malformed_rate = 1.0
    sim.faults.malformed_kinds = (kind,)
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3)
    assert _matched(result, lvlm_entries[FIGURE]) == len(lvlm_entries[FIGURE]["panels"])
    assert result.cost["repairs"] >= 3 and result.cost["fallbacks"] == 0
    assert result.cost["outcomes"]["panels"] == "lvlm-repaired"


@pytest.mark.parametrize("mode", ["paper", "hybrid"])
def test_unusable_answers_fall_back_to_the_cpu_backend_and_lose_nothing(
    mode: str, sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.malformed_rate = 1.0
    sim.faults.malformed_kinds = ("empty", "garbage")
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode=mode, views=3)
    cpu = cpu_miner.mine(figure_pixels(lvlm_dataset, FIGURE), lvlm_entries[FIGURE]["caption"])
    assert [p.box for p in result.panels] == [p.box for p in cpu.panels]  # the CPU's panels, kept
    assert result.cost["fallbacks"] >= 1
    assert "cpu-fallback" in result.cost["outcomes"].values()
    assert any("CPU backend used" in note for note in result.notes)
    # Each unusable answer was asked once more before falling back.
    assert result.cost["failures"] == result.cost["requests"]


def test_an_answer_cut_at_the_token_limit_is_repaired_or_falls_back(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    result = _mine(
        sim,
        cpu_miner,
        lvlm_dataset,
        lvlm_entries,
        LABELLED,
        mode="paper",
        views=3,
        max_tokens_by_prompt={"panels": 120},
    )
    assert sim.stats.truncated >= 3
    assert result.panels  # repaired prefixes or the CPU's panels: never an empty figure
    assert result.cost["stages"]["panels"]["repairs"] + result.cost["stages"]["panels"]["fallbacks"] >= 1


@pytest.mark.parametrize("fault", ["wrong_frame_rate", "normalized_rate"])
def test_answers_in_another_coordinate_frame_are_mapped_back(
    fault: str, sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    setattr(sim.faults, fault, 1.0)
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3, describe_regions=False)
    assert _matched(result, lvlm_entries[FIGURE]) == len(lvlm_entries[FIGURE]["panels"])


def test_429_and_5xx_answers_are_retried_and_counted(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.rate_limit_rate = 0.3
    sim.faults.error_rate = 0.2
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3, max_retries=8)
    assert result.cost["retries"] >= 1
    assert sim.stats.status_codes[429] + sim.stats.status_codes[500] + sim.stats.status_codes[503] >= 1
    assert _matched(result, lvlm_entries[FIGURE]) == len(lvlm_entries[FIGURE]["panels"])


def test_a_server_down_at_start_is_reported_before_any_work(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.down = True
    miner = LvlmMiner(lvlm_settings(sim, mode="paper"), cpu=cpu_miner)
    try:
        with pytest.raises(LvlmUnavailable, match="not ready"):
            miner.ensure_ready()
        with pytest.raises(LvlmUnavailable):
            miner.mine(figure_pixels(lvlm_dataset, FIGURE), lvlm_entries[FIGURE]["caption"])
        assert sim.stats.total_requests == 0  # no completion was attempted
        sim.faults.down = False
        miner.client._healthy_until = 0.0
        miner.ensure_ready()  # back up: the worker takes work again
    finally:
        miner.close()


def test_a_server_dying_mid_figure_raises_unavailable_not_a_half_result(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.die_after = 4
    with pytest.raises(LvlmUnavailable):
        _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3, max_retries=1)
    assert sim.stats.dropped >= 1


def test_the_tau_gate_drops_hallucinated_caption_boxes(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.hallucinate_rate = 1.0
    sim.faults.hallucinate_tasks = ("objects",)  # made-up caption boxes, real markers only
    no_markers = "synth_00003.jpg"  # six micrographs, no marker anywhere
    assert not lvlm_entries[no_markers]["markers"]
    results = {
        name: _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, name, mode="paper", views=3)
        for name in (LABELLED, FIGURE, no_markers)
    }
    hallucinated = sim.stats.hallucinated_objects
    by_figure = {name: [h for h in hallucinated if h["figure"] == name] for name in results}
    assert len(by_figure[no_markers]) >= 3 and len(hallucinated) >= 8

    def kept(h: dict[str, Any]) -> bool:
        box = tuple(h["box"])
        return any(
            r.kind == "caption" and geometry.iou(r.box, box) >= 0.5 for r in results[h["figure"]].regions
        )

    # With no marker in the figure, nothing the model grounds in the caption survives.
    assert not any(kept(h) for h in by_figure[no_markers])
    assert (
        results[no_markers].cost["caption_boxes"] >= 3 and results[no_markers].cost["caption_boxes_kept"] == 0
    )
    # Elsewhere a made-up box survives only where the paper's rule lets it: near a reported marker.
    for h in filter(kept, hallucinated):
        result = results[h["figure"]]
        cx, cy = geometry.center(tuple(h["box"]))
        panel = max(result.panels, key=lambda p: geometry.intersection(p.box, tuple(h["box"])))
        reach = 0.1 * float(np.hypot(geometry.width(panel.box), geometry.height(panel.box)))
        centres = [geometry.center(m.target_box) for m in result.markers]
        assert any(np.hypot(cx - mx, cy - my) <= reach + 1 for mx, my in centres)


def test_figures_from_many_threads_share_one_bound_of_requests_in_flight(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    sim.faults.latency_s = 0.05
    miner = LvlmMiner(lvlm_settings(sim, mode="paper", views=3, max_in_flight=4), cpu=cpu_miner)
    results: list[MiningResult] = []
    names = sorted(lvlm_entries)[:4]
    try:
        threads = [
            threading.Thread(
                target=lambda n=name: results.append(
                    miner.mine(figure_pixels(lvlm_dataset, n), lvlm_entries[n]["caption"])
                )
            )
            for name in names
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        peak = miner.client.peak_in_flight
    finally:
        miner.close()
    assert len(results) == len(names)
    assert peak == 4 and sim.stats.max_in_flight <= 4


def test_a_tiny_image_is_left_to_the_cpu_backend(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    import numpy as np

    miner = LvlmMiner(lvlm_settings(sim, mode="paper"), cpu=cpu_miner)
    try:
        result = miner.mine(np.full((20, 20, 3), 255, dtype=np.uint8), "(A) nothing")
    finally:
        miner.close()
    assert len(result.panels) == 1 and sim.stats.total_requests == 0
    assert any("too small for the model" in note for note in result.notes)


def test_labels_the_caption_does_not_name_are_dropped_then_filled_in_reading_order() -> None:
    run = FigureRun(client=None)  # type: ignore[arg-type]
    labels = _reconcile_labels(["A", "Z", "b", None, "A"], ["A", "B", "C", "D", "E"], run)
    assert labels == ["A", "C", "B", "D", "E"]
    assert any("'Z' is not in the caption" in note for note in run.notes)
    assert any("given twice" in note for note in run.notes)
    kept = _reconcile_labels(["A", "Q"], ["A", "B", "C"], FigureRun(client=None))  # type: ignore[arg-type]
    assert kept == ["A", None]  # two labels left for one panel: no guess


def test_inverted_boxes_are_fixed_and_boxes_past_the_image_are_clipped(
    sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    truth = lvlm_entries[FIGURE]
    sim.faults.inverted_rate = 1.0
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3, describe_regions=False)
    assert _matched(result, truth) == len(truth["panels"])
    assert any("inverted" in note for note in result.notes)

    sim.faults.inverted_rate = 0.0
    sim.faults.outside_rate = 1.0
    result = _mine(sim, cpu_miner, lvlm_dataset, lvlm_entries, mode="paper", views=3, describe_regions=False)
    width, height = truth["width"], truth["height"]
    for box in [p.box for p in result.panels] + [r.box for r in result.regions]:
        assert 0 <= box[0] < box[2] <= width and 0 <= box[1] < box[3] <= height
    assert any("clipped" in note for note in result.notes)


class _MisreadingCpu:
    """The CPU miner, with its labels read as others (a/b swapped, the rest lost): what it
    proposes on a real figure whose labels it misreads."""

    def __init__(self, cpu: CpuMiner) -> None:
        self._cpu = cpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cpu, name)

    def mine(self, image: np.ndarray, caption: str, **kwargs: Any) -> MiningResult:
        result = self._cpu.mine(image, caption, **kwargs)
        swap = {"a": "b", "b": "a"}
        for panel in result.panels:
            panel.label = swap.get(panel.label or "")
        return result


def test_hybrid_takes_the_models_printed_labels_when_the_caption_names_none(
    tmp_path: Path, sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    # the labelled figure again, under a caption that names no panel (the model still reads the
    # printed labels; the simulated server finds its figures by caption)
    caption = "Cell death in the cell lines we studied."
    entry = {**lvlm_entries[LABELLED], "caption": caption, "subcaptions": {}}
    shutil.copy(lvlm_dataset / LABELLED, tmp_path / LABELLED)
    (tmp_path / "annotations.json").write_text(json.dumps({LABELLED: entry}))
    sim.registry.add_folder(tmp_path)
    miner = LvlmMiner(lvlm_settings(sim, mode="hybrid"), cpu=_MisreadingCpu(cpu_miner))  # type: ignore[arg-type]
    try:
        result = miner.mine(figure_pixels(tmp_path, LABELLED), caption)
    finally:
        miner.close()
    gt = [geometry.from_inclusive(p["box"]) for p in entry["panels"]]
    matches = geometry.match_greedy([p.box for p in result.panels], gt, 0.9)
    assert {entry["panels"][j]["label"] for _, j, _ in matches} >= {"a", "b"}  # read as b and a
    assert all(result.panels[i].label == entry["panels"][j]["label"] for i, j, _ in matches)
    assert any("labels corrected by the model" in note for note in result.notes)
