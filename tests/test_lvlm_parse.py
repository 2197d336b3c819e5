"""Defensive parsing of model answers: JSON extraction with repairs, lenient validation."""

from __future__ import annotations

import pytest

from p2p.mining.lvlm.parse import AnswerParseError, extract_json, parse_answer
from p2p.mining.lvlm.schemas import DescribeAnswer, PanelsAnswer, VerifyPanelsAnswer

CLEAN = '{"panels": [{"panel_id": "a", "bbox": [1, 2, 30, 40]}]}'


def test_clean_json_needs_no_repair():
    assert extract_json(CLEAN) == ({"panels": [{"panel_id": "a", "bbox": [1, 2, 30, 40]}]}, [])


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "```\n{}\n```", "```JSON {} ```"])
def test_code_fences_with_and_without_language(fence):
    value, repairs = extract_json("Here is the answer:\n" + fence.replace("{}", CLEAN) + "\nDone.")
    assert value["panels"][0]["panel_id"] == "a"
    assert repairs == ["code fence"]


def test_prose_before_and_after_the_first_complete_value():
    text = f"Sure! I found one panel [see below]: {CLEAN} Let me know {{if}} you need more."
    value, repairs = extract_json(text)
    assert value["panels"][0]["bbox"] == [1, 2, 30, 40]
    assert repairs == ["leading text", "trailing text"]


def test_single_quotes_and_apostrophes_in_both_kinds_of_strings():
    text = (
        "{'panels': [{'panel_id': 'a', 'subcaption': 'the cell's nucleus', "
        + """"description": "don't 'quote' me"}]}"""
    )
    value, repairs = extract_json(text)
    panel = value["panels"][0]
    assert panel["subcaption"] == "the cell's nucleus"
    assert panel["description"] == "don't 'quote' me"
    assert repairs == ["single quotes"]


def test_python_literals_and_trailing_commas():
    value, repairs = extract_json('{"single_panel": True, "x": None, "y": False, "panels": [1, 2,],}')
    assert value == {"single_panel": True, "x": None, "y": False, "panels": [1, 2]}
    assert repairs == ["python literals", "trailing comma"]


def test_python_literal_words_inside_strings_are_left_alone():
    value, repairs = extract_json('{"caption": "None of the True cells"}')
    assert value == {"caption": "None of the True cells"}
    assert repairs == []


def test_missing_commas_between_elements_and_unquoted_keys():
    value, repairs = extract_json('[{panel_id: "a"}\n{panel_id: "b"}]')
    assert value == [{"panel_id": "a"}, {"panel_id": "b"}]
    assert set(repairs) == {"unquoted keys", "missing comma"}


TRUNK = '{"panels": [{"panel_id": "a", "bbox": [1, 2, 3, 4]}, {"panel_id": "b", "bbox": [5, 6, 7, 8]}, '


@pytest.mark.parametrize(
    ("tail", "last"),
    [
        ('{"panel_id": "c", "subcaption": "Western bl', {"panel_id": "c", "subcaption": "Western bl"}),
        ('{"panel_id": "c", "bbox": [9, 10', {"panel_id": "c", "bbox": [9]}),
        ('{"panel_id": "c", "sub', {"panel_id": "c"}),
        ('{"panel_id": "c", "subcaption":', {"panel_id": "c"}),
        ('{"panel_id": "c",', {"panel_id": "c"}),
        ('{"pan', None),
        ("", None),
    ],
)
def test_truncated_lists_keep_every_complete_element(tail, last):
    value, repairs = extract_json(TRUNK + tail)
    assert "truncated" in repairs
    panels = value["panels"]
    assert panels[:2] == [
        {"panel_id": "a", "bbox": [1, 2, 3, 4]},
        {"panel_id": "b", "bbox": [5, 6, 7, 8]},
    ]
    assert panels[2:] == ([] if last is None else [last])


def test_truncated_inside_an_escape_still_parses():
    value, _ = extract_json('{"description": "a \\"quoted')
    assert value == {"description": 'a "quoted'}
    value, _ = extract_json('{"description": "x\\u00')
    assert value == {"description": "x"}


@pytest.mark.parametrize(
    "text", ["", "   \n ", "I could not find any panels in this figure.", "{not json at all}"]
)
def test_answers_without_json_raise(text):
    with pytest.raises(AnswerParseError):
        extract_json(text)


def test_empty_answer_error_says_so():
    with pytest.raises(AnswerParseError, match="empty"):
        extract_json("  ")
    with pytest.raises(AnswerParseError, match="no JSON"):
        extract_json("No panels.")


def test_parse_answer_validates_and_coerces():
    answer, repairs = parse_answer("```json\n" + CLEAN + "\n```", PanelsAnswer)
    assert isinstance(answer, PanelsAnswer)
    assert answer.panels[0].bbox == [1.0, 2.0, 30.0, 40.0]
    assert repairs == ["code fence"]


def test_a_top_level_list_is_wrapped_into_the_single_list_field():
    answer, repairs = parse_answer('[{"panel_id": "(b)", "bbox": [0, 0, 10, 10]}]', PanelsAnswer)
    assert isinstance(answer, PanelsAnswer)
    assert answer.panels[0].panel_id == "b"
    assert "wrapped list in 'panels'" in repairs


def test_invalid_items_are_dropped_not_the_whole_answer():
    text = (
        '{"panels": [{"panel_id": "a", "bbox": [0, 0, 10, 10]}, {"panel_id": "b", "bbox": [1, 2]},'
        ' {"panel_id": "c", "bbox": "5, 5, 20, 20"}, {"panel_id": "d"}]}'
    )
    answer, repairs = parse_answer(text, PanelsAnswer)
    assert isinstance(answer, PanelsAnswer)
    assert [p.panel_id for p in answer.panels] == ["a", "c"]
    assert repairs[0].startswith("dropped 2 of 4 panels: ")


def test_truncated_answer_keeps_complete_panels_and_drops_the_cut_one():
    answer, repairs = parse_answer(TRUNK + '{"panel_id": "c", "bbox": [9, 10', PanelsAnswer)
    assert isinstance(answer, PanelsAnswer)
    assert [p.panel_id for p in answer.panels] == ["a", "b"]
    assert repairs[0] == "truncated"
    assert repairs[1].startswith("dropped 1 of 3 panels")


def test_null_list_takes_the_default():
    answer, _ = parse_answer('{"single_panel": true, "panels": null}', PanelsAnswer)
    assert isinstance(answer, PanelsAnswer)
    assert answer.single_panel and answer.panels == []


def test_other_answer_models():
    answer, _ = parse_answer(
        "{'marks': [{'mark': 1, 'is_panel': False}], 'missing_panels': 2}", VerifyPanelsAnswer
    )
    assert isinstance(answer, VerifyPanelsAnswer)
    assert answer.marks[0].is_panel is False and answer.missing_panels == 2
    answer, _ = parse_answer('The crop shows: {"description": "H&E stained liver section"}', DescribeAnswer)
    assert isinstance(answer, DescribeAnswer)
    assert answer.description == "H&E stained liver section"


def test_nothing_usable_raises():
    with pytest.raises(AnswerParseError, match="DescribeAnswer"):
        parse_answer('{"text": "a liver"}', DescribeAnswer)
    with pytest.raises(AnswerParseError, match="none of the 2 panels"):
        parse_answer('{"panels": [{"bbox": [1]}, {"bbox": null}]}', PanelsAnswer)
    with pytest.raises(AnswerParseError, match="list"):
        parse_answer('[{"description": "x"}]', DescribeAnswer)
    with pytest.raises(AnswerParseError):
        parse_answer("no idea", PanelsAnswer)
