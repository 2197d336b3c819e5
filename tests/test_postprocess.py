"""Box post-processing: clipping, degenerate boxes, NMS at 0.7, text-similarity merge with the
real packaged MiniLM encoder (loaded once for the module)."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.mining.postprocess import TextEncoder, postprocess, to_triplets
from p2p.mining.types import Region


def _region(box, text=None, conf=0.8, kind="inferred"):
    return Region(panel_index=0, box=box, kind=kind, marker_type="arrow", caption_text=text, confidence=conf)


class _NoEncoder:
    """Fails the test if the merge step asks for embeddings it should not need."""

    def encode(self, texts):
        raise AssertionError(f"encoder called for {texts!r}")


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder()


def test_boxes_are_clipped_to_the_image():
    out = postprocess(
        [_region((-20.0, -5.0, 60.0, 40.0))], image_width=50, image_height=30, encoder=_NoEncoder()
    )
    assert len(out) == 1
    assert out[0].box == (0.0, 0.0, 50.0, 30.0)


def test_degenerate_boxes_are_dropped():
    regions = [
        _region((10, 10, 14, 14)),  # 16 px^2: too small
        _region((0, 0, 200, 6)),  # aspect 33: a sliver
        _region((300, 300, 400, 400)),  # outside the image: nothing left after clipping
        _region((10, 10, 10, 50)),  # zero width
        _region((20, 20, 60, 50)),  # fine
    ]
    out = postprocess(regions, image_width=200, image_height=200, encoder=_NoEncoder())
    assert [r.box for r in out] == [(20.0, 20.0, 60.0, 50.0)]


def test_nms_suppresses_at_iou_0_7_class_agnostic():
    a = _region((0, 0, 100, 100), conf=0.9, kind="marker")
    b = _region((0, 0, 100, 80), conf=0.5, kind="caption")  # IoU 0.8 with a: suppressed
    c = _region((0, 0, 100, 60), conf=0.6, kind="inferred")  # IoU 0.6 with a: kept
    out = postprocess([b, a, c], image_width=500, image_height=500, encoder=_NoEncoder())
    assert [r.confidence for r in out] == [0.9, 0.6]
    assert out[0].kind == "marker"


def test_encoder_is_offline_minilm_and_normalised(encoder):
    vectors = encoder.encode(["arrows indicate infiltrating lymphocytes", "scale bar, 50 um"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert encoder.encode([]).shape == (0, 384)
    # Shared: a second instance reuses the loaded model.
    assert TextEncoder().model is encoder.model


def test_near_identical_texts_merge_into_union(encoder):
    a = _region((10, 10, 60, 60), "Arrows indicate infiltrating immune cells.", conf=0.9)
    b = _region((30, 30, 90, 90), "arrows indicate infiltrating immune cells", conf=0.7)
    out = postprocess([a, b], image_width=200, image_height=200, encoder=encoder)
    assert len(out) == 1
    assert out[0].box == (10.0, 10.0, 90.0, 90.0)
    assert out[0].caption_text == a.caption_text
    assert out[0].confidence == 0.9


def test_unrelated_texts_do_not_merge(encoder):
    a = _region((10, 10, 60, 60), "Arrows indicate infiltrating immune cells.", conf=0.9)
    b = _region((30, 30, 90, 90), "The asterisk marks a necrotic area of the tumour.", conf=0.7)
    out = postprocess([a, b], image_width=200, image_height=200, encoder=encoder)
    assert len(out) == 2
    similarity = float(np.dot(*encoder.encode([a.caption_text, b.caption_text])))
    assert similarity < 0.9


def test_same_text_far_apart_does_not_merge(encoder):
    a = _region((0, 0, 40, 40), "arrows indicate infiltrating cells")
    b = _region((100, 100, 140, 140), "arrows indicate infiltrating cells")
    out = postprocess([a, b], image_width=200, image_height=200, encoder=encoder)
    assert len(out) == 2


def test_triplets():
    regions = postprocess(
        [_region((0, 0, 50, 50), "dilated vessels")], image_width=80, image_height=80, encoder=_NoEncoder()
    )
    assert to_triplets(regions, "fig1.jpg") == [("fig1.jpg", (0.0, 0.0, 50.0, 50.0), "dilated vessels")]


def test_connected_groups_follow_chains_and_order_by_first_index() -> None:
    from p2p.mining.grouping import connected_groups

    assert connected_groups(6, [(4, 1), (1, 3), (5, 2)]) == [[0], [1, 3, 4], [2, 5]]
    assert connected_groups(3, []) == [[0], [1], [2]]
