"""Prompts as versioned files, and the request messages built from them.

Each file in ``prompt_files/`` starts with ``# name:``, ``# version:`` and ``# max_tokens:`` header
lines, then the fixed instructions. The instructions go first and alone in the system message so
vLLM's prefix cache can reuse them across figures; the per-figure context (image size, title,
abstract, caption, marks) follows in the user message after the image.
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.types import FigureContext as FigureContext  # its home is the miners' seam

PROMPT_NAMES = ("panels", "markers", "objects", "describe", "verify_panels", "describe_marks")


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    max_tokens: int
    instructions: str

    @property
    def tag(self) -> str:
        """What is stored with every result: name, file version and a digest of the text."""
        digest = hashlib.sha256(self.instructions.encode()).hexdigest()[:8]
        return f"{self.name}@{self.version}+{digest}"


def parse_prompt_file(text: str) -> Prompt:
    header: dict[str, str] = {}
    lines = text.splitlines()
    body_start = 0
    for i, line in enumerate(lines):
        if not line.startswith("# "):
            body_start = i
            break
        key, _, value = line[2:].partition(":")
        header[key.strip()] = value.strip()
    missing = {"name", "version", "max_tokens"} - header.keys()
    if missing:
        raise ValueError(f"prompt file lacks header lines: {', '.join(sorted(missing))}")
    return Prompt(
        name=header["name"],
        version=header["version"],
        max_tokens=int(header["max_tokens"]),
        instructions="\n".join(lines[body_start:]).strip() + "\n",
    )


@cache
def load_prompt(name: str) -> Prompt:
    if name not in PROMPT_NAMES:
        raise KeyError(f"unknown prompt {name!r}")
    text = resources.files("p2p.mining.lvlm").joinpath("prompt_files", f"{name}.txt").read_text("utf-8")
    prompt = parse_prompt_file(text)
    if prompt.name != name:
        raise ValueError(f"prompt_files/{name}.txt declares name {prompt.name!r}")
    return prompt


def prompt_versions() -> dict[str, str]:
    return {name: load_prompt(name).tag for name in PROMPT_NAMES}


@dataclass(frozen=True)
class Mark:
    number: int
    kind: str  # "panel" or "region"
    box: tuple[float, float, float, float]  # in the frame of the image sent
    text: str = ""


def build_context(
    context: FigureContext,
    *,
    image_size: tuple[int, int],
    subcaption: str | None = None,
    marks: list[Mark] | None = None,
    abstract_chars: int = 1200,
) -> str:
    """The user text after the image. Line prefixes are fixed: they are part of the protocol."""
    width, height = image_size
    lines = [f"Image: {width}x{height} pixels."]
    if context.title:
        lines.append(f"Title: {_one_line(context.title)}")
    if context.abstract:
        lines.append(f"Abstract: {_one_line(context.abstract)[:abstract_chars]}")
    lines.append(f"Caption: {_one_line(context.caption)}")
    if subcaption is not None:
        lines.append(f"Subcaption: {_one_line(subcaption)}")
    if marks:
        lines.append("Marks:")
        for mark in marks:
            box = ", ".join(str(round(v)) for v in mark.box)
            text = f": {_one_line(mark.text)}" if mark.text else ""
            lines.append(f"{mark.number} {mark.kind} [{box}]{text}")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def image_data_url(image: np.ndarray, *, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    pil = Image.fromarray(np.ascontiguousarray(image))
    if fmt == "JPEG":
        pil.save(buffer, format="JPEG", quality=92)
        mime = "image/jpeg"
    else:
        pil.save(buffer, format="PNG", compress_level=1)
        mime = "image/png"
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def build_messages(prompt: Prompt, image: np.ndarray, context_text: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": prompt.instructions},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_data_url(image)}},
                {"type": "text", "text": context_text},
            ],
        },
    ]
