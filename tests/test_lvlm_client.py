"""The vLLM client: request shape, retries, backoff, health, in-flight bound.

The model server is replaced here by httpx's MockTransport (the server is external; this is the
test double); end-to-end behaviour against the simulated server lives in test_lvlm_miner.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from p2p.mining.lvlm.client import CostLedger, LvlmClient, LvlmRequestError, LvlmUnavailable
from p2p.mining.lvlm.prompts import load_prompt
from p2p.shared.settings import LvlmSettings

IMAGE = np.zeros((56, 56, 3), dtype=np.uint8)
MODEL = "Qwen/Qwen2.5-VL-72B-Instruct"


def _settings(**overrides: Any) -> LvlmSettings:
    base: dict[str, Any] = {"base_url": "http://vllm.test:8000", "backoff_s": 0.001, "backoff_max_s": 0.01}
    return LvlmSettings(**{**base, **overrides})


def _completion(text: str = '{"description": "x"}') -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127},
    }


def _run(settings: LvlmSettings, handler: Any, body: Any) -> Any:
    async def main() -> Any:
        client = LvlmClient(settings, transport=httpx.MockTransport(handler))
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_request_carries_schema_sampling_defaults_image_and_key() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(
            {
                "url": str(request.url),
                "auth": request.headers.get("authorization"),
                **json.loads(request.content),
            }
        )
        return httpx.Response(200, json=_completion())

    settings = _settings(api_key=SecretStr("k-123"), base_url="http://vllm.test:8000/v1")
    result = _run(settings, handler, lambda c: c.chat(load_prompt("describe"), IMAGE, "Caption: x"))
    body = seen[0]
    assert body["url"] == "http://vllm.test:8000/v1/chat/completions"
    assert body["auth"] == "Bearer k-123"
    assert body["model"] == MODEL
    assert (body["temperature"], body["top_p"], body["top_k"], body["repetition_penalty"]) == (
        0.2,
        0.9,
        50,
        1.05,
    )
    assert body["max_tokens"] == 128  # the paper's budget for a short answer
    assert body["structured_outputs"]["json"]["title"] == "describe"
    system, user = body["messages"]
    assert system["role"] == "system" and system["content"].startswith("Task: describe.")
    assert user["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert user["content"][1] == {"type": "text", "text": "Caption: x"}  # context after the image
    assert (result.prompt_tokens, result.completion_tokens, result.retries) == (120, 7, 0)


def test_prompt_files_ask_larger_budgets_where_needed_and_settings_override() -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["max_tokens"])
        return httpx.Response(200, json=_completion('{"panels": []}'))

    _run(_settings(), handler, lambda c: c.chat(load_prompt("panels"), IMAGE, ""))
    _run(
        _settings(max_tokens_by_prompt={"panels": 300}),
        handler,
        lambda c: c.chat(load_prompt("panels"), IMAGE, ""),
    )
    assert seen == [load_prompt("panels").max_tokens, 300]
    assert seen[0] > 128


@pytest.mark.parametrize(
    ("field", "expected_key"),
    [("guided_json", "guided_json"), ("response_format", "response_format"), ("none", None)],
)
def test_structured_output_field_is_configurable(field: str, expected_key: str | None) -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=_completion())

    _run(_settings(structured_output=field), handler, lambda c: c.chat(load_prompt("describe"), IMAGE, ""))
    keys = {"structured_outputs", "guided_json", "response_format"} & seen[0].keys()
    assert keys == ({expected_key} if expected_key else set())


def test_429_and_503_are_retried_with_retry_after_then_succeed() -> None:
    statuses = iter([429, 503, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(statuses)
        if status != 200:
            return httpx.Response(status, headers={"Retry-After": "0"}, json={"error": {"message": "busy"}})
        return httpx.Response(200, json=_completion())

    result = _run(_settings(), handler, lambda c: c.chat(load_prompt("describe"), IMAGE, ""))
    assert result.retries == 2


def test_connection_errors_exhaust_retries_into_unavailable() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(LvlmUnavailable, match="gave up after 3 attempts"):
        _run(_settings(max_retries=2), handler, lambda c: c.chat(load_prompt("describe"), IMAGE, ""))
    assert calls == 3
    assert issubclass(LvlmUnavailable, ConnectionError)  # the Celery task retries it as transient


def test_a_refused_request_is_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(400, json={"error": {"message": "prompt too long"}})

    with pytest.raises(LvlmRequestError, match="400"):
        _run(_settings(), handler, lambda c: c.chat(load_prompt("describe"), IMAGE, ""))
    assert calls == 1


def test_health_needs_the_server_and_the_configured_model() -> None:
    def serving(models: list[str], health: int = 200) -> Any:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/health":
                return httpx.Response(health)
            return httpx.Response(200, json={"data": [{"id": m} for m in models]})

        return handler

    ok = _run(_settings(), serving([MODEL]), lambda c: c.health())
    assert ok.ok and ok.models == (MODEL,)
    wrong = _run(_settings(), serving(["other/model"]), lambda c: c.health())
    assert not wrong.ok and "other/model" in wrong.reason
    down = _run(_settings(), serving([MODEL], health=503), lambda c: c.health())
    assert not down.ok and "503" in down.reason
    with pytest.raises(LvlmUnavailable, match="not ready"):
        _run(_settings(), serving([MODEL], health=503), lambda c: c.ensure_healthy())


def test_requests_in_flight_are_bounded() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.02)
        return httpx.Response(200, json=_completion())

    async def body(client: LvlmClient) -> int:
        prompt = load_prompt("describe")
        await asyncio.gather(*(client.chat(prompt, IMAGE, "") for _ in range(12)))
        return client.peak_in_flight

    peak = _run(_settings(max_in_flight=3), handler, body)
    assert peak == 3


def test_ledger_sums_stages() -> None:
    from p2p.mining.lvlm.client import ChatResult

    ledger = CostLedger()
    ledger.add("panels", ChatResult("panels", "", "stop", 100, 10, 0.5, 1))
    ledger.add("panels", ChatResult("panels", "", "stop", 50, 5, 0.25, 0))
    ledger.add("describe", ChatResult("describe", "", "stop", 20, 2, 0.1, 0))
    ledger.stage("describe").fallbacks += 1
    out = ledger.as_dict()
    assert (out["requests"], out["prompt_tokens"], out["completion_tokens"], out["retries"]) == (
        3,
        170,
        17,
        1,
    )
    assert out["fallbacks"] == 1
    assert out["stages"]["panels"]["requests"] == 2
