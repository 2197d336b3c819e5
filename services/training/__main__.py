"""``python -m p2p.training --config run.json --data snap/v1 --out runs/r1 [--store DIR]``.

Trains a hierarchical CLIP model on an exported snapshot (see :mod:`p2p.training.runner`) and resumes
from ``{out}/latest.json`` when a checkpoint exists. Works under ``torchrun`` as well: with
``WORLD_SIZE`` > 1 it joins the process group (gloo on CPU, nccl on GPU, one GPU per local rank).
SIGINT/SIGTERM stop the run cleanly after the current step (a checkpoint is written first).
Exit status: 0 completed or stopped, 1 failed (non-finite loss), 2 bad config, data or checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from p2p.shared.runtime import build_store
from p2p.shared.settings import Settings
from p2p.shared.storage import LocalObjectStore, ObjectStore
from p2p.training.trainer_process import die_with_parent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m p2p.training",
        description="Train a hierarchical (figure -> panel -> region) CLIP model from exported shards.",
    )
    parser.add_argument("--config", type=Path, help="TrainConfig as JSON (default: all defaults)")
    parser.add_argument("--data", "--data-prefix", dest="data", required=True, help="snapshot prefix")
    parser.add_argument("--out", "--out-prefix", dest="out", required=True, help="checkpoint prefix")
    parser.add_argument(
        "--store", type=Path, help="a local object-store folder (default: the configured store, P2P_* env)"
    )
    parser.add_argument("--split", default="train")
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints")
    parser.add_argument("--keep-checkpoints", type=int, default=3, help="committed checkpoints to keep")
    parser.add_argument("--progress-every", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--shuffle-buffer", type=int, default=1000, help="samples; 0 keeps export order")
    parser.add_argument("--device", help="override the config's device (e.g. cpu, cuda)")
    return parser


def _store(path: Path | None) -> ObjectStore:
    if path is not None:
        return LocalObjectStore(path)

    return build_store(Settings())


def _init_distributed(device: str) -> tuple[str, bool]:
    """Join the torchrun process group when WORLD_SIZE > 1; the device this rank trains on."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return device, False
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    torch.distributed.init_process_group(backend=backend)
    return device, True


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # torch and the trainer load after the arguments parse: `--help` and usage errors answer at once.
    import torch

    from p2p.training.checkpoints import CheckpointError
    from p2p.training.config import TrainConfigError, load_config
    from p2p.training.dataset import DatasetError
    from p2p.training.runner import run_training

    try:
        data: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
        config = load_config(data)
    except (OSError, json.JSONDecodeError, TrainConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device, distributed = _init_distributed(args.device or config.device)
    if device != config.device:
        config = config.model_copy(update={"device": device})
    rank = int(os.environ.get("RANK", "0"))

    stop = {"requested": False}

    def request_stop(signum: int, _frame: Any) -> None:
        stop["requested"] = True
        logging.getLogger(__name__).warning("signal %d: stopping after the current step", signum)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    die_with_parent()

    def progress(info: dict[str, Any]) -> None:
        print(json.dumps({"event": "progress", **info}, default=str), flush=True)

    try:
        result = run_training(
            store=_store(args.store),
            data_prefix=args.data,
            out_prefix=args.out,
            config=config,
            progress=progress,
            should_stop=lambda: stop["requested"],
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            progress_every=args.progress_every,
            shuffle_buffer=args.shuffle_buffer,
            split=args.split,
        )
    except (DatasetError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if distributed:
            torch.distributed.destroy_process_group()
    if rank == 0:
        doc = {"event": "result", **{k: v for k, v in vars(result).items()}}
        print(json.dumps(doc, default=str), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
