"""Schema fuzzing of both APIs (schemathesis): no 5xx, and every answer as the spec declares it
(status, content type, headers, body schema), on a corpus with an active model version.

``P2P_FUZZ_EXAMPLES`` sets the examples per operation (a few here; ``make fuzz`` runs hundreds).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import Engine, text

from p2p.apps.embedding import embedding_app as create_embedding_app
from p2p.apps.ingest import ingest_app as create_ingest_app
from p2p.shared.db.base import Base
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings
from tests.helpers import serve_in_thread
from tests.test_embedding_api import index_corpus, mine_corpus

EXAMPLES = int(os.environ.get("P2P_FUZZ_EXAMPLES", "6"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
requests_made: Counter[str] = Counter()


@pytest.fixture(scope="module")
def fuzz_runtime(engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    runtime = build_runtime(
        Settings(
            profile="embedded",
            data_dir=data_dir,
            db={"url": pg_url},
            queue={"embedded_queues": []},
            rate_limit={"writes_per_window": 0},  # the fuzzer writes faster than any client may
        )
    )
    set_process_runtime(runtime)
    mine_corpus(runtime, seeds=(4,))
    index_corpus(runtime)
    yield runtime
    set_process_runtime(None)
    runtime.close()
    print(f"\nfuzz: {sum(requests_made.values())} requests: {dict(requests_made)}")


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("P2P_FUZZ_RANDOM") is None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    database=None,
)
APPS = {"ingest": create_ingest_app, "embedding": create_embedding_app}


@pytest.mark.parametrize("api", sorted(APPS))
def test_the_api_answers_as_its_spec_says(api: str, fuzz_runtime: Runtime) -> None:
    app = APPS[api](runtime=fuzz_runtime)
    failures: list[str] = []
    server, thread, port = serve_in_thread(app)
    try:
        base = f"http://127.0.0.1:{port}"
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        session = requests.Session()  # one keep-alive connection: an error must not close it
        for result in schema.get_all_operations():
            operation = result.ok()

            @given(case=operation.as_strategy())
            @FUZZ_SETTINGS
            def run(case: Any) -> None:
                requests_made[api] += 1
                case.call_and_validate(base_url=base, session=session, checks=CHECKS)

            try:
                run()
            except Exception as exc:  # keep going: one report for every operation that fails
                failures.append(f"{operation.label}: {exc}"[:3000])
    finally:
        server.should_exit = True
        thread.join(30)
    assert not failures, "\n\n".join(failures)
