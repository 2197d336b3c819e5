"""What each prompt asks the model to answer, as pydantic models.

The JSON schema of each answer goes to vLLM's structured-output field; the same model validates
what comes back (after ``parse.extract_json`` has dug the JSON out of whatever text arrived).
Boxes are ``[x1, y1, x2, y2]`` in the pixel frame of the image the model was shown.
Validation is lenient where models are sloppy (a box as a dict or as strings, a label with
parentheses) and strict where it matters (four finite numbers per box).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _coerce_box(value: Any) -> list[float]:
    if isinstance(value, dict):
        keys = ("x1", "y1", "x2", "y2")
        if all(k in value for k in keys):
            value = [value[k] for k in keys]
        elif all(k in value for k in ("x", "y", "w", "h")):
            x, y, w, h = (float(value[k]) for k in ("x", "y", "w", "h"))
            value = [x, y, x + w, y + h]
        else:
            raise ValueError(f"a box needs x1, y1, x2, y2; got keys {sorted(value)}")
    if isinstance(value, str):
        value = re.findall(r"-?\d+(?:\.\d+)?", value)
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ValueError("a box is four numbers [x1, y1, x2, y2]")
    out = [float(v) for v in value]
    if not all(math.isfinite(v) for v in out):
        raise ValueError("box coordinates must be finite")
    return out


# What models write for "this panel has no printed label".
NO_LABEL = frozenset({"none", "null", "n/a", "na", "-", "unlabeled", "unlabelled", "no label", "?"})


def _coerce_label(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip().strip("()[].:, ")
    if text.lower() in NO_LABEL:
        return None
    return text or None


BoxValue = Annotated[list[float], BeforeValidator(_coerce_box)]
LabelValue = Annotated[str | None, BeforeValidator(_coerce_label)]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PanelItem(_Answer):
    panel_id: LabelValue = None
    bbox: BoxValue
    subcaption: str = ""
    description: str = ""


class PanelsAnswer(_Answer):
    """Prompt ``panels``: decompose the (view of the) figure into panels."""

    single_panel: bool = False
    panels: list[PanelItem] = Field(default_factory=list)


class MarkerItem(_Answer):
    marker_id: str = ""
    type: str = "arrow"  # arrow, arrowhead, asterisk, star, box, circle, inset, other
    target_bbox: BoxValue
    caption: str = ""  # the caption words that speak about this marker
    description: str = ""


class MarkersAnswer(_Answer):
    """Prompt ``markers``: markers in a panel crop and the regions they point at."""

    markers: list[MarkerItem] = Field(default_factory=list)


class ObjectItem(_Answer):
    type: str = ""
    phrase: str = ""  # the caption phrase that names the object
    bbox: BoxValue
    description: str = ""


class ObjectsAnswer(_Answer):
    """Prompt ``objects``: objects the (sub)caption mentions, located in the panel crop."""

    objects: list[ObjectItem] = Field(default_factory=list)


class DescribeAnswer(_Answer):
    """Prompt ``describe``: a short description of one crop (a panel or a region)."""

    description: str


class MarkVerdict(_Answer):
    mark: int
    is_panel: bool = True
    panel_id: LabelValue = None
    bbox: BoxValue | None = None  # the model's own box for the panel the mark stands for


class VerifyPanelsAnswer(_Answer):
    """Prompt ``verify_panels`` (hybrid): judge numbered candidate panels drawn on the figure."""

    marks: list[MarkVerdict] = Field(default_factory=list)
    missing_panels: int = 0  # panels the model sees that no mark covers


class MarkDescription(_Answer):
    mark: int
    keep: bool = True  # region marks: is it a real marker-indicated structure
    description: str = ""


class DescribeMarksAnswer(_Answer):
    """Prompt ``describe_marks`` (hybrid): one short description per numbered mark."""

    descriptions: list[MarkDescription] = Field(default_factory=list)


ANSWERS: dict[str, type[_Answer]] = {
    "panels": PanelsAnswer,
    "markers": MarkersAnswer,
    "objects": ObjectsAnswer,
    "describe": DescribeAnswer,
    "verify_panels": VerifyPanelsAnswer,
    "describe_marks": DescribeMarksAnswer,
}


def answer_schema(prompt: str) -> dict[str, Any]:
    """JSON schema of a prompt's answer, titled with the prompt name."""
    schema = ANSWERS[prompt].model_json_schema()
    schema["title"] = prompt
    return schema
