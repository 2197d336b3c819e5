"""`p2p synth`: write synthetic compound figures with ground truth.

The owner registers ``synth_command`` on the main app: ``app.command("synth")(synth_command)``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer


def synth_command(
    out: Annotated[Path, typer.Argument(help="Folder for NAME.png|jpg + NAME.json and annotations.json.")],
    count: Annotated[int, typer.Option(help="How many figures.", min=1)] = 100,
    seed: Annotated[int, typer.Option(help="Same seed -> byte-identical outputs.")] = 0,
    size: Annotated[
        str, typer.Option(help="Canvas WIDTHxHEIGHT before the random rescale (classic profile).")
    ] = "1000x800",
    profile: Annotated[
        str,
        typer.Option(
            help="classic: a grid of one picture or chart per cell; realistic: figures composed as "
            "real ones are (grids with headers under one letter, blots with charts, diagrams, "
            "headings, colour bars; 350-7,000 px, JPEG web copies, transparent PNGs)."
        ),
    ] = "classic",
) -> None:
    """Generate synthetic compound figures (panels, labels, markers, captions) with exact ground truth."""
    # Imported here so that `p2p --help` does not pay for matplotlib and scikit-image.
    from p2p.mining.lab.synth.dataset import parse_size, write_dataset
    from p2p.mining.lab.synth.figure import PROFILES

    if profile not in PROFILES:
        raise typer.BadParameter(f"must be one of {', '.join(PROFILES)}", param_hint="--profile")
    try:
        dims = parse_size(size)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--size") from exc
    started = time.perf_counter()
    paths = write_dataset(Path(out), count, seed, size=dims, profile=profile)
    elapsed = time.perf_counter() - started
    per = elapsed / max(1, len(paths))
    typer.echo(
        f"wrote {len(paths)} figures + annotations.json to {out} in {elapsed:.1f} s ({per:.2f} s/figure)"
    )
