"""`p2p demo` serving, as `make demo` runs it, and the README's client examples run against it.

One `p2p demo --synthetic 0 --train-steps 0` process on a fresh data folder (embedded PostgreSQL,
local objects, in-process queue) serves the ingest API and the embedding API with the viewer; the
README's curl block and Python block are read from the README itself (so they cannot drift from
what is tested) and run against it; the demo then stops on Ctrl-C and leaves no database running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
P2P = Path(sys.executable).parent / "p2p"
START_TIMEOUT_S = 900


def readme_block(language: str) -> str:
    """The one fenced block of ``language`` in the README's client section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Using the APIs", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"the client section should hold one {language} block"
    return str(blocks[0])


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return int(port)
    raise RuntimeError("no two free consecutive ports")


@dataclass
class Demo:
    process: subprocess.Popen[str]
    data_dir: Path
    log: Path
    ingest: str
    search: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                return self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return int(self.process.returncode)


def wait_ready(demo: Demo) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if demo.process.poll() is not None:
            raise AssertionError(f"p2p demo exited with {demo.process.returncode}:\n{demo.output()[-6000:]}")
        try:
            if all(
                httpx.get(f"{url}/readyz", timeout=5).status_code == 200 for url in (demo.ingest, demo.search)
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"p2p demo did not serve in time:\n{demo.output()[-6000:]}")


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    # Not under pytest's 0700 temp root: the embedded PostgreSQL runs as its own system user when
    # the tests run as root (see tests/conftest.py).
    data_dir = Path(tempfile.mkdtemp(prefix="p2p-demo-serve-"))
    data_dir.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2P_")}
    env |= {"P2P_DATA_DIR": str(data_dir / ".p2p-data"), "P2P_LOG_LEVEL": "INFO"}
    port = free_port_pair()
    log = data_dir / "demo.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(P2P), "demo", "--synthetic", "0", "--train-steps", "0", "--port", str(port)],
            cwd=data_dir,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    running = Demo(process, data_dir, log, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}")
    try:
        wait_ready(running)
        yield running
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def run_block(demo: Demo, argv: list[str], script: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"INGEST": demo.ingest, "SEARCH": demo.search}
    done = subprocess.run(
        [*argv, script], cwd=demo.data_dir, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    return done


def test_demo_serves_both_apis_and_the_viewer(demo: Demo) -> None:
    said = demo.output()
    assert "ingested 10, duplicates 0, failed 0" in said
    found = re.search(
        # an untrained vision tower (--train-steps 0) scores near zero, either side of it
        r"search 'fluorescence micrograph of cells' \(panels\), best 3:\n  -?\d\.\d{3}  panel ",
        said,
    )
    assert found, said[said.find("search '") - 200 :][:2000] if "search '" in said else said[-3000:]
    assert "embedding API: profile=embedded" in said and "AUTH DISABLED" in said
    page = httpx.get(f"{demo.search}/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    figures = httpx.get(f"{demo.ingest}/v1/figures", params={"limit": 1}).json()
    viewer = httpx.get(f"{demo.search}/figures/{figures[0]['id']}")
    assert viewer.status_code == 200 and "text/html" in viewer.headers["content-type"]
    hits = httpx.post(f"{demo.search}/v1/search", json={"text": "liver", "k": 3}).json()["hits"]
    assert len(hits) == 3 and all(hit["level"] == "panel" for hit in hits)
    assert httpx.get(f"{demo.ingest}{hits[0]['crop_url']}").status_code == 200


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_readme_curl_examples_store_the_caption_as_written(demo: Demo) -> None:
    block = readme_block("sh")
    caption = re.search(r"--form-string '(?:caption=)(.*?)'", block)
    assert caption is not None
    caption_text = caption.group(1)
    assert ";" in caption_text and caption_text.startswith("(A)")  # the two cases curl -F breaks
    done = run_block(demo, ["bash", "-c"], "set -euo pipefail\n" + block)
    assert "succeeded" in done.stdout, done.stdout
    upload = json.loads((demo.data_dir / "upload.json").read_text())
    stored = httpx.get(f"{demo.ingest}/v1/figures/{upload['figure_id']}").json()
    assert stored["caption"] == caption_text
    assert stored["status"] == "mined" and stored["panels"]
    assert stored["article"]["pmcid"] == "PMC9000042"


def test_readme_python_example_runs(demo: Demo) -> None:
    done = run_block(demo, [sys.executable, "-c"], readme_block("python"))
    assert done.stdout.startswith("job succeeded"), done.stdout
    assert "best crop: image/" in done.stdout


def test_demo_stops_on_ctrl_c_and_leaves_no_database_running(demo: Demo) -> None:
    assert demo.stop() == 0, demo.output()[-4000:]
    assert "Application shutdown complete" in demo.output()
    assert not (demo.data_dir / ".p2p-data" / "pg" / "postmaster.pid").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_passes_its_port_and_run_size_to_p2p_demo() -> None:
    """`make demo PORT=9000 ...` runs the same `p2p demo` as the tests above, with those options
    (make -n prints the command without running it; the venv stamp is touched so no install runs)."""
    stamp = ROOT / ".venv" / ".installed"
    if not stamp.exists():
        pytest.skip("no installed .venv in this checkout")
    done = subprocess.run(
        [
            "make",
            "-n",
            "-o",
            str(stamp.relative_to(ROOT)),
            "demo",
            "PORT=9000",
            "SYNTHETIC=300",
            "TRAIN_STEPS=0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    command = " ".join(done.stdout.replace("\\\n", " ").split())
    assert "p2p demo --port 9000 --synthetic 300 --train-steps 0" in command
