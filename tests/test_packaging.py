"""The installed package (what the Docker images `pip install`) carries the files the code loads
at run time: model weights, prompts, the migration template and the viewer."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOADED_AT_RUN_TIME = (
    *(
        f"p2p/mining/cpu/{model.name}"
        for model in sorted((ROOT / "services/mining/cpu").iterdir())
        if model.suffix in (".json", ".pt")
    ),
    "p2p/mining/lvlm/prompt_files/panels.txt",
    "p2p/shared/migrations/script.py.mako",
    "p2p/embedding_api/static/index.html",
    "p2p/embedding_api/static/viewer.js",
    "p2p/models/modeling.py",  # the packages outside services/
    "p2p/apps/worker.py",
)


def test_the_wheel_carries_the_data_files_the_code_loads(tmp_path: Path) -> None:
    # Built from a copy of what the Dockerfiles copy: a build folder left in the checkout would
    # carry files into the wheel that the package data no longer names.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in sorted({Path(d).parts[0] for d in package_dirs.values()}):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("panel2patch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [name for name in LOADED_AT_RUN_TIME if name not in names] == []
    shipped = (ROOT / "services/mining/artifacts/marker_net.pt").read_bytes()
    assert zipfile.ZipFile(wheel).read("p2p/mining/artifacts/marker_net.pt") == shipped
