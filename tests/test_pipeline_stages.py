"""The CPU miner's declared stages: their order, their timers, and which of them move panels."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.mining.cpu.context import Stage, StageContext, check_order
from p2p.mining.lab.synth.figure import generate_figure
from p2p.mining.miner import Miner
from p2p.mining.pipeline import CpuMiner
from p2p.mining.types import PanelCandidate


@pytest.fixture(scope="module")
def miner() -> CpuMiner:
    return CpuMiner(load_text_encoder=False)


def _nothing(ctx: StageContext) -> None:
    return None


def test_a_stage_reading_what_no_earlier_stage_wrote_is_refused() -> None:
    check_order(
        [Stage("a", ("image",), ("candidates",), _nothing), Stage("b", ("candidates",), (), _nothing)]
    )
    with pytest.raises(ValueError, match="reads labels before"):
        check_order(
            [Stage("a", ("image",), ("candidates",), _nothing), Stage("b", ("labels",), (), _nothing)]
        )
    with pytest.raises(ValueError, match="names no context field"):
        check_order([Stage("a", ("image",), ("panles",), _nothing)])
    with pytest.raises(ValueError, match="two stages"):
        check_order([Stage("a", (), (), _nothing), Stage("a", (), (), _nothing)])


def test_every_backend_is_a_miner(miner: CpuMiner) -> None:
    assert isinstance(miner, Miner)
    assert miner.params_name.startswith("cpu-") and miner.params_name.endswith(".json")


def test_each_stage_is_timed_once_under_its_own_name(miner: CpuMiner) -> None:
    image, truth = generate_figure(190101, width=520, height=400, n_panels=4, marker_rate=1.0)
    result = miner.mine(np.asarray(image.convert("RGB")), truth["caption"])
    assert list(result.stage_seconds) == [stage.name for stage in miner.stages]
    assert "segment" in result.stage_seconds


def test_only_segment_and_panels_stages_move_panel_boxes(miner: CpuMiner) -> None:
    # labels outside the panels: the segmenter leaves a label in one box (trimmed off after it
    # is read), a y-axis text in another (returned to its plot)
    moved: set[str] = set()
    for seed in (190102, 190104):
        image, truth = generate_figure(seed, width=560, height=420, label_position="outside")
        ctx = StageContext(
            image=np.ascontiguousarray(np.asarray(image.convert("RGB"))), caption=truth["caption"]
        )
        boxes: set[tuple[float, ...]] = set()
        for stage in miner.stages:
            ctx.run(stage)
            now = {tuple(c.box) for c in ctx.candidates}
            if now != boxes:
                moved.add(stage.name)
            boxes = now
        assert [p.box for p in ctx.panels] == [c.box for c in ctx.candidates]
    assert moved <= {"segment"} | {s.name for s in miner.stages if s.name.startswith("panels_")}
    assert moved == {"segment", "panels_trim_labels", "panels_axis_strips"}


def test_the_captions_stage_completes_a_grid_from_its_printed_series(miner: CpuMiner) -> None:
    # a 2 x 3 grid of alike panels with only A and D read and a caption naming no panel
    boxes = [(x, y, x + 90.0, y + 80.0) for y in (0.0, 100.0) for x in (0.0, 100.0, 200.0)]
    named, stage = (next(s for s in miner.stages if s.name == n) for n in ("caption_names", "captions"))
    for caption, want in (
        ("Electron micrographs of the trunk.", ["A", "B", "C", "D", "E", "F"]),
        # a caption that names its panels decides instead (here it settles nothing)
        ("(A) Trunk. (B) Head.", ["A", None, None, "D", None, None]),
    ):
        ctx = StageContext(image=np.zeros((200, 300, 3), np.uint8), caption=caption)
        ctx.candidates = [PanelCandidate(box=b, confidence=0.9) for b in boxes]
        ctx.labels = ["A", None, None, "D", None, None]
        ctx.run(named)
        ctx.run(stage)
        assert ctx.labels == want, caption
        assert ("printed series" in " ".join(ctx.notes)) == (want[1] is not None)
