"""The embedding API: embeds, search (text, image, image+box, stored item) with context, items,
crops, zero-shot classification, model versions, health, and the errors of each."""

from __future__ import annotations

import io
import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import select

from p2p.embedding_api.app import create_app
from p2p.embedding_api.indexing import register, reindex
from p2p.ingest.app import create_app as create_ingest_app
from p2p.ingest.samples import make_figure
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.models.modeling import ModelSpec, load_model, save_checkpoint
from p2p.models.registry import activate
from p2p.models.taxonomy import FIGURE_TYPES
from p2p.shared.auth import create_api_key
from p2p.shared.db.models import Figure, Panel, Region
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error, image_bytes, upload, wait_for

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
TINY_SPEC = ModelSpec(name="tiny", architecture="custom", config=TINY, source="random")
ARTICLES = [
    {"pmcid": "PMC100001", "title": "Liver atlas", "journal": "J Hepatol", "year": 2021,
     "license": "http://creativecommons.org/licenses/by/4.0/"},
    {"pmcid": "PMC100002", "title": "Kidney atlas", "journal": "Kidney Int", "year": 2015,
     "license": "http://creativecommons.org/licenses/by-nc/4.0/"},
]  # fmt: skip


def png(size: tuple[int, int] = (200, 150), seed: int = 0) -> bytes:
    return image_bytes("PNG", size, seed=seed)


def mine_corpus(runtime: Runtime, seeds: tuple[int, ...] = (4, 7)) -> list[str]:
    """Ingest and mine sample figures (one article each) through the ingest API and the CPU miner."""
    figure_ids = []
    with TestClient(create_ingest_app(runtime=runtime)) as client:
        for seed, article in zip(seeds, ARTICLES, strict=False):
            sample = make_figure(seed)
            accepted = upload(
                client,
                sample.image,
                caption=sample.caption,
                filename=sample.name,
                metadata={"article": article},
            ).json()
            mine_job(runtime, uuid.UUID(accepted["job_id"]), get_miner())
            figure_ids.append(accepted["figure_id"])
    return figure_ids


def index_corpus(runtime: Runtime, spec: ModelSpec = TINY_SPEC) -> uuid.UUID:
    with runtime.session() as session:
        version = register(session, spec, "1", store=runtime.store)
        activate(session, runtime.dispatcher, version_id=version.id, space="default")
        version_id = version.id
    reindex(runtime, version_id, "default")
    return version_id


@dataclass
class Corpus:
    client: TestClient
    runtime: Runtime
    version_id: uuid.UUID
    figure_ids: list[str]

    def ids(self, model: Any) -> list[uuid.UUID]:
        with self.runtime.session() as session:
            return list(session.scalars(select(model.id)))


@pytest.fixture
def corpus(make_runtime: RuntimeFactory) -> Iterator[Corpus]:
    runtime = make_runtime(embedding={"max_k": 50, "max_texts": 4, "max_text_chars": 200, "max_images": 3})
    figure_ids = mine_corpus(runtime)
    version_id = index_corpus(runtime)
    with TestClient(create_app(runtime=runtime)) as client:
        yield Corpus(client, runtime, version_id, figure_ids)


def wait_until(check: Any, timeout: float = 60.0) -> Any:
    return wait_for(check, timeout, interval=0.2)


# --- no active version ---------------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_without_an_active_version_embeds_work_and_search_says_no_space_is_ready(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = make_runtime(embedding={"max_texts": 3, "max_text_chars": 50, "max_images": 2})
    with TestClient(create_app(runtime=runtime)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"database": "ok", "object_store": "ok", "model": "ok"}
        assert "no active model version" in ready.json()["space"]["search"]
        assert client.get("/healthz").json() == {"status": "ok"}
        paths = client.get("/openapi.json").json()["paths"]
        assert {"/v1/search", "/v1/embed/texts", "/v1/classify", "/v1/models/{version_id}/activate"} <= set(
            paths
        )
        assert "multipart/form-data" in paths["/v1/search"]["post"]["requestBody"]["content"]
        search_body = paths["/v1/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "$defs" not in json.dumps(search_body)  # self-contained: no reference points nowhere
        filter_keys = set(search_body["properties"]["filters"]["properties"])
        assert {"figure_id", "article_id", "figure_type", "license_group", "year_min"} <= filter_keys
        assert search_body["properties"]["offset"]["description"]

        body = client.post("/v1/embed/texts", json={"texts": ["liver section", "kidney"]}).json()
        assert body["model"]["version_id"] is None and body["dim"] == 384
        assert [item["source"] for item in body["items"]] == ["text:0", "text:1"]
        vector = body["items"][0]["embedding"]
        assert len(vector) == 384 and abs(sum(v * v for v in vector) - 1.0) < 1e-3

        images = client.post(
            "/v1/embed/images",
            files=[("files", ("a.png", png(), "image/png")), ("files", ("b.png", png(seed=2)))],
        )
        assert images.status_code == 200, images.text
        assert [i["source"] for i in images.json()["items"]] == ["file:a.png", "file:b.png"]

        search = client.post("/v1/search", json={"text": "liver"})
        assert_error(search, 503, "space_not_ready")
        assert "no active model version" in search.json()["error"]["message"]
        assert client.get("/v1/models").json() == []

        # bad input, each with its reason
        assert_error(client.post("/v1/embed/texts", json={"texts": []}), 422, "empty_input")
        assert_error(client.post("/v1/embed/texts", json={"texts": ["ok", "  "]}), 422, "empty_text")
        assert_error(client.post("/v1/embed/texts", json={"texts": ["a"] * 4}), 422, "too_many_texts")
        assert_error(client.post("/v1/embed/texts", json={"texts": ["x" * 51]}), 422, "text_too_long")
        assert_error(client.post("/v1/embed/texts", json={"texts": ["a"], "x": 1}), 422, "unknown_field")
        not_image = client.post("/v1/embed/images", files=[("files", ("a.png", b"not an image at all"))])
        assert_error(not_image, 422, "not_an_image")
        many = [("files", (f"{i}.png", png(seed=i))) for i in range(3)]
        assert_error(client.post("/v1/embed/images", files=many), 422, "too_many_images")
        assert_error(client.post("/v1/embed/images", data={"object_ids": "nope"}), 422, "invalid_id")
        missing = client.post("/v1/embed/images", data={"object_ids": str(uuid.uuid4())})
        assert_error(missing, 404, "not_found")


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_image_embeds_read_the_form_themselves_and_document_it(make_runtime: RuntimeFactory) -> None:
    """The uploads and ids are read from the form by the route (not FastAPI parameters): parts of
    the wrong kind are refused with a reason, the body is still described in the OpenAPI document,
    and the vectors are those of the same images embedded alone."""
    runtime = make_runtime()
    with TestClient(create_app(runtime=runtime)) as client:
        body = client.get("/openapi.json").json()["paths"]["/v1/embed/images"]["post"]["requestBody"]
        schema = body["content"]["multipart/form-data"]["schema"]
        assert schema["properties"]["files"]["items"]["format"] == "binary"
        assert schema["properties"]["object_ids"]["type"] == "array"

        text_as_file = client.post("/v1/embed/images", data={"files": "not a file"})
        assert_error(text_as_file, 422, "invalid_request")
        file_as_id = client.post(
            "/v1/embed/images",
            files=[("files", ("a.png", png())), ("object_ids", ("ids.txt", b"x"))],
        )
        assert_error(file_as_id, 422, "invalid_id")
        assert_error(client.post("/v1/embed/images", json={"files": []}), 422, "empty_input")

        both = client.post(
            "/v1/embed/images", files=[("files", ("a.png", png())), ("files", ("b", png(seed=2)))]
        )
        assert both.status_code == 200, both.text
        assert [i["source"] for i in both.json()["items"]] == ["file:a.png", "file:b"]
        alone = client.post("/v1/embed/images", files=[("files", ("b", png(seed=2)))]).json()
        together, single = both.json()["items"][1]["embedding"], alone["items"][0]["embedding"]
        assert np.allclose(together, single, atol=1e-5)  # batch composition may move the last bits


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_binary_answers_carry_the_json_vectors_and_open_reads_open_no_session(
    make_runtime: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    runtime = make_runtime()
    with TestClient(create_app(runtime=runtime)) as client:
        files = [("files", ("a.png", png(), "image/png")), ("files", ("b.png", png(seed=2)))]
        as_json = client.post("/v1/embed/images", files=files)
        assert as_json.status_code == 200 and as_json.headers["content-type"] == "application/json"
        binary = client.post("/v1/embed/images", files=files, headers={"Accept": "application/octet-stream"})
        assert binary.status_code == 200 and binary.headers["content-type"] == "application/octet-stream"
        h = binary.headers
        assert (h["x-embedding-count"], h["x-embedding-dim"], h["x-embedding-dtype"]) == (
            "2",
            "384",
            "float32",
        )
        assert h["x-model-name"] == as_json.json()["model"]["name"] and h["x-model-version-id"] == ""
        assert json.loads(h["x-embedding-sources"]) == ["file:a.png", "file:b.png"]
        rows = np.frombuffer(binary.content, dtype="<f4").reshape(2, 384)
        expected = np.array([item["embedding"] for item in as_json.json()["items"]], dtype=np.float32)
        assert np.array_equal(rows, expected)
        texts = client.post(
            "/v1/embed/texts", json={"texts": ["liver"]}, headers={"Accept": "application/octet-stream"}
        )
        assert texts.headers["x-embedding-sources"] == '["text:0"]' and len(texts.content) == 384 * 4

        # With keys not required, a read opens no database session (it used to open one per request
        # for the key check).
        opened: list[int] = []
        real_session = runtime.session

        def counting_session(*args: Any, **kwargs: Any) -> Any:
            opened.append(1)
            return real_session(*args, **kwargs)

        monkeypatch.setattr(runtime, "session", counting_session)
        assert client.post("/v1/embed/images", files=files).status_code == 200
        assert client.post("/v1/embed/texts", json={"texts": ["liver"]}).status_code == 200
        assert opened == []


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_upload_caps_come_from_the_settings(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(ingest={"max_upload_bytes": 4096})
    with TestClient(create_app(runtime=runtime)) as client:
        noise = Image.frombytes("RGB", (64, 64), bytes(random.Random(3).randbytes(64 * 64 * 3)))
        buffer = io.BytesIO()
        noise.save(buffer, format="PNG")
        assert len(buffer.getvalue()) > 4096
        big = client.post("/v1/embed/images", files=[("files", ("big.png", buffer.getvalue()))])
        assert_error(big, 413, "payload_too_large")
        huge = client.post("/v1/embed/images", files=[("files", ("huge.bin", b"0" * (3 * 1024 * 1024)))])
        assert_error(huge, 413, "payload_too_large")


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_reads_need_the_read_scope_and_model_changes_the_admin_scope(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(auth={"required": True})
    with runtime.session() as session:
        _, reader = create_api_key(session, name="reader", scopes=["read"])
        _, ingester = create_api_key(session, name="ingester", scopes=["ingest"])
    with TestClient(create_app(runtime=runtime)) as client:
        assert_error(client.post("/v1/embed/texts", json={"texts": ["a"]}), 401, "missing_api_key")
        as_reader = {"Authorization": f"Bearer {reader}"}
        as_ingester = {"Authorization": f"Bearer {ingester}"}
        assert client.post("/v1/embed/texts", json={"texts": ["a"]}, headers=as_reader).status_code == 200
        assert_error(client.get("/v1/models", headers=as_ingester), 403, "insufficient_scope")
        assert client.get("/v1/models", headers=as_reader).status_code == 200
        refused = client.post("/v1/models", json={"version": "1"}, headers=as_reader)
        assert_error(refused, 403, "insufficient_scope")
        activate_refused = client.post(f"/v1/models/{uuid.uuid4()}/activate", headers=as_reader)
        assert_error(activate_refused, 403, "insufficient_scope")
        assert client.get("/", headers={}).status_code == 200  # the viewer page itself is static


# --- model versions ----------------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_register_and_activate_switch_the_served_model_without_restart(
    make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "embedding"]})
    mine_corpus(runtime, (5,))
    other = dict(TINY, embed_dim=48)
    other_spec = ModelSpec("other", "custom", other, "random")
    checkpoint = tmp_path / "other.pt"
    save_checkpoint(load_model(other_spec), checkpoint, spec=other_spec)
    with TestClient(create_app(runtime=runtime, refresh_interval_s=0.2)) as client:
        # refused before anything is recorded, with the reason
        mismatch = client.post(
            "/v1/models",
            json={"name": "tiny", "architecture": "custom", "config": TINY, "source": f"local:{checkpoint}",
                  "version": "1"},
        )  # fmt: skip
        assert_error(mismatch, 422, "model_load_failed")
        wrong_dim = client.post(
            "/v1/models",
            json={"name": "tiny", "architecture": "custom", "config": TINY, "version": "1", "dim": 64},
        )
        assert_error(wrong_dim, 422, "dimension_mismatch")
        half = client.post("/v1/models", json={"name": "tiny", "version": "1"})
        assert_error(half, 422, "invalid_request")
        assert client.get("/v1/models").json() == []

        created = client.post(
            "/v1/models", json={"name": "tiny", "architecture": "custom", "config": TINY, "version": "1"}
        )
        assert created.status_code == 201, created.text
        model = created.json()
        assert created.headers["Location"] == f"/v1/models/{model['id']}"
        assert model["dim"] == 32 and model["status"] == "registered"
        assert (model["active"], model["serving"], model["active_in"]) == (False, False, [])
        again = client.post(
            "/v1/models", json={"name": "tiny", "architecture": "custom", "config": TINY, "version": "1"}
        )
        assert again.status_code == 409, again.text

        assert_error(client.post(f"/v1/models/{uuid.uuid4()}/activate"), 404, "not_found")
        assert_error(client.get(f"/v1/models/{uuid.uuid4()}"), 404, "not_found")
        before = client.app.state.model_state  # type: ignore[attr-defined]
        before.text_cache.put(before.cache_key, "lung", np.ones(before.dim, dtype=np.float32))
        started = client.post(f"/v1/models/{model['id']}/activate")
        assert started.status_code == 202, started.text
        assert isinstance(runtime.dispatcher, InProcessDispatcher) and runtime.dispatcher.wait_idle(300)

        def served() -> dict[str, Any] | None:
            row = client.get(f"/v1/models/{model['id']}").json()
            return row if row["serving"] else None

        row = wait_until(served)
        assert row["status"] == "ready" and row["active"] and row["active_in"] == ["default"]
        assert row["progress"]["state"] == "complete" and row["progress"]["done"] == row["progress"]["total"]
        assert [m["id"] for m in client.get("/v1/models").json()] == [model["id"]]
        # The texts the old model embedded are gone with it; the new model's are cached afresh.
        served_state = client.app.state.model_state  # type: ignore[attr-defined]
        assert len(before.text_cache) == 0
        assert served_state.text_cache.get(served_state.cache_key, "lung") is None
        hits = client.post("/v1/search", json={"text": "lung", "level": "figure"}).json()
        assert hits["model"]["version_id"] == model["id"] and len(hits["hits"]) == 1
        assert served_state.text_cache.get(served_state.cache_key, "lung") is not None
        assert client.post("/v1/embed/texts", json={"texts": ["a"]}).json()["dim"] == 32
        assert client.get("/readyz").json()["space"]["search"] == "ready"


# --- search over a mined corpus ----------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_text_search_returns_hits_with_their_context_at_every_level(corpus: Corpus) -> None:
    client = corpus.client
    panels = client.post("/v1/search", json={"text": "H&E staining of lung", "level": "panel", "k": 3})
    assert panels.status_code == 200, panels.text
    body = panels.json()
    assert body["model"]["version_id"] == str(corpus.version_id) and body["level"] == "panel"
    hits = body["hits"]
    assert len(hits) == 3
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    for hit in hits:
        assert hit["level"] == "panel" and hit["panel_id"] == hit["id"] and hit["region_id"] is None
        assert hit["crop_url"].startswith("/v1/crops/") and len(hit["box"]) == 4
        assert hit["figure"]["caption"] and hit["figure"]["image_url"].startswith("/v1/crops/")
        assert hit["article"]["title"] in ("Liver atlas", "Kidney atlas")
        assert hit["article"]["license_group"] in ("commercial", "noncommercial")
        assert hit["panel"]["id"] == hit["id"]
        assert hit["text"] == (hit["panel"]["subcaption"] or hit["panel"]["description"])

    regions = client.post("/v1/search", json={"text": "arrow", "level": "region", "k": 5}).json()["hits"]
    assert regions and all(h["level"] == "region" and h["region_id"] == h["id"] for h in regions)
    for hit in regions:
        assert hit["panel"] is not None and hit["panel_id"] == hit["panel"]["id"]
        assert "caption_text" in hit and "description" in hit
        x0, y0, x1, y1 = hit["box"]
        assert 0 <= x0 < x1 <= hit["figure"]["width"] and 0 <= y0 < y1 <= hit["figure"]["height"]

    figures = client.post("/v1/search", json={"text": "lung", "level": "figure", "k": 10}).json()["hits"]
    assert sorted(h["id"] for h in figures) == sorted(corpus.figure_ids)

    # A repeated text (whitespace aside) is served from the cache: the text tower runs once for it.
    state = client.app.state.model_state  # type: ignore[attr-defined]
    first = client.post("/v1/search", json={"text": "lung  tissue", "level": "panel", "k": 5}).json()["hits"]
    embedded = state.batcher.stats_for("texts").items
    again = client.post("/v1/search", json={"text": "lung\ttissue", "level": "panel", "k": 5}).json()["hits"]
    assert again == first and state.batcher.stats_for("texts").items == embedded
    assert state.text_cache.hits >= 1
    # The search costs were measured on this version's table after start-up.
    costs = wait_until(lambda: state.search_costs.costs)
    assert costs.source.startswith("embedding_" + corpus.version_id.hex[:16]) and costs.exact_row_ms > 0
    assert all(h["panel"] is None and h["box"][:2] == [0, 0] for h in figures)

    # paging and exact search agree on a small corpus
    top = client.post("/v1/search", json={"text": "lung", "level": "panel", "k": 4, "exact": True}).json()
    page = client.post("/v1/search", json={"text": "lung", "level": "panel", "k": 2, "offset": 2}).json()
    assert [h["id"] for h in page["hits"]] == [h["id"] for h in top["hits"][2:4]]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_search_filters_and_errors(corpus: Corpus) -> None:
    client = corpus.client
    first = corpus.figure_ids[0]
    by_figure = client.post(
        "/v1/search", json={"text": "lung", "level": "region", "k": 50, "filters": {"figure_id": first}}
    ).json()["hits"]
    assert by_figure and {h["figure_id"] for h in by_figure} == {first}
    commercial = client.post(
        "/v1/search",
        json={"text": "x", "level": "panel", "k": 50, "filters": {"license_group": "commercial"}},
    ).json()["hits"]
    assert commercial and {h["article"]["title"] for h in commercial} == {"Liver atlas"}
    recent = client.post(
        "/v1/search",
        json={"text": "x", "level": "figure", "filters": {"year_min": 2020, "journal": "J Hepatol"}},
    ).json()["hits"]
    assert [h["id"] for h in recent] == [first]
    assert client.post("/v1/search", json={"text": "x", "filters": {"year_min": 2030}}).json()["hits"] == []

    assert_error(
        client.post("/v1/search", json={"text": "x", "filters": {"color": "red"}}), 422, "unknown_field"
    )
    assert_error(client.post("/v1/search", json={"text": "x", "k": 0}), 422, "k_out_of_range")
    assert_error(client.post("/v1/search", json={"text": "x", "k": 51}), 422, "k_out_of_range")
    assert_error(client.post("/v1/search", json={"text": "x", "offset": -1}), 422, "offset_out_of_range")
    assert_error(client.post("/v1/search", json={"text": "x", "level": "cell"}), 422, "validation_error")
    assert_error(client.post("/v1/search", json={"text": "   "}), 422, "empty_text")
    assert_error(client.post("/v1/search", json={"text": "x" * 201}), 422, "text_too_long")
    assert_error(client.post("/v1/search", json={}), 422, "invalid_query")
    both = client.post("/v1/search", json={"text": "x", "item": {"id": first}})
    assert_error(both, 422, "invalid_query")
    assert_error(client.post("/v1/search", json={"item": {"id": str(uuid.uuid4())}}), 404, "not_found")
    as_json = {"content-type": "application/json"}
    malformed = client.post("/v1/search", content=b"{not json", headers=as_json)
    assert_error(malformed, 422, "malformed_json")
    plain_text = client.post("/v1/search", content=b"text", headers={"content-type": "text/plain"})
    assert_error(plain_text, 415, "unsupported_media_type")


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_search_by_stored_item_uploaded_image_and_box(corpus: Corpus) -> None:
    client = corpus.client
    panel_id = corpus.ids(Panel)[0]
    similar = client.post("/v1/search", json={"item": {"id": str(panel_id)}, "level": "panel", "k": 3}).json()
    assert similar["query"]["item"] == {"level": "panel", "id": str(panel_id)}
    assert len(similar["hits"]) == 3 and str(panel_id) not in [h["id"] for h in similar["hits"]]
    figures = client.post(
        "/v1/search", json={"item": {"id": str(panel_id), "level": "panel"}, "level": "figure"}
    )
    assert figures.status_code == 200 and len(figures.json()["hits"]) == 2
    region_id = corpus.ids(Region)[0]
    by_region = client.post("/v1/search", json={"item": {"id": str(region_id)}, "level": "region", "k": 2})
    assert by_region.json()["query"]["item"]["level"] == "region"

    with corpus.runtime.session() as session:
        figure = session.get(Figure, uuid.UUID(corpus.figure_ids[0]))
        assert figure is not None
        data, size = corpus.runtime.store.get_bytes(figure.object_key), (figure.width, figure.height)
    plain = client.post("/v1/search", files={"image": ("f.jpg", data)}, data={"level": "figure", "k": "2"})
    assert plain.status_code == 200, plain.text
    assert len(plain.json()["hits"]) == 2 and plain.json()["query"]["image"] == f"{size[0]}x{size[1]}"
    boxed = client.post(
        "/v1/search",
        files={"image": ("f.jpg", data)},
        data={
            "level": "panel",
            "k": "3",
            "box": "10,10,200,150",
            "filters": json.dumps({"figure_id": str(figure.id)}),
        },
    )
    assert boxed.status_code == 200, boxed.text
    assert boxed.json()["query"]["box"] == [10, 10, 200, 150]
    assert {h["figure_id"] for h in boxed.json()["hits"]} == {str(figure.id)}

    def image_search(**form: str) -> Any:
        return client.post("/v1/search", files={"image": ("f.jpg", data)}, data=form)

    assert_error(image_search(box=f"0,0,{size[0] + 1},10"), 422, "invalid_box")
    assert_error(image_search(box="20,20,20,40"), 422, "invalid_box")
    assert_error(image_search(box="-1,0,10,10"), 422, "invalid_box")
    assert_error(image_search(box="1,2,3"), 422, "invalid_box")
    assert_error(image_search(filters='{"shape": 1}'), 422, "unknown_field")
    assert_error(image_search(colour="red"), 422, "unknown_field")
    assert_error(image_search(k="0"), 422, "k_out_of_range")
    not_image = client.post("/v1/search", files={"image": ("x.png", b"GIF89a but not really")})
    assert_error(not_image, 422, "not_an_image")


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_both_apis_answer_one_figure_shape_and_serve_its_crops(corpus: Corpus) -> None:
    """GET /v1/figures/{id} is one schema on :8000 and :8001, and every crop key or URL it names
    is served by the crop route of both."""
    with TestClient(create_ingest_app(runtime=corpus.runtime)) as ingest:
        for figure_id in corpus.figure_ids:
            on_ingest = ingest.get(f"/v1/figures/{figure_id}").json()
            on_embedding = corpus.client.get(f"/v1/figures/{figure_id}").json()
            assert on_ingest == on_embedding
            listed = next(f for f in ingest.get("/v1/figures").json() if f["id"] == figure_id)
            assert listed == on_ingest
            panels = on_ingest["panels"]
            regions = [r for p in panels for r in p["regions"]]
            assert panels and regions
            keys = [on_ingest["object_key"]] + [i["crop_key"] for i in panels + regions]
            urls = [on_ingest["image_url"]] + [i["crop_url"] for i in panels + regions]
            assert urls == [f"/v1/crops/{key}" for key in keys]
            for client in (ingest, corpus.client):
                for url in urls[:3]:
                    crop = client.get(url)
                    assert crop.status_code == 200 and crop.headers["content-type"].startswith("image/")
            assert_error(ingest.get("/v1/crops/uploads/abc/package.tar.gz"), 404, "not_found")
        for client in (ingest, corpus.client):
            answer = client.get("/openapi.json").json()["paths"]["/v1/figures/{figure_id}"]["get"]
            schema = answer["responses"]["200"]["content"]["application/json"]["schema"]
            assert schema["$ref"] == "#/components/schemas/FigurePublic"


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_items_crops_classify_and_stored_image_embeds(corpus: Corpus) -> None:
    client = corpus.client
    figure_id = corpus.figure_ids[0]
    figure = client.get(f"/v1/figures/{figure_id}").json()
    with corpus.runtime.session() as session:
        panels = list(session.scalars(select(Panel).where(Panel.figure_id == uuid.UUID(figure_id))))
        n_regions = sum(len(p.regions) for p in panels)
    assert len(figure["panels"]) == len(panels) > 0
    assert sum(len(p["regions"]) for p in figure["panels"]) == n_regions
    assert figure["article"]["title"] == "Liver atlas" and figure["width"] > 0
    panel = figure["panels"][0]
    assert {"subcaption", "description", "provenance", "confidence", "crop_url", "box"} <= set(panel)

    image = client.get(figure["image_url"])
    assert image.status_code == 200 and image.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(image.content)).size == (figure["width"], figure["height"])
    crop = client.get(panel["crop_url"])
    assert crop.status_code == 200 and Image.open(io.BytesIO(crop.content)).size[0] > 0
    assert_error(client.get("/v1/crops/uploads/abc/package.tar.gz"), 404, "not_found")
    assert_error(client.get("/v1/crops/figures/../../etc/passwd"), 404, "not_found")

    one = client.get(f"/v1/panels/{panel['id']}").json()
    assert one["figure"]["id"] == figure_id and one["article"]["journal"] == "J Hepatol"
    region_id = next(r["id"] for p in figure["panels"] for r in p["regions"])
    region = client.get(f"/v1/regions/{region_id}").json()
    assert region["figure"]["id"] == figure_id and region["panel"]["id"] == region["panel_id"]
    for kind in ("figures", "panels", "regions"):
        assert_error(client.get(f"/v1/{kind}/{uuid.uuid4()}"), 404, "not_found")
    assert client.get("/v1/figures/not-a-uuid").status_code == 422

    classified = client.post("/v1/classify", json={"panel_id": panel["id"]})
    assert classified.status_code == 200, classified.text
    labels = classified.json()["labels"]
    assert sorted(label["label"] for label in labels) == sorted(FIGURE_TYPES)
    probabilities = [label["probability"] for label in labels]
    assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-3
    custom = client.post(
        "/v1/classify", files={"image": ("c.png", crop.content)}, data={"labels": ["bar chart", "micrograph"]}
    ).json()
    assert sorted(label["label"] for label in custom["labels"]) == ["bar chart", "micrograph"]
    assert custom["source"] == "file:c.png"
    assert_error(client.post("/v1/classify", json={"panel_id": str(uuid.uuid4())}), 404, "not_found")
    assert_error(
        client.post("/v1/classify", json={"panel_id": panel["id"], "labels": [""]}), 422, "empty_text"
    )
    assert_error(client.post("/v1/classify", data={"labels": "x"}), 422, "invalid_request")

    embedded = client.post(
        "/v1/embed/images",
        files=[("files", ("a.png", png()))],
        data={"object_ids": [figure_id, panel["id"]]},
    ).json()
    assert [i["source"] for i in embedded["items"]] == [
        "file:a.png",
        f"figure:{figure_id}",
        f"panel:{panel['id']}",
    ]
    assert embedded["dim"] == 32


@pytest.mark.parametrize("store_kind", ["s3"], indirect=True)
def test_crops_on_s3_redirect_to_a_presigned_url(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime()
    with TestClient(create_ingest_app(runtime=runtime)) as ingest:
        accepted = upload(ingest, png(seed=9)).json()
    with runtime.session() as session:
        figure = session.get(Figure, uuid.UUID(accepted["figure_id"]))
        assert figure is not None
        key = figure.object_key
    with TestClient(create_app(runtime=runtime)) as client:
        response = client.get(f"/v1/crops/{key}", follow_redirects=False)
        assert response.status_code == 307, response.text
        assert key in response.headers["location"] and "X-Amz-Signature" in response.headers["location"]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_bad_image_among_good_ones_is_named_and_refuses_the_batch(make_runtime: RuntimeFactory) -> None:
    # The uploads of a request are decoded together, in one hand-off: the refusal must still say
    # which upload is bad, whichever its place.
    runtime = make_runtime()
    with TestClient(create_app(runtime=runtime)) as client:
        files = [
            ("files", ("first.png", png(), "image/png")),
            ("files", ("second.png", b"\x89PNG\r\n\x1a\n not really", "image/png")),
            ("files", ("third.png", png(seed=3), "image/png")),
        ]
        response = client.post("/v1/embed/images", files=files)
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert "second.png" in message and "first.png" not in message and "third.png" not in message


def test_json_answer_is_what_pydantic_writes_for_the_schema() -> None:
    import numpy as np

    from p2p.embedding_api.routes.embed import json_answer
    from p2p.embedding_api.schemas import EmbeddingPublic, EmbedPublic, ModelRef

    vectors = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    vectors[1, 2] = np.nan  # never from a model, but the answer must stay valid JSON as before
    ref = ModelRef(version_id=uuid.uuid4(), name="m", version="v1", dim=8, space="default")
    sources = ["file:a.png", 'file:é "quoted".png', "panel:x"]
    expected = EmbedPublic(
        model=ref,
        dim=8,
        items=[
            EmbeddingPublic(source=s, embedding=v.tolist()) for s, v in zip(sources, vectors, strict=True)
        ],
    ).model_dump_json()
    assert json_answer(vectors, sources, ref_json=ref.model_dump_json().encode()) == expected.encode()
