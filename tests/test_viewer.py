"""The web viewer in a real headless Chromium (Debian's, driven by Playwright): the landing page's
corpus counts and newest figures; searches kept in the URL (shareable, Back works) and paged; the
figure page's boxes, tags, toggles, hover linking of boxes and cards, the opened hit, zoom and pan,
the sticky figure and the provenance toggle.

Screenshots for a reviewer: build/viewer-screenshots/*.png (gitignored), rewritten by every run."""

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
from sqlalchemy import Engine, func, select, text

from p2p.embedding_api.app import create_app
from p2p.shared.db.base import Base
from p2p.shared.db.models import MiningJob, Panel
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings
from tests.test_embedding_api import index_corpus, mine_corpus

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[1] / "build" / "viewer-screenshots"
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
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(
    engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Runtime, list[str]]]:
    """One mined and indexed corpus served for every test of the module (they only read it)."""
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    settings = Settings(
        profile="embedded",
        data_dir=tmp_path_factory.mktemp("viewer") / "data",
        db={"url": pg_url},
        queue={"embedded_queues": ["ingest"]},
    )
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
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
        set_process_runtime(None)
        runtime.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # Playwright evaluates wait_for_function's predicate with eval, which the viewer's CSP forbids
    # (as it should); the policy itself is tested in test_bounded_work.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    try:
        tab = context.new_page()
        tab.set_default_timeout(30_000)
        yield tab
    finally:
        context.close()


def assert_screenshot(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def shot(page: Any, name: str, *, full_page: bool = True) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    assert_screenshot(path)


def test_search_page_shows_crops_and_filters_by_level(
    served: tuple[str, Runtime, list[str]], page: Any
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
    shot(page, "search.png")

    page.uncheck("#level-toggles input[data-level=region]")
    page.wait_for_function("document.querySelectorAll('.hit[data-level=region]').length === 0")
    assert page.locator(".hit[data-level=panel]").count() == counts["panel"]
    page.uncheck("#level-toggles input[data-level=figure]")
    page.wait_for_function("document.querySelectorAll('.hit[data-level=figure]').length === 0")
    assert page.locator("#results .hit").count() == counts["panel"]
    shot(page, "search-panels.png")
    page.check("#level-toggles input[data-level=region]")
    page.wait_for_selector(".hit[data-level=region]")

    page.locator(".hit[data-level=panel]").first.click()
    page.wait_for_url("**/figures/**")
    page.wait_for_selector("#panel-boxes rect.box.panel")
    assert page.locator("g.item.focus rect.box").count() == 1  # the clicked hit is highlighted
    assert errors == []


def test_figure_page_draws_every_box_and_toggles_hide_them(
    served: tuple[str, Runtime, list[str]], page: Any
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
    shot(page, "figure.png")

    page.uncheck("#toggle-panel")
    assert not page.locator("#panel-boxes rect.box.panel").first.is_visible()
    assert page.locator("#region-boxes rect.box.region").first.is_visible()
    page.uncheck("#toggle-region")
    assert not page.locator("#region-boxes rect.box.region").first.is_visible()
    shot(page, "figure-no-boxes.png")
    page.check("#toggle-panel")
    assert page.locator("#panel-boxes rect.box.panel").first.is_visible()
    assert errors == []


def test_landing_page_shows_corpus_counts_and_browsable_recent_figures(
    served: tuple[str, Runtime, list[str]], page: Any
) -> None:
    base, runtime, figure_ids = served
    with runtime.session() as session:
        n_panels = session.scalar(select(func.count()).select_from(Panel))
    page.goto(base + "/")
    page.wait_for_selector("#recent .hit")
    counts = page.locator("#corpus-counts").inner_text()
    assert f"{len(figure_ids)} figures" in counts and f"{n_panels} panels" in counts
    assert page.locator("#recent .hit").count() == len(figure_ids)
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#recent img')).every(i => i.complete && i.naturalWidth > 0)"
    )
    shot(page, "landing.png")
    page.locator("#recent .hit").first.click()
    page.wait_for_url("**/figures/**")
    page.wait_for_selector("#panel-boxes rect.box.panel")


def test_search_lives_in_the_url_back_returns_to_it_and_pages(
    served: tuple[str, Runtime, list[str]], page: Any
) -> None:
    base, _, _ = served
    page.goto(base + "/")
    page.wait_for_selector("#recent .hit")
    page.fill("#query-text", "liver section")
    page.uncheck("#level-toggles input[data-level=figure]")
    page.uncheck("#level-toggles input[data-level=region]")
    page.fill("#query-k", "2")
    page.click("#search-button")
    page.wait_for_selector("#results .hit")
    assert "q=liver+section" in page.url and "level=panel" in page.url and "k=2" in page.url
    first = page.locator("#results .hit").evaluate_all("hits => hits.map(h => h.dataset.id)")
    assert len(first) == 2 and page.locator("#landing").is_hidden()

    page.click("#next-page")
    page.wait_for_url("**page=1**")
    page.wait_for_function(
        "ids => Array.from(document.querySelectorAll('#results .hit'))"
        ".every(h => !ids.includes(h.dataset.id))",
        arg=first,
    )
    second = page.locator("#results .hit").evaluate_all("hits => hits.map(h => h.dataset.id)")
    assert second and not set(second) & set(first)
    assert "page 2" in page.locator("#page-info").inner_text()
    shot(page, "search-page-2.png")

    shared = page.url  # a shared link opens the same page of hits
    other = page.context.new_page()
    other.goto(shared)
    other.wait_for_selector("#results .hit")
    assert other.locator("#results .hit").evaluate_all("hits => hits.map(h => h.dataset.id)") == second
    assert other.input_value("#query-text") == "liver section"
    other.close()

    page.go_back()
    page.wait_for_function("!location.search.includes('page=')")
    page.wait_for_function(
        "ids => JSON.stringify(Array.from(document.querySelectorAll('#results .hit')).map(h => h.dataset.id))"
        " === JSON.stringify(ids)",
        arg=first,
    )
    page.go_back()
    page.wait_for_function("location.search === ''")
    assert page.locator("#landing").is_visible() and page.locator("#results .hit").count() == 0


def _figure_with_regions(runtime: Runtime, figure_ids: list[str]) -> tuple[str, list[Panel]]:
    with runtime.session() as session:
        for figure_id in figure_ids:
            panels = list(session.scalars(select(Panel).where(Panel.figure_id == uuid.UUID(figure_id))))
            if any(p.regions for p in panels):
                for p in panels:
                    _ = list(p.regions)
                session.expunge_all()
                return figure_id, panels
    raise AssertionError("no mined figure has regions")


def test_figure_page_links_boxes_and_cards_and_tags_every_box(
    served: tuple[str, Runtime, list[str]], page: Any
) -> None:
    base, runtime, figure_ids = served
    figure_id, panels = _figure_with_regions(runtime, figure_ids)
    region = next(r for p in panels for r in p.regions)
    page.goto(f"{base}/figures/{figure_id}")
    page.wait_for_selector("#region-boxes rect.box.region")
    page.wait_for_function("document.getElementById('figure-image').naturalWidth > 0")

    # every region box carries a tag (panel label + number), and so does its card
    tags = page.locator("#region-boxes text.tag").all_text_contents()
    assert len(tags) == sum(len(p.regions) for p in panels) and all(tags)
    card_badges = page.locator("#items .region .badge").all_inner_texts()
    assert sorted(card_badges) == sorted(tags)

    # hovering a card lights its box, hovering a box lights its card
    page.locator(f'#items .card[data-id="{panels[0].id}"] > h3').hover()
    assert page.locator(f'#panel-boxes g.item.hover[data-id="{panels[0].id}"]').count() == 1
    shot(page, "figure-hover-card.png", full_page=False)
    page.locator(f'#region-boxes g.item[data-id="{region.id}"] rect').hover(force=True)
    assert page.locator(f'#items .region.hover[data-id="{region.id}"]').count() == 1
    assert page.locator(f'#region-boxes g.item.hover[data-id="{region.id}"]').count() == 1
    shot(page, "figure-hover-box.png", full_page=False)

    # the tags stay off the top-left corner of their boxes, where the printed labels are
    overlaps = page.evaluate(
        """() => Array.from(document.querySelectorAll('#overlay g.item')).filter(g => {
            const r = g.querySelector('rect').getBBox(), t = g.querySelector('text');
            if (!t) return false;
            const b = t.getBBox();
            return b.x < r.x + r.width / 3 && b.x + b.width > r.x
                && b.y < r.y + r.height / 3 && b.y + b.height > r.y;
        }).length"""
    )
    assert overlaps == 0
    assert "description: —" not in page.locator("#items").inner_text()


def test_an_opened_hit_is_highlighted_and_scrolled_to(
    served: tuple[str, Runtime, list[str]], page: Any
) -> None:
    base, runtime, figure_ids = served
    figure_id, panels = _figure_with_regions(runtime, figure_ids)
    region = [r for p in panels for r in p.regions][-1]
    page.set_viewport_size({"width": 1280, "height": 500})
    page.goto(f"{base}/figures/{figure_id}?focus=region:{region.id}")
    page.wait_for_selector("#items .region.focus")
    card = page.locator(f'#items .region.focus[data-id="{region.id}"]')
    page.wait_for_function(
        "id => { const r = document.querySelector(`#items .region[data-id='${id}']`).getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= innerHeight; }",
        arg=str(region.id),
    )
    assert card.is_visible()
    assert page.locator(f'#region-boxes g.item.focus[data-id="{region.id}"]').count() == 1
    box = page.locator(f'#region-boxes g.item.focus[data-id="{region.id}"] rect').bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 500  # its box is in view too
    shot(page, "figure-focus.png", full_page=False)


def test_figure_zooms_pans_and_stays_beside_its_cards(
    served: tuple[str, Runtime, list[str]], page: Any
) -> None:
    base, _, figure_ids = served
    page.set_viewport_size({"width": 1280, "height": 500})
    page.goto(f"{base}/figures/{figure_ids[0]}")
    page.wait_for_selector("#panel-boxes rect.box.panel")
    page.wait_for_function("document.getElementById('figure-image').naturalWidth > 0")
    before = page.locator("#figure-image").bounding_box()
    page.click("#zoom-in")
    zoomed = page.locator("#figure-image").bounding_box()
    assert before is not None and zoomed is not None
    assert zoomed["width"] == pytest.approx(before["width"] * 1.5, rel=0.02)
    box = page.locator("#panel-boxes rect.box.panel").first.bounding_box()
    assert box is not None  # the boxes scale with the image
    viewport = page.locator("#viewport").bounding_box()
    assert viewport is not None
    x, y = viewport["x"] + viewport["width"] / 2, viewport["y"] + 100  # inside the 500-px window
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 60, y + 30, steps=4)
    page.mouse.up()
    panned = page.locator("#figure-image").bounding_box()
    assert panned is not None and panned["x"] == pytest.approx(zoomed["x"] + 60, abs=2)
    page.mouse.wheel(0, -200)
    page.wait_for_function(
        "w => document.getElementById('figure-image').getBoundingClientRect().width > w + 1",
        arg=panned["width"],
    )
    shot(page, "figure-zoomed.png", full_page=False)
    page.click("#zoom-reset")
    page.wait_for_function(
        "w => Math.abs(document.getElementById('figure-image').getBoundingClientRect().width - w) < 1",
        arg=before["width"],
    )

    # scrolled to the last card, the figure is still in view beside it
    page.locator("#items > .card").last.scroll_into_view_if_needed()
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert page.evaluate("scrollY") > 0
    image = page.locator("#figure-image").bounding_box()
    assert image is not None and image["y"] < 500 and image["y"] + image["height"] > 0
    shot(page, "figure-scrolled.png", full_page=False)

    # provenance is behind its toggle
    assert not page.locator(".provenance-detail").first.is_visible()
    page.check("#toggle-provenance")
    assert page.locator(".provenance-detail").first.is_visible()
