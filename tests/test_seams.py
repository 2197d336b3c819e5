"""The learned seam splitter (``p2p.mining.cpu.segmentation.seams``) and its training labels, on
figures drawn here."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from p2p.mining.cpu.segmentation import seams
from p2p.mining.cpu.segmentation.seams import FEATURE_NAMES, SeamModel, line_features, split_boxes
from p2p.mining.lab.train_seams import line_labels


def step_model(threshold: float = 0.5) -> SeamModel:
    """A hand-made model: a line is a seam when its colour step stands out along most of it."""
    weights = np.zeros((len(FEATURE_NAMES), 1))
    weights[FEATURE_NAMES.index("step_standout"), 0] = 40.0
    return SeamModel(
        {
            "features": list(FEATURE_NAMES),
            "mean": [0.0] * len(FEATURE_NAMES),
            "scale": [1.0] * len(FEATURE_NAMES),
            "layers": [{"W": weights.tolist(), "b": [-20.0]}],
            "threshold": threshold,
        }
    )


def noisy(rng: np.random.Generator, w: int, h: int, level: int) -> np.ndarray:
    grey = np.clip(rng.normal(level, 6, (h, w)), 0, 200).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def test_line_features_shape_and_offsets() -> None:
    rng = np.random.default_rng(1)
    image = np.hstack([noisy(rng, 120, 90, 60), noisy(rng, 140, 90, 150)])
    offsets, features = line_features(image, (0, 0, 260, 90), 0, [])
    assert features.shape == (offsets.size, len(FEATURE_NAMES))
    assert np.isfinite(features).all()
    # candidates keep away from the box's ends and lie on the full-size grid
    assert offsets.min() >= 2 * seams.MIN_PART and offsets.max() <= 260 - 2 * seams.MIN_PART
    best = int(offsets[np.argmax(features[:, FEATURE_NAMES.index("step_standout")])])
    assert abs(best - 120) <= seams.SCALE
    # a box too small for two panels has no candidates
    offsets, features = line_features(image, (0, 0, 60, 90), 0, [])
    assert offsets.size == 0 and features.shape == (0, len(FEATURE_NAMES))


def test_split_boxes_cuts_touching_images_recursively_and_tightens() -> None:
    rng = np.random.default_rng(2)
    row = np.hstack([noisy(rng, 100, 80, 40), noisy(rng, 110, 80, 120), noisy(rng, 90, 80, 190)])
    image = np.full((120, 340, 3), 255, dtype=np.uint8)
    image[20:100, 20:320] = row
    out = split_boxes(image, [(20, 20, 320, 100)], model=step_model())
    assert sorted(out) == [(20, 20, 120, 100), (120, 20, 230, 100), (230, 20, 320, 100)]


def test_split_boxes_keeps_one_picture_and_respects_the_threshold() -> None:
    rng = np.random.default_rng(3)
    image = np.hstack([noisy(rng, 120, 90, 60), noisy(rng, 140, 90, 150)])
    assert split_boxes(image, [(0, 0, 260, 90)], model=step_model(), threshold=1.01) == [(0, 0, 260, 90)]
    flat = noisy(rng, 260, 90, 90)
    assert split_boxes(flat, [(0, 0, 260, 90)], model=step_model()) == [(0, 0, 260, 90)]


def test_split_boxes_tightens_parts_to_their_ink_across_a_white_gutter() -> None:
    rng = np.random.default_rng(4)
    image = np.full((90, 270, 3), 255, dtype=np.uint8)
    image[:, :120] = noisy(rng, 120, 90, 60)
    image[:, 130:] = noisy(rng, 140, 90, 60)
    weights = np.zeros((len(FEATURE_NAMES), 1))
    weights[FEATURE_NAMES.index("line_ink"), 0] = -40.0  # a blank line is a seam
    model = SeamModel(
        {
            "features": list(FEATURE_NAMES),
            "mean": [0.0] * len(FEATURE_NAMES),
            "scale": [1.0] * len(FEATURE_NAMES),
            "layers": [{"W": weights.tolist(), "b": [20.0]}],
            "threshold": 0.5,
        }
    )
    assert sorted(split_boxes(image, [(0, 0, 270, 90)], model=model)) == [(0, 0, 120, 90), (130, 0, 270, 90)]


def test_model_rejects_another_feature_set() -> None:
    with pytest.raises(ValueError):
        SeamModel({"features": ["x"], "mean": [0.0], "scale": [1.0], "layers": [], "threshold": 0.5})


@pytest.mark.parametrize("content", [None, "{not json", '{"features": ["x"], "mean": [0], "scale": [1]}'])
def test_an_unusable_model_file_is_named_with_the_way_to_rebuild_it(tmp_path, content) -> None:
    path = tmp_path / "seam_model.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(seams.SeamModelError) as caught:
        SeamModel(path=path)
    assert str(path) in str(caught.value)
    assert "train_seams" in str(caught.value)


def test_the_miner_loads_the_seam_model_at_start() -> None:
    from p2p.mining.pipeline import CpuMiner

    seams.default_model.cache_clear()
    CpuMiner(load_text_encoder=False)
    assert seams.default_model.cache_info().currsize == 1


def test_shipped_model_loads_and_scores_probabilities() -> None:
    rng = np.random.default_rng(5)
    image = np.hstack([noisy(rng, 120, 90, 60), noisy(rng, 140, 90, 150)])
    _, features = line_features(image, (0, 0, 260, 90), 0, [])
    scores = seams.default_model().predict(features)
    assert scores.shape == (features.shape[0],)
    assert ((scores >= 0.0) & (scores <= 1.0)).all()
    assert 0.0 < seams.default_model().threshold < 1.0


def test_line_labels_mark_seams_between_panels_of_the_box() -> None:
    truth = [(0.0, 0.0, 100.0, 80.0), (100.0, 0.0, 200.0, 80.0)]
    offsets = np.arange(40, 162, 2)
    labels = line_labels((0, 0, 200, 80), 0, offsets, truth)
    assert set(offsets[labels == 1].tolist()) == {98, 100, 102}
    assert set(offsets[labels == -1].tolist()) == {94, 96, 104, 106}
    assert (labels[(offsets < 94) | (offsets > 106)] == 0).all()
    # no horizontal line separates them
    assert (line_labels((0, 0, 200, 80), 1, np.arange(20, 62, 2), truth) == 0).all()
    # one panel (sub-images of one label) has no seam; nor does a box holding only one panel
    assert (line_labels((0, 0, 100, 80), 0, np.arange(20, 82, 2), truth) == 0).all()


def test_line_labels_count_a_panel_reaching_into_the_box() -> None:
    # the rules joined the top of a diagram (a third of it) to the image above it
    truth = [(0.0, 0.0, 200.0, 100.0), (20.0, 110.0, 180.0, 260.0)]
    offsets = np.arange(20, 142, 2)
    labels = line_labels((0, 0, 200, 160), 1, offsets, truth)
    assert set(offsets[labels == 1].tolist()) == set(range(98, 113, 2))


def labelled_pair(rng: np.random.Generator, second_label: bool, bottom: bool = False) -> np.ndarray:
    """Two dark 'fluorescence' images touching, each with a white label at its top left (at the
    bottom left when ``bottom``; the second only when ``second_label``; without it, two
    sub-images of one panel)."""
    from PIL import Image, ImageDraw

    from tests.test_segment import font

    image = np.hstack([noisy(rng, 160, 140, 20), noisy(rng, 150, 140, 70)])
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    y = 112 if bottom else 3
    draw.text((5, y), "A", fill=(255, 255, 255), font=font(20))
    if second_label:
        draw.text((165, y), "B", fill=(255, 255, 255), font=font(20))
    return np.asarray(pil).copy()


def glyph_judge() -> dict[str, object]:
    """A hand-made cut judge: cut only when both parts carry a glyph at the top left."""
    weights = np.zeros((len(seams.CUT_FEATURES), 1))
    weights[seams.CUT_FEATURES.index("glyph_a_label"), 0] = 10.0
    weights[seams.CUT_FEATURES.index("glyph_b_label"), 0] = 10.0
    return {
        "features": list(seams.CUT_FEATURES),
        "mean": [0.0] * len(seams.CUT_FEATURES),
        "scale": [1.0] * len(seams.CUT_FEATURES),
        "layers": [{"W": weights.tolist(), "b": [-15.0]}],
        "threshold": 0.5,
    }


def test_cut_features_see_the_label_of_each_part() -> None:
    rng = np.random.default_rng(6)
    names = seams.CUT_FEATURES
    for second, expected in ((True, 1.0), (False, 0.0)):
        image = labelled_pair(rng, second)
        gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        parts = [(0, 0, 160, 140), (160, 0, 310, 140)]
        seam = seams.Seam(0, 160, 0.9, np.zeros(len(FEATURE_NAMES)))
        features = seams.cut_features(gray, 10.0, (0, 0, 310, 140), 0, parts, seam)
        assert features[names.index("glyph_a_label")] == 1.0
        assert features[names.index("glyph_b_label")] == expected
        assert features[names.index("glyph_box_label")] == 1.0
        assert features[names.index("label_share")] == 0.0
        assert features[names.index("seam_logit")] == pytest.approx(np.log(9.0))


def test_label_corner_is_where_most_other_boxes_carry_a_glyph() -> None:
    tl, bl = frozenset({"tl"}), frozenset({"bl"})
    assert seams.label_corner([bl, bl, tl, frozenset()]) == ("bl", 0.5)
    # a tie, no glyphs or no other boxes: the top left
    assert seams.label_corner([bl, tl]) == ("tl", 0.5)
    assert seams.label_corner([frozenset(), frozenset()]) == ("tl", 0.0)
    assert seams.label_corner([]) == ("tl", 0.0)


def test_cut_features_read_the_figure_s_own_label_corner() -> None:
    # the pair labelled at the bottom left, above two panels labelled there too: both parts
    # carry the figure's label; with no other boxes the top left is looked at and neither does
    rng = np.random.default_rng(10)
    names = seams.CUT_FEATURES
    image = np.vstack([labelled_pair(rng, True, bottom=True), labelled_pair(rng, True, bottom=True)])
    gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    box, parts = (0, 0, 310, 140), [(0, 0, 160, 140), (160, 0, 310, 140)]
    others = [box, (0, 140, 160, 280), (160, 140, 310, 280)]
    seam = seams.Seam(0, 160, 0.9, np.zeros(len(FEATURE_NAMES)))
    seen: seams.Corners = {}
    features = seams.cut_features(gray, 10.0, box, 0, parts, seam, others, seen)
    assert features[names.index("glyph_a_label")] == 1.0
    assert features[names.index("glyph_b_label")] == 1.0
    assert features[names.index("label_share")] == 1.0
    assert seen[(0, 140, 160, 280)] == frozenset({"bl"})
    alone = seams.cut_features(gray, 10.0, box, 0, parts, seam)
    assert alone[names.index("glyph_a_label")] == 0.0 and alone[names.index("label_share")] == 0.0


def test_cut_judge_keeps_sub_images_of_one_label_together() -> None:
    rng = np.random.default_rng(7)
    lines = step_model(threshold=0.5)
    model_dict = {
        "features": list(FEATURE_NAMES),
        "mean": lines.mean.tolist(),
        "scale": lines.scale.tolist(),
        "layers": [{"W": w.tolist(), "b": b.tolist()} for w, b in lines.layers],
        "threshold": 0.5,
        "cuts": glyph_judge(),
    }
    model = SeamModel(model_dict)
    box = (0, 0, 310, 140)
    assert sorted(split_boxes(labelled_pair(rng, True), [box], model=model)) == [
        (0, 0, 160, 140),
        (160, 0, 310, 140),
    ]
    assert split_boxes(labelled_pair(rng, False), [box], model=model) == [box]
    # without the judge, the line scorer alone cuts both
    assert len(split_boxes(labelled_pair(rng, False), [box], model=lines)) == 2


def test_features_past_the_trained_range_score_as_its_edge() -> None:
    # a line scorer that learnt "more step is more seam" only up to 50, then turned down (as a
    # ReLU MLP may past its data): clipped to the range it saw, a step of 200 scores as 50
    names = list(FEATURE_NAMES)
    step = names.index("step_mean")
    model = step_model()
    layers = [
        {"W": np.eye(len(names))[:, [step, step]].tolist(), "b": [0.0, -50.0]},
        {"W": [[1.0], [-3.0]], "b": [-40.0]},
    ]
    base = {"features": names, "mean": model.mean.tolist(), "scale": model.scale.tolist(), "threshold": 0.5}
    features = np.zeros((2, len(names)))
    features[:, step] = [50.0, 200.0]
    wild = SeamModel({**base, "layers": layers}).predict(features)
    assert wild[1] < 0.01 < 0.99 < wild[0]
    low, high = [-1e9] * len(names), [1e9] * len(names)
    high[step] = 50.0
    clipped = SeamModel({**base, "layers": layers, "low": low, "high": high}).predict(features)
    assert clipped[1] == pytest.approx(clipped[0]) and clipped[0] > 0.99


def test_recurse_looks_at_both_parts_again_down_to_max_depth() -> None:
    seen: list[tuple[int, int]] = []

    def halve(box: seams.IntBox, out: list[seams.IntBox]) -> list[seams.IntBox] | None:
        seen.append((box[0], len(out)))
        x1, y1, x2, y2 = box
        return [(x1, y1, (x1 + x2) // 2, y2), ((x1 + x2) // 2, y1, x2, y2)] if x2 - x1 > 10 else None

    assert len(seams.recurse([(0, 0, 80, 10)], halve, max_depth=2)) == 4
    # the cutter sees the figure's boxes as they are when it looks (parts appended)
    assert seen[0] == (0, 1) and all(n in (2, 3) for _, n in seen[1:])
    assert sorted(seams.recurse([(0, 0, 80, 10)], halve, max_depth=5)) == [
        (x, 0, x + 10, 10) for x in range(0, 80, 10)
    ]


def test_training_walk_follows_the_true_seams_into_the_parts(tmp_path) -> None:
    from PIL import Image

    from p2p.mining.lab.train_seams import Figure, Samples, walk

    rng = np.random.default_rng(8)
    row = np.hstack([noisy(rng, 100, 80, 40), noisy(rng, 110, 80, 120), noisy(rng, 90, 80, 190)])
    image = np.full((120, 340, 3), 255, dtype=np.uint8)
    image[20:100, 20:320] = row
    path = tmp_path / "figure.png"
    Image.fromarray(image).save(path)
    truth = [(20.0, 20.0, 120.0, 100.0), (120.0, 20.0, 230.0, 100.0), (230.0, 20.0, 320.0, 100.0)]
    figure = Figure(path, [(20, 20, 320, 100)], 10.0, truth)
    samples = Samples()
    walk(figure, samples, np.random.default_rng(0))
    x, y = samples.line_data()
    others = x[:, FEATURE_NAMES.index("n_boxes")]
    # the rule box (no other boxes) and, after its cut, the part still holding two panels (one
    # other box) each show a seam
    assert (y[others == 0.0] == 1).any() and (y[others == 0.1] == 1).any()
    assert samples.cut_data()[0].shape == (0, len(seams.CUT_FEATURES))
    # with a model and the judge's samples: its best line of each box past its threshold,
    # labelled right (both cuts fall on seams)
    judged = Samples()
    walk(figure, judged, np.random.default_rng(0), step_model(), judge=True)
    cuts, right = judged.cut_data()
    assert cuts.shape == (2, len(seams.CUT_FEATURES)) and right.tolist() == [1, 1]
    assert judged.cut_weight().tolist() == [1.0, 1.0]
    # a box holding a schematic: its cuts weigh more in the judge's fit
    drawn = Samples()
    figure.kinds = ["image", "schematic", "image"]
    walk(figure, drawn, np.random.default_rng(0), step_model(), judge=True, drawing_weight=3.0)
    # the first cut's box holds all three panels, the second's the schematic and the third
    assert drawn.cut_weight().tolist() == [3.0, 3.0]
    figure.kinds = ["schematic", "image", "image"]
    drawn = Samples()
    walk(figure, drawn, np.random.default_rng(0), step_model(), judge=True, drawing_weight=3.0)
    assert sorted(drawn.cut_weight().tolist()) == [1.0, 3.0]


def test_fit_weighs_samples() -> None:
    from p2p.mining.lab.train_seams import fit

    # the same point labelled both ways: the heavier label wins
    x = np.array([[0.0, 0.0]] * 20 + [[1.0, 1.0]] * 20)
    y = np.array([1] * 10 + [0] * 10 + [1] * 10 + [0] * 10)
    weight = np.array([4.0] * 10 + [1.0] * 30)
    model = seams._Mlp(fit(x, y, ("a", "b"), (4,), weight), ("a", "b"))
    plain = seams._Mlp(fit(x, y, ("a", "b"), (4,)), ("a", "b"))
    assert model.predict(x[:1])[0] > 0.55 > plain.predict(x[:1])[0]


def test_rule_boxes_are_kept_per_folder_and_rules_version(tmp_path, monkeypatch) -> None:
    from PIL import Image

    from p2p.mining.lab import train_seams

    Image.fromarray(np.full((60, 80, 3), 255, dtype=np.uint8)).save(tmp_path / "a.png")
    calls: list[int] = []

    def rules(image: np.ndarray) -> tuple[list[seams.IntBox], float]:
        calls.append(1)
        return [(1, 2, 30, 40)], 7.0

    monkeypatch.setattr(train_seams, "_rule_boxes", rules)
    entry = {"panels": [{"box": [1, 2, 29, 39], "type": "schematic"}]}
    for _ in range(2):
        (figure,) = train_seams.rule_figures([(tmp_path / "a.png", entry)])
        assert figure.boxes == [(1, 2, 30, 40)] and figure.u == 7.0 and figure.truth == [(1, 2, 30, 40)]
        assert figure.kinds == ["schematic"]
    assert len(calls) == 1
    assert [p.name for p in tmp_path.glob("rule_boxes-*.json")] == [train_seams._rules_cache(tmp_path).name]


def test_lines_carry_the_boundary_network_strength() -> None:
    from p2p.mining.cpu.segmentation import seam_net

    rng = np.random.default_rng(9)
    image = np.hstack([noisy(rng, 120, 90, 60), noisy(rng, 140, 90, 150)])
    maps = seam_net.boundary_maps(image)
    offsets, features = line_features(image, (0, 0, 260, 90), 0, [], maps=maps)
    column = features[:, FEATURE_NAMES.index("net_strength")]
    assert np.array_equal(column, maps.line_strength((0, 0, 260, 90), 0, offsets))
    assert ((column >= 0.0) & (column <= 1.0)).all()
    # made from the figure when not given
    assert np.array_equal(line_features(image, (0, 0, 260, 90), 0, [])[1], features)
    assert split_boxes(image, [], model=step_model()) == []
