from __future__ import annotations

import hashlib
import io
import json

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from p2p.shared.db.models import LicenseGroup
from p2p.shared.runtime import Runtime
from tests.helpers import assert_error, image_bytes, object_count, row_counts, upload


def test_post_figure_stores_records_and_queues(client: TestClient, runtime: Runtime) -> None:
    data = image_bytes("PNG", (120, 80), seed=1)
    response = upload(client, data, caption="Figure 2. (A) Liver section. (B) Kidney.")
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["duplicate"] is False and body["status"] == "queued"
    assert response.headers["Location"] == f"/v1/figures/{body['figure_id']}"

    figure = client.get(f"/v1/figures/{body['figure_id']}").json()
    sha = hashlib.sha256(data).hexdigest()
    assert figure["image_sha256"] == sha
    assert (figure["width"], figure["height"], figure["format"]) == (120, 80, "PNG")
    assert figure["caption"] == "Figure 2. (A) Liver section. (B) Kidney."
    assert figure["panels"] == [] and figure["status"] == "queued"
    assert figure["object_key"] == f"figures/{sha[:2]}/{sha}.png"
    assert runtime.store.get_bytes(figure["object_key"]) == data

    job = client.get(f"/v1/jobs/{body['job_id']}").json()
    assert job["figure_id"] == body["figure_id"]
    assert job["status"] == "queued" and job["attempts"] == 0 and job["backend"] == "cpu"


def test_same_image_and_caption_is_idempotent(client: TestClient, runtime: Runtime) -> None:
    data = image_bytes("JPEG", seed=2)
    first = upload(client, data, caption="A caption")
    again = upload(client, data, caption="A caption")
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["duplicate"] is True
    assert again.json()["figure_id"] == first.json()["figure_id"]
    assert again.json()["job_id"] == first.json()["job_id"]
    other_caption = upload(client, data, caption="Another caption")
    assert other_caption.status_code == 202
    assert other_caption.json()["figure_id"] != first.json()["figure_id"]
    assert row_counts(runtime.engine)["figure"] == 2
    assert object_count(runtime.store) == 1  # content-addressed: one object for identical bytes


def test_metadata_creates_and_reuses_article(client: TestClient, runtime: Runtime) -> None:
    meta = {
        "article": {
            "pmcid": "PMC123456",
            "pmid": "3456",
            "title": "Liver atlas",
            "journal": "J Hepatol",
            "year": 2021,
            "license": "http://creativecommons.org/licenses/by-nc/4.0/",
        },
        "figure_label": "Figure 3",
        "inline_references": ["As shown in Fig. 3A, the lobules ..."],
    }
    first = upload(client, image_bytes(seed=3), metadata=meta).json()
    second = upload(client, image_bytes(seed=4), metadata={"article": {"pmcid": "PMC123456"}}).json()
    fig1 = client.get(f"/v1/figures/{first['figure_id']}").json()
    fig2 = client.get(f"/v1/figures/{second['figure_id']}").json()
    assert fig1["article"]["id"] == fig2["article"]["id"]
    assert fig1["article"]["license_group"] == LicenseGroup.NONCOMMERCIAL.value
    assert fig1["article"]["title"] == "Liver atlas" and fig1["article"]["year"] == 2021
    assert fig1["figure_label"] == "Figure 3"
    assert fig1["inline_references"] == ["As shown in Fig. 3A, the lobules ..."]
    assert row_counts(runtime.engine)["article"] == 1


def _truncated(fmt: str) -> bytes:
    data = image_bytes(fmt, (300, 200), seed=5)
    return data[: len(data) // 2]


def _bomb_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (10_000, 9_500)).save(buffer, format="PNG")  # 95 MP, a few KB on disk
    return buffer.getvalue()


def _ppm() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PPM")
    return buffer.getvalue()


BAD_UPLOADS = [
    pytest.param(lambda: b"this is not an image at all", {}, 422, "not_an_image", id="not-an-image"),
    pytest.param(lambda: b"", {}, 422, "not_an_image", id="empty"),
    pytest.param(lambda: _truncated("PNG"), {}, 422, "corrupt_image", id="truncated-png"),
    pytest.param(lambda: _truncated("JPEG"), {}, 422, "corrupt_image", id="truncated-jpeg"),
    pytest.param(_ppm, {}, 415, "unsupported_format", id="unsupported-ppm"),
    pytest.param(_bomb_png, {}, 422, "image_too_many_pixels", id="decompression-bomb"),
    pytest.param(lambda: image_bytes(), {"metadata": "{not json"}, 422, "malformed_metadata", id="bad-json"),
    pytest.param(
        lambda: image_bytes(),
        {"metadata": json.dumps({"autor": "x"})},
        422,
        "unknown_field",
        id="unknown-metadata-field",
    ),
    pytest.param(
        lambda: image_bytes(),
        {"metadata": json.dumps({"article": {"year": "soon"}})},
        422,
        "invalid_metadata",
        id="invalid-metadata-value",
    ),
    pytest.param(
        lambda: image_bytes(), {"extra": {"captoin": "typo"}}, 422, "unknown_field", id="unknown-form-field"
    ),
    pytest.param(
        lambda: image_bytes(), {"caption": "x" * 20_001}, 422, "caption_too_long", id="long-caption"
    ),
]


@pytest.mark.parametrize(("make", "kwargs", "status", "error_type"), BAD_UPLOADS)
def test_bad_upload_is_refused_and_nothing_is_stored(
    client: TestClient,
    runtime: Runtime,
    make,
    kwargs,
    status: int,
    error_type: str,  # type: ignore[no-untyped-def]
) -> None:
    response = upload(client, make(), **kwargs)
    assert_error(response, status, error_type)
    assert row_counts(runtime.engine) == {"figure": 0, "article": 0, "job": 0, "batch": 0}
    assert object_count(runtime.store) == 0


def test_missing_image_is_a_validation_error(client: TestClient, runtime: Runtime) -> None:
    response = client.post("/v1/figures", data={"caption": "no image"})
    assert_error(response, 422, "validation_error")
    assert "image" in response.json()["error"]["message"]
    assert row_counts(runtime.engine)["figure"] == 0


def test_upload_cap_refuses_by_content_length_and_by_streaming(make_settings, db) -> None:  # type: ignore[no-untyped-def]
    from p2p.ingest.app import create_app
    from p2p.shared.runtime import build_runtime

    runtime = build_runtime(make_settings(ingest={"max_upload_bytes": 4096, "max_metadata_bytes": 1024}))
    try:
        with TestClient(create_app(runtime=runtime)) as client:
            big = image_bytes("BMP", (200, 200))  # ~120 kB, uncompressed
            assert_error(upload(client, big), 413, "payload_too_large")

            # Above the image cap but below the body cap: refused while hashing the stream.
            medium = image_bytes("BMP", (40, 40))  # ~4.9 kB
            assert_error(upload(client, medium), 413, "payload_too_large")

            # No Content-Length (chunked): refused by counting bytes as they arrive.
            boundary = "p2pboundary"
            body = (
                (
                    f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.bmp"\r\n'
                    "Content-Type: image/bmp\r\n\r\n"
                ).encode()
                + big
                + f"\r\n--{boundary}--\r\n".encode()
            )

            def chunks():  # type: ignore[no-untyped-def]
                for i in range(0, len(body), 8192):
                    yield body[i : i + 8192]

            response = client.post(
                "/v1/figures",
                content=chunks(),
                headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
            )
            assert_error(response, 413, "payload_too_large")
        assert row_counts(runtime.engine)["figure"] == 0
        assert object_count(runtime.store) == 0
    finally:
        runtime.close()


def test_error_envelope_for_unknown_ids_and_routes(client: TestClient) -> None:
    assert_error(client.get("/v1/figures/6f1c2d7e-0000-4000-8000-000000000000"), 404, "not_found")
    assert_error(client.get("/v1/jobs/6f1c2d7e-0000-4000-8000-000000000000"), 404, "not_found")
    assert_error(client.get("/v1/figures/not-a-uuid"), 422, "validation_error")
    assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(client.delete("/v1/figures"), 405, "method_not_allowed")


def test_list_figures_filters_by_status(client: TestClient) -> None:
    for seed in range(3):
        upload(client, image_bytes(seed=10 + seed), caption=f"c{seed}")
    assert len(client.get("/v1/figures").json()) == 3
    assert len(client.get("/v1/figures", params={"status": "queued", "limit": 2}).json()) == 2
    assert client.get("/v1/figures", params={"status": "mined"}).json() == []
    assert_error(client.get("/v1/figures", params={"status": "bogus"}), 422, "validation_error")


def test_openapi_documents_the_upload(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/figures" in spec["paths"] and "/v1/batches" in spec["paths"]
    assert "multipart/form-data" in spec["paths"]["/v1/figures"]["post"]["requestBody"]["content"]


NESTED = "--------------------------4ef8fdccdc48a815"


@pytest.mark.parametrize(
    "caption",
    [
        f"{NESTED}--\r\n",  # what curl -F "caption=(A) ..." sends: an empty nested multipart
        f"{NESTED}\r\nContent-Type: text/plain\r\n\r\n(A) Liver\r\n{NESTED}--\r\n",
    ],
)
def test_caption_that_is_a_multipart_body_is_refused(
    client: TestClient, runtime: Runtime, caption: str
) -> None:
    response = upload(client, image_bytes(seed=41), caption=caption)
    assert_error(response, 422, "invalid_caption")
    assert "--form-string" in response.json()["error"]["message"]
    assert row_counts(runtime.engine)["figure"] == 0 and object_count(runtime.store) == 0


def test_caption_sent_as_a_file_part_is_refused(client: TestClient, runtime: Runtime) -> None:
    response = client.post(
        "/v1/figures",
        files={
            "image": ("fig.png", image_bytes(seed=42), "image/png"),
            "caption": ("caption.txt", b"(A) Liver; (B) kidney", "text/plain"),
        },
    )
    assert_error(response, 422, "validation_error")
    assert response.json()["error"]["message"].startswith("caption:")
    twice = client.post(
        "/v1/figures",
        files=[
            ("image", ("fig.png", image_bytes(seed=42), "image/png")),
            ("caption", (None, b"(A) Liver")),
            ("caption", (None, b"(B) Kidney")),
        ],
    )
    assert_error(twice, 422, "invalid_caption")
    assert row_counts(runtime.engine)["figure"] == 0 and object_count(runtime.store) == 0


def test_caption_with_semicolons_and_a_leading_label_is_stored_verbatim(client: TestClient) -> None:
    caption = "(A) Liver; H&E. (B) Kidney; --not a boundary-- (C) -- see text"
    response = upload(client, image_bytes(seed=43), caption=caption)
    assert response.status_code == 202, response.text
    assert client.get(f"/v1/figures/{response.json()['figure_id']}").json()["caption"] == caption
