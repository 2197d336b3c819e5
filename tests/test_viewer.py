"""The web viewer in a real headless Chromium (Debian's, driven by Playwright): the search page shows
result crops and filters them by level; the figure page draws every panel and region box and the
toggles hide them. Screenshots land in the test's temp folder."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import select

from p2p.embedding_api.app import create_app
from p2p.shared.db.models import MiningJob, Panel
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.test_embedding_api import index_corpus, mine_corpus

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="viewer tests need Debian's /usr/bin/chromium (apt-get install chromium)",
    ),
    pytest.mark.parametrize("store_kind", ["local"], indirect=True),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(make_runtime: RuntimeFactory) -> Iterator[tuple[str, Runtime, list[str]]]:
    runtime = make_runtime()
    figure_ids = mine_corpus(runtime)
    index_corpus(runtime)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(runtime=runtime), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API server did not start"
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}", runtime, figure_ids
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def page() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # Playwright evaluates wait_for_function's predicate with eval, which the viewer's CSP
            # forbids (as it should); the policy itself is tested in test_bounded_work.
            context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
            tab = context.new_page()
            tab.set_default_timeout(30_000)
            yield tab
        finally:
            browser.close()


def assert_screenshot(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_search_page_shows_crops_and_filters_by_level(
    served: tuple[str, Runtime, list[str]], page: Any, tmp_path: Path
) -> None:
    base, _, figure_ids = served
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base + "/")
    page.fill("#query-text", "H&E staining of lung")
    page.click("#search-button")
    page.wait_for_selector(".hit[data-level=region]")
    counts = {
        level: page.locator(f".hit[data-level={level}]").count() for level in ("figure", "panel", "region")
    }
    assert counts["figure"] == len(figure_ids) and counts["panel"] > 0 and counts["region"] > 0
    page.wait_for_function(
        "Array.from(document.querySelectorAll('.hit img')).every(i => i.complete && i.naturalWidth > 0)"
    )
    scores = page.locator(".hit .score").all_inner_texts()
    assert all(float(score) <= 1.0 for score in scores)
    page.screenshot(path=str(tmp_path / "search.png"), full_page=True)

    page.uncheck("#level-toggles input[data-level=region]")
    page.wait_for_function("document.querySelectorAll('.hit[data-level=region]').length === 0")
    assert page.locator(".hit[data-level=panel]").count() == counts["panel"]
    page.uncheck("#level-toggles input[data-level=figure]")
    page.wait_for_function("document.querySelectorAll('.hit[data-level=figure]').length === 0")
    assert page.locator(".hit").count() == counts["panel"]
    page.screenshot(path=str(tmp_path / "search-panels.png"), full_page=True)
    page.check("#level-toggles input[data-level=region]")
    page.wait_for_selector(".hit[data-level=region]")

    page.locator(".hit[data-level=panel]").first.click()
    page.wait_for_url("**/figures/**")
    page.wait_for_selector("#panel-boxes rect.box.panel")
    assert page.locator("rect.box.focus").count() == 1  # the clicked hit is highlighted
    assert errors == []
    for name in ("search.png", "search-panels.png"):
        assert_screenshot(tmp_path / name)


def test_figure_page_draws_every_box_and_toggles_hide_them(
    served: tuple[str, Runtime, list[str]], page: Any, tmp_path: Path
) -> None:
    base, runtime, figure_ids = served
    figure_id = figure_ids[0]
    with runtime.session() as session:
        panels = list(session.scalars(select(Panel).where(Panel.figure_id == uuid.UUID(figure_id))))
        n_regions = sum(len(p.regions) for p in panels)
        subcaptions = [p.subcaption for p in panels if p.subcaption]
    assert panels and n_regions > 0
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base}/figures/{figure_id}")
    page.wait_for_selector("#panel-boxes rect.box.panel")
    page.wait_for_function("document.getElementById('figure-image').naturalWidth > 0")
    assert page.locator("#panel-boxes rect.box.panel").count() == len(panels)
    assert page.locator("#region-boxes rect.box.region").count() == n_regions
    assert page.locator("#items .card[data-level=panel]").count() == len(panels)
    assert page.locator("#items div.region[data-id]").count() == n_regions
    text = page.locator("#items").inner_text()
    assert all(sub in text for sub in subcaptions)
    assert "Liver atlas" in page.locator("#article").inner_text()
    with runtime.session() as session:
        version = session.scalar(
            select(MiningJob.miner_version).where(MiningJob.figure_id == uuid.UUID(figure_id))
        )
    assert version and f"mined by {version}" in page.locator("#figure-title").inner_text()
    # the boxes sit on the image: the first panel's box scales with the displayed image
    image_box = page.locator("#figure-image").bounding_box()
    first = page.locator("#panel-boxes rect.box.panel").first.bounding_box()
    assert image_box is not None and first is not None
    assert (
        image_box["x"] - 2 <= first["x"]
        and first["x"] + first["width"] <= image_box["x"] + image_box["width"] + 2
    )
    page.screenshot(path=str(tmp_path / "figure.png"), full_page=True)

    page.uncheck("#toggle-panel")
    assert not page.locator("#panel-boxes rect.box.panel").first.is_visible()
    assert page.locator("#region-boxes rect.box.region").first.is_visible()
    page.uncheck("#toggle-region")
    assert not page.locator("#region-boxes rect.box.region").first.is_visible()
    page.screenshot(path=str(tmp_path / "figure-no-boxes.png"), full_page=True)
    page.check("#toggle-panel")
    assert page.locator("#panel-boxes rect.box.panel").first.is_visible()
    assert errors == []
    for name in ("figure.png", "figure-no-boxes.png"):
        assert_screenshot(tmp_path / name)
