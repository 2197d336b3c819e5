"""Async client of vLLM's OpenAI-compatible server.

One ``httpx.AsyncClient`` and one semaphore per worker process bound the requests in flight;
each request has a timeout and is retried with exponential backoff (honouring Retry-After) on
429, 5xx, timeouts and dropped connections. A server that stays unreachable raises
``LvlmUnavailable`` (a ``ConnectionError``: the mining task retries later); an answer the
server refuses (400, 422: prompt too long, bad schema) raises ``LvlmRequestError`` so the stage
falls back to the CPU backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from p2p.mining.lvlm.prompts import Prompt, build_messages
from p2p.mining.lvlm.schemas import answer_schema
from p2p.shared.settings import LvlmSettings

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class LvlmError(Exception):
    """Base of the LVLM client's errors."""


class LvlmUnavailable(LvlmError, ConnectionError):
    """The model server cannot be reached or keeps failing: retry the figure later."""


class LvlmRequestError(LvlmError):
    """The server refused the request itself: retrying the same request will not help."""


@dataclass(frozen=True)
class ChatResult:
    prompt: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    retries: int


@dataclass
class StageCost:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    retries: int = 0
    repairs: int = 0
    fallbacks: int = 0
    failures: int = 0


@dataclass
class CostLedger:
    """What one figure cost, per stage. Requests, tokens and latency come from the server's answers."""

    stages: dict[str, StageCost] = field(default_factory=dict)

    def stage(self, name: str) -> StageCost:
        return self.stages.setdefault(name, StageCost())

    def add(self, stage: str, result: ChatResult) -> None:
        cost = self.stage(stage)
        cost.requests += 1
        cost.prompt_tokens += result.prompt_tokens
        cost.completion_tokens += result.completion_tokens
        cost.latency_s += result.latency_s
        cost.retries += result.retries

    def total(self) -> StageCost:
        out = StageCost()
        for cost in self.stages.values():
            for name in vars(out):
                setattr(out, name, getattr(out, name) + getattr(cost, name))
        return out

    def as_dict(self) -> dict[str, Any]:
        def one(cost: StageCost) -> dict[str, Any]:
            return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(cost).items()}

        return {
            **one(self.total()),
            "stages": {name: one(cost) for name, cost in sorted(self.stages.items())},
        }


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    reason: str = ""
    models: tuple[str, ...] = ()


class LvlmClient:
    """Create it inside the event loop that will use it (the semaphore and pool bind to that loop)."""

    def __init__(self, settings: LvlmSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not settings.base_url:
            raise ValueError("LVLM client needs a server URL (P2P_MINING__LVLM__BASE_URL)")
        self.settings = settings
        self.root = settings.base_url.rstrip("/").removesuffix("/v1")
        headers = {}
        if settings.api_key is not None and settings.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._http = httpx.AsyncClient(
            base_url=self.root,
            headers=headers,
            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=settings.max_in_flight, max_keepalive_connections=settings.max_in_flight
            ),
            transport=transport,
        )
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._healthy_until = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> HealthReport:
        """The server is up (``/health``) and serves the configured model (``/v1/models``)."""
        try:
            response = await self._http.get("/health", timeout=self.settings.connect_timeout_s)
            if response.status_code != 200:
                return HealthReport(False, f"/health answered {response.status_code}")
            listed = await self._http.get("/v1/models", timeout=self.settings.connect_timeout_s)
            listed.raise_for_status()
            models = tuple(str(m.get("id")) for m in listed.json().get("data", []))
        except (httpx.HTTPError, ValueError) as exc:
            return HealthReport(False, f"{type(exc).__name__}: {exc}")
        if self.settings.model not in models:
            return HealthReport(
                False, f"server does not serve {self.settings.model!r} (it has {list(models)})"
            )
        return HealthReport(True, models=models)

    async def ensure_healthy(self) -> None:
        """Called before a figure is taken: a good check counts for ``health_interval_s``."""
        if time.monotonic() < self._healthy_until:
            return
        report = await self.health()
        if not report.ok:
            raise LvlmUnavailable(f"model server at {self.root} is not ready: {report.reason}")
        self._healthy_until = time.monotonic() + self.settings.health_interval_s

    def payload(self, prompt: Prompt, image: np.ndarray, context: str, max_tokens: int) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": build_messages(prompt, image, context),
            "max_tokens": max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "repetition_penalty": s.repetition_penalty,
        }
        schema = answer_schema(prompt.name)
        if s.structured_output == "structured_outputs":
            body["structured_outputs"] = {"json": schema}
        elif s.structured_output == "guided_json":
            body["guided_json"] = schema
        elif s.structured_output == "response_format":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": prompt.name, "schema": schema},
            }
        return body

    def max_tokens_for(self, prompt: Prompt) -> int:
        override = self.settings.max_tokens_by_prompt.get(prompt.name)
        return override if override is not None else max(prompt.max_tokens, self.settings.max_tokens)

    async def chat(self, prompt: Prompt, image: np.ndarray, context: str) -> ChatResult:
        body = self.payload(prompt, image, context, self.max_tokens_for(prompt))
        retries = 0
        while True:
            async with self._slots:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                started = time.perf_counter()
                try:
                    response = await self._http.post("/v1/chat/completions", json=body)
                    error: str | None = None
                except httpx.TransportError as exc:  # connect/read errors and timeouts
                    response, error = None, f"{type(exc).__name__}: {exc}"
                finally:
                    self.in_flight -= 1
                latency = time.perf_counter() - started
            if response is not None and response.status_code == 200:
                return _chat_result(prompt.name, response, latency, retries)
            if response is not None and response.status_code not in RETRY_STATUSES:
                raise LvlmRequestError(
                    f"{prompt.name}: server answered {response.status_code}: {response.text[:300]}"
                )
            reason = error or f"HTTP {response.status_code if response is not None else '?'}"
            if retries >= self.settings.max_retries:
                self._healthy_until = 0.0  # the next figure checks health again before starting
                raise LvlmUnavailable(f"{prompt.name}: gave up after {retries + 1} attempts: {reason}")
            delay = self._backoff(retries, response)
            log.info("%s: %s; retry %d in %.2f s", prompt.name, reason, retries + 1, delay)
            retries += 1
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int, response: httpx.Response | None) -> float:
        s = self.settings
        delay = min(s.backoff_max_s, s.backoff_s * (2**attempt)) * random.uniform(0.5, 1.0)
        if response is not None and "retry-after" in response.headers:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(response.headers["retry-after"]), s.backoff_max_s))
        return delay


def _chat_result(prompt: str, response: httpx.Response, latency: float, retries: int) -> ChatResult:
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice.get("message", {}).get("content") or ""
        usage = data.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        # A 200 without a usable body is an answer we could not read: the stage falls back.
        raise LvlmRequestError(f"{prompt}: unreadable completion body: {exc}") from exc
    return ChatResult(
        prompt=prompt,
        text=str(text),
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        latency_s=latency,
        retries=retries,
    )
