"""One figure's conversation with the model: ask, parse, repair or retry, account, fall back."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from pydantic import BaseModel

from p2p.mining.lvlm.client import CostLedger, LvlmClient, LvlmRequestError
from p2p.mining.lvlm.parse import AnswerParseError, parse_answer
from p2p.mining.lvlm.prompts import Prompt, load_prompt
from p2p.mining.lvlm.schemas import ANSWERS

log = logging.getLogger(__name__)

A = TypeVar("A", bound=BaseModel)

# A malformed answer is asked again this many times before the stage falls back to the CPU backend.
PARSE_RETRIES = 1


@dataclass
class FigureRun:
    client: LvlmClient
    ledger: CostLedger = field(default_factory=CostLedger)
    notes: list[str] = field(default_factory=list)
    # stage -> what happened: "lvlm", "lvlm-repaired", "lvlm-retried", "cpu-fallback", "skipped"
    outcomes: dict[str, str] = field(default_factory=dict)
    # Caption-grounded boxes proposed by the model and kept by the tau gate (paper mode).
    gate: dict[str, int] = field(default_factory=dict)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def outcome(self, stage: str, value: str) -> None:
        # The worst outcome of a stage's requests is what the stage reports.
        order = ("lvlm", "lvlm-repaired", "lvlm-retried", "partial-fallback", "cpu-fallback", "skipped")
        current = self.outcomes.get(stage)
        if current is None or order.index(value) > order.index(current):
            self.outcomes[stage] = value

    def fallback(self, stage: str, reason: str, *, whole_stage: bool = True) -> None:
        self.ledger.stage(stage).fallbacks += 1
        self.outcome(stage, "cpu-fallback" if whole_stage else "partial-fallback")
        self.note(f"{stage}: {reason}; CPU backend used")

    async def ask(self, stage: str, prompt_name: str, image: np.ndarray, context: str) -> BaseModel | None:
        """The validated answer, or None when the model's answers stayed unusable (the caller falls
        back). ``LvlmUnavailable`` propagates: the figure is retried later, not half-mined."""
        prompt: Prompt = load_prompt(prompt_name)
        model = ANSWERS[prompt_name]
        for attempt in range(PARSE_RETRIES + 1):
            try:
                result = await self.client.chat(prompt, image, context)
            except LvlmRequestError as exc:
                self.ledger.stage(stage).failures += 1
                log.warning("%s", exc)
                return None
            self.ledger.add(stage, result)
            try:
                answer, repairs = parse_answer(result.text, model)
            except AnswerParseError as exc:
                self.ledger.stage(stage).failures += 1
                log.info("%s: unusable answer (%s), finish_reason=%s", prompt_name, exc, result.finish_reason)
                if result.finish_reason == "length":
                    self.note(f"{prompt_name}: answer cut at the token limit ({prompt.max_tokens} tokens)")
                continue
            if repairs:
                self.ledger.stage(stage).repairs += 1
                self.outcome(stage, "lvlm-repaired")
            else:
                self.outcome(stage, "lvlm-retried" if attempt else "lvlm")
            return answer
        return None
