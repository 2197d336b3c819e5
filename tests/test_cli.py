from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from p2p.cli import app
from p2p.ingest.samples import make_figure, write_manifest_folder, write_pmc_package
from p2p.shared.settings import get_settings
from tests.helpers import image_bytes, row_counts

runner = CliRunner()


def said(result) -> str:  # type: ignore[no-untyped-def]
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, pg_url: str, tmp_path: Path, db: Engine) -> Path:
    data_dir = tmp_path / "data"
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_DATA_DIR", str(data_dir))
    get_settings.cache_clear()
    yield data_dir  # type: ignore[misc]
    get_settings.cache_clear()


def test_ingest_every_kind_of_path(cli_env: Path, tmp_path: Path, db: Engine) -> None:
    manifest_dir = tmp_path / "manifest"
    write_manifest_folder(manifest_dir, count=2)
    package = write_pmc_package(tmp_path / "PMC9000001.tar.gz")
    shard = tmp_path / "shard-0.tar"
    with tarfile.open(shard, "w") as tar:
        for i, payload in enumerate([image_bytes("JPEG", seed=70), image_bytes("PNG", seed=71)]):
            for name, data in ((f"s{i}.jpg", payload), (f"s{i}.txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, __import__("io").BytesIO(data))
    loose = tmp_path / "loose"
    loose.mkdir()
    fig = make_figure(55)
    (loose / "one.png").write_bytes(fig.image)
    (loose / "one.txt").write_text(fig.caption)
    (loose / "two.png").write_bytes(image_bytes(seed=72))
    (loose / "two.json").write_text(json.dumps({"caption": "from json"}))

    result = runner.invoke(app, ["ingest", str(manifest_dir), str(package), str(shard), str(loose)])
    assert result.exit_code == 0, result.output
    assert "ingested 8, duplicates 0, failed 0" in said(result)
    with db.connect() as conn:
        captions = set(conn.execute(text("SELECT caption FROM figure")).scalars())
    assert {fig.caption, "from json", "caption 0", "caption 1"} <= captions

    again = runner.invoke(app, ["ingest", str(loose / "one.png")])
    assert again.exit_code == 0 and "ingested 0, duplicates 1" in said(again)
    # one progress report for the whole call, not one per image or source (output is not a terminal:
    # the report is a line, printed when the bar ends)
    assert re.findall(r"^ingest: \d+/\d+ \(100%\)", result.output, re.M) == ["ingest: 8/8 (100%)"]
    assert not re.search(r"^(one|two)\.png", result.output, re.M)

    rerun = runner.invoke(app, ["ingest", str(manifest_dir)])
    assert "ingested 0, duplicates 2" in said(rerun)
    status = runner.invoke(app, ["status"])
    assert status.exit_code == 0
    assert "and 1 re-run batches that found only figures already stored" in said(status)
    assert said(status).count("│ succeeded │") == 3  # manifest, package, shard; the re-run is folded
    assert "…" not in status.output  # piped, the table is wide enough not to cut its cells


def test_ingest_reports_bad_paths(cli_env: Path, tmp_path: Path, db: Engine) -> None:
    missing = runner.invoke(app, ["ingest", str(tmp_path / "nope.png")])
    assert missing.exit_code == 2 and "does not exist" in said(missing)
    odd = tmp_path / "notes.docx"
    odd.write_text("x")
    assert runner.invoke(app, ["ingest", str(odd)]).exit_code == 2
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    result = runner.invoke(app, ["ingest", str(bad)])
    assert result.exit_code == 1 and "not_an_image" in said(result)
    assert row_counts(db)["figure"] == 0


def test_keys_status_and_db_upgrade(cli_env: Path, db: Engine) -> None:
    created = runner.invoke(app, ["keys", "create", "--name", "lab", "--scope", "ingest", "--scope", "read"])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert token.startswith("p2p_")
    listed = runner.invoke(app, ["keys", "list"])
    assert "lab" in said(listed) and "ingest,read" in said(listed)
    assert runner.invoke(app, ["keys", "revoke", token.split("_")[1]]).exit_code == 0
    assert runner.invoke(app, ["keys", "revoke", token.split("_")[1]]).exit_code == 1
    bad_scope = runner.invoke(app, ["keys", "create", "--name", "x", "--scope", "root"])
    assert bad_scope.exit_code == 2

    status = runner.invoke(app, ["status"])
    assert status.exit_code == 0 and "figures" in said(status)
    upgraded = runner.invoke(app, ["db", "upgrade"])
    assert upgraded.exit_code == 0 and "head" in said(upgraded)


def test_bad_configuration_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("P2P_PROFILE", "production")
    get_settings.cache_clear()
    try:
        result = runner.invoke(app, ["status"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2 and "P2P_DB__URL" in said(result)


def test_demo_runs_on_the_embedded_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """`p2p demo --no-serve` with no server configured: embedded PostgreSQL, local objects."""
    import shutil
    import tempfile

    data_dir = Path(tempfile.mkdtemp(prefix="p2p-demo-test-"))
    data_dir.chmod(0o755)
    for var in ("P2P_DB__URL", "P2P_REDIS__URL", "P2P_S3__ENDPOINT", "P2P_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("P2P_DATA_DIR", str(data_dir))
    get_settings.cache_clear()
    try:
        small = ["--synthetic", "16", "--train-steps", "3"]
        result = runner.invoke(app, ["demo", "--no-serve", *small])
        assert result.exit_code == 0, result.output
        assert "ingested 10, duplicates 0, failed 0" in said(result)
        assert "drew 16 synthetic compound figures" in said(result) and "ingested 16," in said(result)
        assert "mining jobs succeeded │ 26" in said(result)
        assert "training the small hierarchical CLIP model for 3 steps" in said(result)
        assert "completed" in said(result) and "trained beats untrained on" in said(result)
        assert "trained by the demo run" in said(result)
        assert "search 'fluorescence micrograph of cells' (panels), best 3:" in said(result)
        assert "demo phases: ingest and mining" in said(result)
        objects = list((data_dir / "objects" / "figures").rglob("*.*"))
        assert len(objects) == 26
        rerun = runner.invoke(app, ["demo", "--no-serve", *small])
        assert rerun.exit_code == 0 and "ingested 0, duplicates 10" in said(rerun)
        assert "skipping training" in said(rerun) and "trained by the demo run" in said(rerun)
        untrained = runner.invoke(app, ["demo", "--no-serve", "--synthetic", "0", "--train-steps", "0"])
        assert untrained.exit_code == 0, untrained.output
        assert "registered the default embedding model p2p-minilm-vit 1" in said(untrained)
    finally:
        get_settings.cache_clear()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_synth_then_eval_mining(tmp_path: Path) -> None:
    out = tmp_path / "synthetic"
    made = runner.invoke(app, ["synth", str(out), "--count", "3", "--seed", "99"])
    assert made.exit_code == 0, made.output
    annotations = json.loads((out / "annotations.json").read_text())
    assert len([k for k in annotations if not k.startswith("_")]) == 3
    report_path = tmp_path / "report.json"
    result = runner.invoke(app, ["eval", "mining", "--dir", str(out), "--out", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    cpu, naive = report["cpu"], report["naive_xycut"]
    assert cpu["figures"] == naive["figures"] == 3
    for run in (cpu, naive):
        assert 0.0 <= run["panels"]["0.9"]["f1"] <= 1.0
    assert cpu["panels"]["0.5"]["f1"] > 0.5
    assert cpu["label_accuracy"] is not None and cpu["subcaption_token_f1"] is not None
    assert "segment" in cpu["stage_seconds_per_figure"]
    assert "panel F1@0.9" in said(result)


def test_eval_mining_caption_mode(tmp_path: Path) -> None:
    data = tmp_path / "captions.jsonl"
    record = {
        "id": "x.jpg",
        "caption": "Liver sections. (A) Normal tissue. (B) Fibrotic tissue.",
        "labels": ["A", "B"],
        "subcaptions": {"A": "Liver sections. Normal tissue.", "B": "Liver sections. Fibrotic tissue."},
    }
    data.write_text(json.dumps(record) + "\n")
    report_path = tmp_path / "captions.json"
    result = runner.invoke(app, ["eval", "mining", "--captions", str(data), "--out", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())["captions"]
    assert report["splitter"]["exact"] == 1.0 and report["splitter"]["token_f1"] == 1.0
    assert report["baseline_whole_caption"]["exact"] == 0.0
    assert runner.invoke(app, ["eval", "mining"]).exit_code == 2


def test_eval_mining_caption_mode_on_annotations_of_one_split(tmp_path: Path) -> None:
    annotations = {
        "_notes": "verbatim",
        "t.jpg": {
            "caption": "Liver. (A) Normal tissue. (B) Fibrotic tissue.",
            "panels": [{"label": "A"}, {"label": "B"}],
            "subcaptions": {"preamble": "Liver.", "A": "(A) Normal tissue.", "B": "(B) Fibrotic tissue."},
        },
        "c.jpg": {
            "caption": "Kidney. (A) Cortex. (B) Medulla.",
            "panels": [{"label": "A"}, {"label": "B"}],
            "subcaptions": {"preamble": "Kidney.", "A": "(A) Cortex. (B) Medulla.", "B": "(B) Medulla."},
        },
    }
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(annotations))
    (tmp_path / "splits.json").write_text(json.dumps({"_notes": "x", "tune": ["t.jpg"], "check": ["c.jpg"]}))
    report_path = tmp_path / "report.json"
    args = ["eval", "mining", "--captions", str(path), "--out", str(report_path)]
    result = runner.invoke(app, [*args, "--split", "tune"])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())["captions"]
    assert report["captions"] == 1 and report["splitter"]["exact"] == 1.0
    assert runner.invoke(app, [*args, "--split", "check"]).exit_code == 0
    assert json.loads(report_path.read_text())["captions"]["splitter"]["exact"] == 0.5
    assert runner.invoke(app, [*args, "--split", "nope"]).exit_code == 2


def test_cost_sums_lvlm_requests_per_figure_and_stage(cli_env: Path, db: Engine) -> None:
    from sqlalchemy.orm import Session

    from p2p.shared.db.models import Figure, JobStatus, MiningJob

    costs = [
        {"requests": 10, "prompt_tokens": 9000, "completion_tokens": 800, "retries": 1, "fallbacks": 0,
         "stages": {"panels": {"requests": 5, "prompt_tokens": 6000}, "describe": {"requests": 5}}},
        {"requests": 14, "prompt_tokens": 11000, "completion_tokens": 1000, "retries": 0, "fallbacks": 1,
         "stages": {"panels": {"requests": 5, "prompt_tokens": 6500, "fallbacks": 1},
                    "describe": {"requests": 9}}},
    ]  # fmt: skip
    with Session(db) as session:
        for i, cost in enumerate(costs):
            figure = Figure(
                image_sha256=f"{i:064d}", caption_sha256="c" * 64, object_key=f"figures/{i}", byte_size=1,
                width=10, height=10, format="PNG", source="test",
            )  # fmt: skip
            session.add(figure)
            session.flush()
            session.add(
                MiningJob(
                    figure_id=figure.id,
                    backend="lvlm",
                    miner_version="lvlm-1-paper",
                    status=JobStatus.SUCCEEDED,
                    cost=cost,
                )
            )
        session.commit()
    result = runner.invoke(app, ["cost", "--backend", "lvlm", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["figures"] == 2 and row["requests"] == 24 and row["fallback_figures"] == 1
    assert row["per_figure"]["requests"] == 12.0 and row["per_figure"]["prompt_tokens"] == 10000.0
    assert row["stages"]["panels"]["requests"] == 10 and row["stages"]["describe"]["requests"] == 14
    table = runner.invoke(app, ["cost"])
    assert table.exit_code == 0 and "per figure: 12.0 requests" in said(table)


def test_cost_of_the_cpu_backend_is_its_time_per_stage(cli_env: Path, db: Engine) -> None:
    from sqlalchemy.orm import Session

    from p2p.shared.db.models import Figure, JobStatus, MiningJob

    timings = [{"segment": 0.25, "labels": 0.05, "markers": 0.1}, {"segment": 0.35, "labels": 0.15}]
    with Session(db) as session:
        for i, stage_timings in enumerate(timings):
            figure = Figure(
                image_sha256=f"{i + 7:064d}", caption_sha256="c" * 64, object_key=f"figures/c{i}",
                byte_size=1, width=10, height=10, format="PNG", source="test",
            )  # fmt: skip
            session.add(figure)
            session.flush()
            session.add(
                MiningJob(
                    figure_id=figure.id, backend="cpu", miner_version="cpu-3", status=JobStatus.SUCCEEDED,
                    cost={}, stage_timings=stage_timings,
                )
            )  # fmt: skip
        session.commit()
    (row,) = json.loads(runner.invoke(app, ["cost", "--json"]).output)
    assert row["stage_seconds"] == {"segment": 0.6, "labels": 0.2, "markers": 0.1}
    table = runner.invoke(app, ["cost"])
    assert table.exit_code == 0
    text = said(table)
    assert "no model tokens" in text and "segment │ 0.6 │ 300.0" in text and "total │ 0.9 │ 450.0" in text
