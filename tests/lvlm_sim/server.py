"""A simulated OpenAI-compatible vLLM server that answers the LVLM mining prompts from ground truth.

Test double only: it recognises synthetic figures by caption, locates the image it receives in the
figure (see ``locate``) and answers each prompt from the figure's ground truth, in the pixel frame
of the image received, with configurable imperfections (see ``faults``).

Endpoints: ``POST /v1/chat/completions``, ``GET /health``, ``GET /v1/models``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import math
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from PIL import Image
from starlette.types import Receive, Scope, Send

from p2p.shared.geometry import iou
from tests.lvlm_sim.faults import SimFaults, chance, damage_text, dump, jitter_box, other_label
from tests.lvlm_sim.locate import Placement
from tests.lvlm_sim.registry import Figure, GtMarker, GtPanel, Registry, normalize_caption

Box = tuple[float, float, float, float]

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-72B-Instruct"
TASKS = ("panels", "markers", "objects", "describe", "verify_panels", "describe_marks")
BOX_KEYS = ("bbox", "target_bbox")
MARK_LINE = re.compile(r"^(\d+)\s+(panel|region)\s+\[([^\]]*)\](?::\s?(.*))?$")


# -- statistics --------------------------------------------------------------------------------------


@dataclass
class SimStats:
    requests: Counter[str] = field(default_factory=Counter)  # by prompt name ("?" if unknown)
    status_codes: Counter[int] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    dropped: int = 0  # connections closed abruptly (die_after)
    truncated: int = 0  # answers cut by max_tokens
    malformed: Counter[str] = field(default_factory=Counter)
    located: int = 0
    unlocated: int = 0  # known figure, image not found in it
    unknown_figures: int = 0  # caption matched no figure
    hallucinated_objects: list[dict[str, Any]] = field(default_factory=list)  # figure coordinates

    def reset(self) -> None:
        in_flight = self.in_flight
        fresh = SimStats()
        for name in fresh.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        self.in_flight = in_flight
        self.max_in_flight = in_flight

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


# -- requests ----------------------------------------------------------------------------------------


class BadRequest(Exception):
    pass


@dataclass
class Mark:
    number: int
    kind: str
    box: Box  # received frame
    text: str


@dataclass
class Parsed:
    task: str
    prompt_text: str  # system + user text, for token counting
    image: np.ndarray | None
    digest: str
    size: tuple[int, int]  # received image (w, h)
    caption: str | None
    subcaption: str | None
    marks: list[Mark]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _image_url_of(content: Any) -> str | None:
    if not isinstance(content, list):
        return None
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            url = part.get("image_url")
            return str(url.get("url")) if isinstance(url, dict) else str(url)
    return None


def parse_request(body: dict[str, Any]) -> Parsed:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    system = next((m for m in messages if isinstance(m, dict) and m.get("role") == "system"), None)
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    system_text = _text_of(system.get("content")) if system else ""
    user_content = users[-1].get("content") if users else None
    user_text = _text_of(user_content)
    first = system_text.strip().splitlines()[0].strip() if system_text.strip() else ""
    match = re.fullmatch(r"Task:\s*([a-z_]+)\.?", first)
    task = match.group(1) if match else "?"
    image: np.ndarray | None = None
    digest = ""
    url = _image_url_of(user_content)
    if url is not None:
        if not url.startswith("data:") or "," not in url:
            raise BadRequest("only data: image URLs are supported")
        try:
            raw = base64.b64decode(url.split(",", 1)[1], validate=False)
            image = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
        except (binascii.Error, OSError, ValueError) as exc:
            raise BadRequest(f"cannot decode image: {exc}") from exc
        digest = hashlib.sha1(raw).hexdigest()
    size = (int(image.shape[1]), int(image.shape[0])) if image is not None else (0, 0)
    caption = subcaption = None
    marks: list[Mark] = []
    in_marks = False
    for line in user_text.splitlines():
        if line.startswith("Caption: "):
            caption = normalize_caption(line[len("Caption: ") :])
        elif line.startswith("Subcaption: "):
            subcaption = line[len("Subcaption: ") :]
        elif line.strip() == "Marks:":
            in_marks = True
        elif in_marks:
            m = MARK_LINE.match(line.strip())
            if m:
                nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", m.group(3))]
                if len(nums) == 4:
                    box = (nums[0], nums[1], nums[2], nums[3])
                    marks.append(Mark(int(m.group(1)), m.group(2), box, m.group(4) or ""))
    return Parsed(task, system_text + user_text, image, digest, size, caption, subcaption, marks)


# -- answers -----------------------------------------------------------------------------------------


def empty_answer(task: str, marks: list[Mark] | None = None) -> dict[str, Any]:
    if task == "panels":
        return {"single_panel": False, "panels": []}
    if task == "markers":
        return {"markers": []}
    if task == "objects":
        return {"objects": []}
    if task == "verify_panels":
        return {"marks": [], "missing_panels": 0}
    if task == "describe_marks":
        return {
            "descriptions": [
                {"mark": m.number, "keep": True, "description": "A part of a biomedical figure."}
                for m in marks or []
            ]
        }
    return {"description": "A crop of a biomedical figure."}


def _strip_label(text: str) -> str:
    return re.sub(r"^\s*\([^)]{1,12}\)\s*", "", text).strip()


def _words(text: str, n: int) -> str:
    words = _strip_label(text).split()
    return " ".join(words[:n]).rstrip(".,;:")


def panel_description(panel: GtPanel) -> str:
    kind = f"{panel.type} panel" + (f" ({panel.modality})" if panel.modality else "")
    words = _words(panel.subcaption, 6)
    return f"{kind}: {words}." if words else f"{kind}."


def marker_description(marker: GtMarker) -> str:
    what = marker.text or "a structure"
    return f"{what} indicated by the {marker.kind}"


def _inside(box: Box, view: Box, tol: float) -> bool:
    return (
        box[0] >= view[0] - tol
        and box[1] >= view[1] - tol
        and box[2] <= view[2] + tol
        and box[3] <= view[3] + tol
    )


def _point_in(point: tuple[float, float], box: Box) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def _overlap(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _area(b: Box) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def _random_box(view: Box, rng: random.Random, lo: float, hi: float) -> Box:
    vw, vh = view[2] - view[0], view[3] - view[1]
    w, h = vw * rng.uniform(lo, hi), vh * rng.uniform(lo, hi)
    x1 = view[0] + rng.uniform(0, max(0.0, vw - w))
    y1 = view[1] + rng.uniform(0, max(0.0, vh - h))
    return (x1, y1, x1 + w, y1 + h)


def _tolerance(placement: Placement) -> float:
    return 2.0 + 1.5 / min(placement.sx, placement.sy)


def _panel_at(figure: Figure, view: Box) -> GtPanel | None:
    scored = [(_overlap(p.box, view), p) for p in figure.panels]
    scored = [s for s in scored if s[0] > 0]
    return max(scored, key=lambda s: s[0])[1] if scored else None


class AnswerBuilder:
    """Builds one answer in figure coordinates (boxes are rendered into a frame afterwards)."""

    def __init__(
        self, figure: Figure, placement: Placement, parsed: Parsed, faults: SimFaults, rng: random.Random
    ) -> None:
        self.figure = figure
        self.placement = placement
        self.parsed = parsed
        self.faults = faults
        self.rng = rng
        self.view = placement.view
        self.tol = _tolerance(placement)
        self.hallucinated: list[dict[str, Any]] = []

    def build(self, task: str) -> dict[str, Any]:
        result: dict[str, Any] = getattr(self, f"_{task}")()
        return result

    # faults shared by the box answers
    def _keep(self) -> bool:
        return not chance(self.rng, self.faults.miss_rate)

    def _box(self, box: Box) -> Box:
        if chance(self.rng, self.faults.jitter_rate) and self.faults.jitter_scale > 0:
            return jitter_box(box, self.faults.jitter_scale, self.rng)
        return box

    def _panels(self) -> dict[str, Any]:
        labels = [p.label for p in self.figure.panels]
        items: list[dict[str, Any]] = []
        for panel in self.figure.panels:
            if not _inside(panel.box, self.view, self.tol) or not self._keep():
                continue
            label = panel.label
            if chance(self.rng, self.faults.wrong_label_rate):
                label = other_label(label, labels, self.rng)
            items.append(
                {
                    "panel_id": label,
                    "bbox": self._box(panel.box),
                    "subcaption": panel.subcaption,
                    "description": panel_description(panel),
                }
            )
        if "panels" in self.faults.hallucinate_tasks and chance(self.rng, self.faults.hallucinate_rate):
            used = {str(i["panel_id"]) for i in items} | set(labels)
            fake = next((c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used), "Z")
            items.append(
                {
                    "panel_id": fake,
                    "bbox": _random_box(self.view, self.rng, 0.2, 0.5),
                    "subcaption": "",
                    "description": "image panel.",
                }
            )
        return {"single_panel": len(items) == 1, "panels": items}

    def _markers_in_view(self) -> list[GtMarker]:
        found = [m for m in self.figure.markers if _point_in(m.target_point, self.view)]
        return sorted(found, key=lambda m: (round(m.target_box[1] / 20), m.target_box[0]))

    def _markers(self) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for marker in self._markers_in_view():
            if not self._keep():
                continue
            items.append(
                {
                    "marker_id": "",
                    "type": marker.kind,
                    "target_bbox": self._box(marker.target_box),
                    "caption": marker.text or "",
                    "description": marker_description(marker),
                }
            )
        if "markers" in self.faults.hallucinate_tasks and chance(self.rng, self.faults.hallucinate_rate):
            items.append(
                {
                    "marker_id": "",
                    "type": self.rng.choice(["arrow", "arrowhead", "asterisk", "star", "box"]),
                    "target_bbox": _random_box(self.view, self.rng, 0.05, 0.15),
                    "caption": "",
                    "description": "a structure",
                }
            )
        for i, item in enumerate(items, start=1):
            item["marker_id"] = f"m{i}"
        return {"markers": items}

    def _objects(self) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for marker in self._markers_in_view():
            if not marker.text or not self._keep():
                continue
            items.append(
                {
                    "type": marker.text.split()[-1],
                    "phrase": marker.text,
                    "bbox": self._box(marker.target_box),
                    "description": marker_description(marker),
                }
            )
        if "objects" in self.faults.hallucinate_tasks and chance(self.rng, self.faults.hallucinate_rate):
            box = _random_box(self.view, self.rng, 0.05, 0.2)
            phrase = self._random_phrase()
            panel = _panel_at(self.figure, box)
            self.hallucinated.append(
                {
                    "figure": self.figure.name,
                    "panel": panel.label if panel else None,
                    "box": [round(v, 2) for v in box],
                    "phrase": phrase,
                }
            )
            items.append(
                {"type": phrase.split()[-1], "phrase": phrase, "bbox": box, "description": "a hallucination"}
            )
        return {"objects": items}

    def _random_phrase(self) -> str:
        texts = [m.text for m in self.figure.markers if m.text]
        if texts and self.rng.random() < 0.5:
            return self.rng.choice(texts)
        words = re.findall(r"[A-Za-z][A-Za-z-]{2,}", self.parsed.subcaption or self.figure.caption)
        if len(words) < 2:
            return "cells"
        start = self.rng.randrange(0, len(words) - 1)
        return " ".join(words[start : start + self.rng.choice([1, 2, 3])])

    def _describe(self) -> dict[str, Any]:
        view = self.view
        for marker in self.figure.markers:
            t = marker.target_box
            if _overlap(t, view) > 0.5 * _area(t) and _area(view) <= 6.0 * max(_area(t), 1.0):
                return {"description": f"A region showing {marker_description(marker)}."}
        panel = _panel_at(self.figure, view)
        if panel is None:
            return {"description": "A crop of a biomedical figure with no panel content."}
        return {"description": f"A {panel_description(panel)}"}

    def _verify_panels(self) -> dict[str, Any]:
        labels = [p.label for p in self.figure.panels]
        matched: set[str] = set()
        verdicts: list[dict[str, Any]] = []
        for mark in self.parsed.marks:
            fbox = self.placement.to_figure(mark.box)
            best = max(self.figure.panels, key=lambda p: iou(p.box, fbox), default=None)
            if best is not None and iou(best.box, fbox) >= 0.5:
                matched.add(best.label)
                label = best.label
                if chance(self.rng, self.faults.wrong_label_rate):
                    label = other_label(label, labels, self.rng)
                verdict = {
                    "mark": mark.number,
                    "is_panel": True,
                    "panel_id": label,
                    "bbox": self._box(best.box),
                }
            else:
                verdict = {"mark": mark.number, "is_panel": False, "panel_id": None, "bbox": None}
            if self._keep():
                verdicts.append(verdict)
        missing = [
            p for p in self.figure.panels if p.label not in matched and _inside(p.box, self.view, self.tol)
        ]
        return {"marks": verdicts, "missing_panels": len(missing)}

    def _describe_marks(self) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for mark in self.parsed.marks:
            fbox = self.placement.to_figure(mark.box)
            if mark.kind == "panel":
                best = max(self.figure.panels, key=lambda p: iou(p.box, fbox), default=None)
                if best is not None and iou(best.box, fbox) > 0:
                    text = f"A {panel_description(best)}"
                else:
                    text = "A part of the figure without a panel."
                out.append({"mark": mark.number, "keep": True, "description": text})
                continue
            hits = [
                m
                for m in self.figure.markers
                if iou(m.target_box, fbox) > 0 or _point_in(m.target_point, fbox)
            ]
            if hits:
                hit = max(hits, key=lambda m: iou(m.target_box, fbox))
                out.append(
                    {
                        "mark": mark.number,
                        "keep": True,
                        "description": f"A region showing {marker_description(hit)}.",
                    }
                )
            else:
                panel = _panel_at(self.figure, fbox)
                where = f" of panel {panel.label}" if panel else ""
                out.append(
                    {
                        "mark": mark.number,
                        "keep": False,
                        "description": f"Background{where}; no marker points here.",
                    }
                )
        return {"descriptions": out}


def render(answer: dict[str, Any], placement: Placement, frame: str) -> dict[str, Any]:
    """Boxes from figure coordinates into ``frame``: received (ints), figure (ints) or normalized."""
    rw, rh = placement.width, placement.height

    def convert(box: Box) -> list[float] | list[int]:
        view = placement.view
        box = (max(box[0], view[0]), max(box[1], view[1]), min(box[2], view[2]), min(box[3], view[3]))
        if frame == "figure":
            return [round(v) for v in box]
        u1, v1, u2, v2 = placement.to_received(box)
        u1, u2 = min(max(u1, 0.0), rw), min(max(u2, 0.0), rw)
        v1, v2 = min(max(v1, 0.0), rh), min(max(v2, 0.0), rh)
        if frame == "normalized":
            return [round(u1 / rw, 4), round(v1 / rh, 4), round(u2 / rw, 4), round(v2 / rh, 4)]
        return [round(u1), round(v1), round(u2), round(v2)]

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: convert(v) if k in BOX_KEYS and isinstance(v, tuple) else walk(v) for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result: dict[str, Any] = walk(answer)
    return result


def damage_boxes(answer: Any, faults: SimFaults, rng: random.Random, width: int, height: int) -> Any:
    """Boxes with swapped corners, or stretched past the image: what sloppy models return."""
    if isinstance(answer, dict):
        out: dict[str, Any] = {}
        for key, value in answer.items():
            if key in BOX_KEYS and isinstance(value, list) and len(value) == 4:
                x1, y1, x2, y2 = value
                if chance(rng, faults.inverted_rate):
                    x1, y1, x2, y2 = x2, y2, x1, y1
                elif chance(rng, faults.outside_rate):
                    x1, y1 = x1 - width // 2, y1 - height // 2  # off the top-left ...
                    x2, y2 = x2 + width, y2 + height  # ... and past the bottom-right
                out[key] = [x1, y1, x2, y2]
            else:
                out[key] = damage_boxes(value, faults, rng, width, height)
        return out
    if isinstance(answer, list):
        return [damage_boxes(v, faults, rng, width, height) for v in answer]
    return answer


# -- the app -----------------------------------------------------------------------------------------


class _DropConnection(Response):
    """Starts a response, then fails: the server closes the connection mid-body."""

    def __init__(self) -> None:
        super().__init__(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
        raise ConnectionAbortedError("simulated model server death")


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class SimModel:
    """The simulated model: state shared by the HTTP handlers (all run on the server's event loop)."""

    def __init__(self, registry: Registry, faults: SimFaults, model: str) -> None:
        self.registry = registry
        self.faults = faults
        self.model = model
        self.stats = SimStats()
        self.rng = random.Random(faults.seed)
        self.dead = False

    def reseed(self, seed: int | None = None) -> None:
        if seed is not None:
            self.faults.seed = seed
        self.rng = random.Random(self.faults.seed)

    def answer(self, parsed: Parsed) -> tuple[dict[str, Any], str]:
        """(answer rendered into its frame, frame name). Runs in a worker thread."""
        if parsed.task not in TASKS:
            raise BadRequest(f"unknown task {parsed.task!r}")
        if parsed.image is None or parsed.caption is None:
            return empty_answer(parsed.task, parsed.marks), "received"
        figure, placement = self.registry.identify(parsed.caption, parsed.image, parsed.digest)
        if figure is None:
            self.stats.unknown_figures += 1
            return empty_answer(parsed.task, parsed.marks), "received"
        if placement is None:
            self.stats.unlocated += 1
            return empty_answer(parsed.task, parsed.marks), "received"
        self.stats.located += 1
        builder = AnswerBuilder(figure, placement, parsed, self.faults, self.rng)
        answer = builder.build(parsed.task)
        self.stats.hallucinated_objects.extend(builder.hallucinated)
        frame = "received"
        if chance(self.rng, self.faults.wrong_frame_rate):
            frame = "figure"
        elif chance(self.rng, self.faults.normalized_rate):
            frame = "normalized"
        rendered = render(answer, placement, frame)
        if frame == "received" and (self.faults.inverted_rate or self.faults.outside_rate):
            rendered = damage_boxes(rendered, self.faults, self.rng, placement.width, placement.height)
        return rendered, frame

    async def completions(self, request: Request) -> Response:
        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        try:
            response = await self._completions(request)
        finally:
            self.stats.in_flight -= 1
        if isinstance(response, _DropConnection):
            self.stats.dropped += 1
        else:
            self.stats.status_codes[response.status_code] += 1
        return response

    def _dying(self) -> bool:
        if not self.dead and self.faults.die_after is not None and self.faults.die_after <= 0:
            self.dead = True
        return self.dead

    async def _completions(self, request: Request) -> Response:
        faults = self.faults
        if faults.down:
            return _error(503, "The model server is not ready.", "ServiceUnavailableError")
        if self._dying():
            return _DropConnection()
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "The request body is not valid JSON.", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.", "BadRequestError")
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if chance(self.rng, faults.rate_limit_rate):
            return _error(429, "Too many requests.", "RateLimitError", headers={"Retry-After": "1"})
        if chance(self.rng, faults.error_rate):
            if self.rng.random() < 0.5:
                return _error(500, "Internal server error (simulated).", "InternalServerError")
            return _error(503, "The engine is overloaded (simulated).", "ServiceUnavailableError")
        delay = faults.latency_s + (
            self.rng.uniform(0, faults.latency_jitter_s) if faults.latency_jitter_s else 0
        )
        try:
            parsed = await asyncio.to_thread(parse_request, body)
            self.stats.requests[parsed.task] += 1
            if delay > 0:
                await asyncio.sleep(delay)
            answer, _frame = await asyncio.to_thread(self.answer, parsed)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        if self._dying():
            return _DropConnection()
        if self.faults.die_after is not None:
            self.faults.die_after -= 1
        text = dump(answer)
        if chance(self.rng, faults.malformed_rate):
            text, kind = damage_text(text, faults.malformed_kinds, self.rng)
            self.stats.malformed[kind] += 1
        finish = "stop"
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(max_tokens, int) and max_tokens > 0 and len(text) > 4 * max_tokens:
            text = text[: 4 * max_tokens]
            finish = "length"
            self.stats.truncated += 1
        w, h = parsed.size
        image_tokens = math.ceil(w / 28) * math.ceil(h / 28) if parsed.image is not None else 0
        prompt_tokens = math.ceil(len(parsed.prompt_text) / 4) + image_tokens + 2
        completion_tokens = max(1, math.ceil(len(text) / 4))
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )


def create_app(sim: SimModel) -> FastAPI:
    app = FastAPI(title="lvlm-sim", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await sim.completions(request)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=503 if sim.faults.down or sim.dead else 200)

    @app.get("/v1/models")
    async def models() -> Response:
        if sim.faults.down or sim.dead:
            return _error(503, "The model server is not ready.", "ServiceUnavailableError")
        return JSONResponse(
            {"object": "list", "data": [{"id": sim.model, "object": "model", "owned_by": "vllm"}]}
        )

    return app


# -- the runner --------------------------------------------------------------------------------------


class SimServer:
    """Runs the simulated model server on 127.0.0.1 (a free port) in a background thread.

    ``faults`` is shared: change its fields at run time. ``stats`` counts what happened.
    """

    def __init__(
        self,
        folders: list[Path],
        *,
        faults: SimFaults | None = None,
        model: str = DEFAULT_MODEL,
        log_level: str = "critical",
    ) -> None:
        self.registry = Registry([Path(f) for f in folders])
        self.faults = faults if faults is not None else SimFaults()
        self.sim = SimModel(self.registry, self.faults, model)
        self.model = model
        self.log_level = log_level
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def stats(self) -> SimStats:
        return self.sim.stats

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the simulated server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def dead(self) -> bool:
        return self.sim.dead

    def revive(self) -> None:
        """Undo a ``die_after`` death (as if the server was restarted; stats are kept)."""
        self.faults.die_after = None
        self.sim.dead = False

    def reseed(self, seed: int | None = None) -> None:
        self.sim.reseed(seed)

    def warm(self) -> None:
        """Prepare every figure's locator now instead of at the first request."""
        for figure in self.registry.figures:
            figure.index()

    def start(self, timeout: float = 20.0) -> SimServer:
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            create_app(self.sim),
            log_level=self.log_level,
            access_log=False,
            http="h11",
            lifespan="off",
            backlog=2048,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"lvlm-sim-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server.started:
                try:
                    httpx.get(f"{self.url}/health", timeout=2.0)
                    return self
                except httpx.HTTPError:
                    pass
            if not self._thread.is_alive():
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("the simulated model server did not start")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
