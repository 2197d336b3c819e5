"""`p2p train ...` on the embedded queue (runs execute in the CLI process) against the test
database, and the config presets and KEY=VALUE overrides behind it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from p2p.cli.main import app
from p2p.shared.settings import get_settings
from p2p.shared.storage import LocalObjectStore
from p2p.training.ablations import markdown_table, summarize
from p2p.training.config import TrainConfigError
from p2p.training.presets import merge, overrides_from_assignments, resolve
from tests.test_training_runner import TINY_TRAINING, write_snapshot

runner = CliRunner()


def said(result) -> str:  # type: ignore[no-untyped-def]
    return " ".join(result.output.split())


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, pg_url: str, tmp_path: Path, db: Engine) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_DATA_DIR", str(data_dir))
    monkeypatch.delenv("P2P_REDIS__URL", raising=False)
    monkeypatch.delenv("P2P_S3__ENDPOINT", raising=False)
    get_settings.cache_clear()
    write_snapshot(LocalObjectStore(data_dir / "objects"), "snap/tiny", 8)
    yield data_dir
    get_settings.cache_clear()


def test_presets_and_dotted_overrides() -> None:
    assert overrides_from_assignments(["lr.shared=1e-4", "levels=panel", "batch_sizes.figure=4"]) == {
        "lr": {"shared": 1e-4},
        "levels": "panel",
        "batch_sizes": {"figure": 4},
    }
    assert merge({"lr": {"shared": 1.0, "fine": 2.0}}, {"lr": {"shared": 3.0}}) == {
        "lr": {"shared": 3.0, "fine": 2.0}
    }
    small = resolve(None, {"lr": {"fine": 1e-3}})
    assert small.max_steps == 240 and small.schedule == "mixed"
    assert small.lr.fine == 1e-3 and small.lr.shared == 5e-4
    assert resolve("paper").model.architecture == "ViT-L-14" and resolve("paper").warmup_steps == 1000
    with pytest.raises(TrainConfigError, match="unknown preset 'big'"):
        resolve("big")
    with pytest.raises(TrainConfigError, match="KEY=VALUE"):
        overrides_from_assignments(["levels"])
    with pytest.raises(TrainConfigError, match="both a value and a section"):
        overrides_from_assignments(["lr=1", "lr.fine=2"])
    with pytest.raises(TrainConfigError, match="unknown training config key"):
        resolve(None, overrides_from_assignments(["lr.shard=1"]))


def test_train_start_shows_progress_and_the_run_is_listed_shown_and_not_cancelled_twice(
    cli_env: Path, tmp_path: Path
) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({**TINY_TRAINING, "epochs": 50}))
    started = runner.invoke(
        app,
        ["train", "start", "--snapshot", "snap/tiny", "--config", str(config), "--set", "max_steps=4",
         "--name", "cli run", "--no-register", "--checkpoint-every", "2"],
    )  # fmt: skip
    assert started.exit_code == 0, started.output
    run_id = re.search(r"training run ([0-9a-f-]{36}) queued", started.output)
    assert run_id is not None
    assert "completed" in said(started) and "step 4 of 4" in said(started)
    assert re.search(r"time: export \d+ s, train \d+ s, evaluate \d+ s", said(started))
    assert f"training-runs/{run_id[1]}/step-00000004.pt" in said(started)
    listed = runner.invoke(app, ["train", "list"])
    assert listed.exit_code == 0 and run_id[1] in said(listed) and "4/4" in said(listed)
    shown = runner.invoke(app, ["train", "show", run_id[1]])
    assert shown.exit_code == 0 and "completed" in said(shown)
    short = runner.invoke(app, ["train", "show", run_id[1][:8]])  # the 8 characters tables print
    assert short.exit_code == 0 and f"run {run_id[1]}: completed" in said(short)
    nowhere = runner.invoke(app, ["train", "show", "ffffffff" if run_id[1][0] != "f" else "00000000"])
    assert nowhere.exit_code == 2 and "no training run with an id starting" in said(nowhere)
    assert runner.invoke(app, ["train", "show", "run-one"]).exit_code == 2
    again = runner.invoke(app, ["train", "cancel", run_id[1]])
    assert again.exit_code == 2 and "has already completed" in said(again)
    unknown = runner.invoke(app, ["train", "show", "0" * 8 + "-0000-0000-0000-" + "0" * 12])
    assert unknown.exit_code == 2 and "no training run" in said(unknown)


def test_train_start_refuses_bad_input(cli_env: Path) -> None:
    bad_key = runner.invoke(app, ["train", "start", "--snapshot", "snap/tiny", "--set", "learning_rate=1"])
    assert bad_key.exit_code == 2 and "learning_rate" in said(bad_key)
    missing = runner.invoke(app, ["train", "start", "--snapshot", "snap/nothing"])
    assert missing.exit_code == 2 and "snap/nothing" in said(missing)
    no_corpus = runner.invoke(app, ["train", "start"])
    assert no_corpus.exit_code == 2 and "no mined figure" in said(no_corpus)
    listed = runner.invoke(app, ["train", "list"])
    assert listed.exit_code == 0 and "queued" not in said(listed)


def test_ablate_trains_each_variant_per_seed_and_prints_the_table(cli_env: Path, tmp_path: Path) -> None:
    tiny = json.dumps({"name": "tiny", "config": TINY_TRAINING["model"]["config"]})
    out = tmp_path / "ablations.json"
    result = runner.invoke(
        app,
        ["train", "ablate", "--snapshot", "snap/tiny", "--seeds", "0,1", "--variants", "panel-only,all-mixed",
         "--set", f"model={tiny}", "--set", 'batch_sizes={"figure": 2, "panel": 3, "region": 4}',
         "--set", "warmup_steps=0", "--max-steps", "2", "--eval-split", "train", "--json-out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [(r["variant"], r["seed"]) for r in doc["rows"]] == [
        ("untrained", None), ("panel-only", 0), ("panel-only", 1), ("all-mixed", 0), ("all-mixed", 1)
    ]  # fmt: skip
    assert all(r["steps"] == 2 for r in doc["rows"][1:]) and all(
        r["status"] == "completed" for r in doc["rows"][1:]
    )
    assert [s["variant"] for s in doc["summary"]] == ["untrained", "panel-only", "all-mixed"]
    assert "| panel-only | 2 |" in result.output and "±" in result.output
    bad = runner.invoke(app, ["train", "ablate", "--snapshot", "snap/tiny", "--variants", "pixels-only"])
    assert bad.exit_code == 2 and "unknown ablation variant" in said(bad)


def test_summary_gives_mean_and_sample_std_per_variant() -> None:
    rows = [
        {"variant": "a", "seed": 0, "region i2t R@10": 0.2},
        {"variant": "a", "seed": 1, "region i2t R@10": 0.4},
        {"variant": "b", "seed": 0, "region i2t R@10": 0.5},
    ]
    summary = summarize(rows, metrics=("region i2t R@10",))
    assert summary[0]["region i2t R@10"]["mean"] == pytest.approx(0.3)
    assert summary[0]["region i2t R@10"]["std"] == pytest.approx(0.1414, abs=1e-4)
    assert summary[1] == {"variant": "b", "runs": 1, "region i2t R@10": {"mean": 0.5, "std": 0.0}}
    table = markdown_table(summary, metrics=("region i2t R@10",))
    assert "| a | 2 | 0.300 ± 0.141 |" in table and "| b | 1 | 0.500 |" in table


def test_metrics_table_reads_in_recall_order_with_n_and_chance() -> None:
    from rich.console import Console

    from p2p.cli.train_cmd import metrics_table

    def row(shift: float) -> dict[str, float | int]:
        values: dict[str, float | int] = {"panel n": 20, "region n": 4, "zero-shot n": 30}
        values["zero-shot classes n"] = 4
        for task in ("panel", "region"):
            for direction in ("i2t", "t2i"):
                for k in (1, 5, 10):
                    values[f"{task} {direction} R@{k}"] = 0.1 * k / 10 + shift
        values["zero-shot acc"] = 0.5 + shift
        values["zero-shot bal acc"] = 0.4 + shift
        return values

    trained, untrained = row(0.1), row(0.0)
    improved = {k: True for k in trained if not k.endswith(" n")}
    table = metrics_table(
        {"split": "val+test", "trained": trained, "untrained": untrained, "improved": improved}
    )
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    lines = [line for line in console.export_text().splitlines() if "R@" in line or "zero-shot" in line]
    metrics = [line.split("│")[1].strip() for line in lines]
    assert metrics[:3] == ["panel i2t R@1", "panel i2t R@5", "panel i2t R@10"]
    assert metrics[-2:] == ["zero-shot acc", "zero-shot bal acc"]
    cells = {m: [c.strip() for c in line.split("│")[2:4]] for m, line in zip(metrics, lines, strict=True)}
    assert cells["panel i2t R@5"] == ["20", "0.250"]  # n and chance: 5 of 20 candidates
    assert cells["region t2i R@10"] == ["4", "1.000"]  # k past n: chance is certainty
    assert cells["zero-shot bal acc"] == ["30", "0.250"]  # one of four classes
