"""`p2p`: the command line of Panel2Patch."""

from p2p.cli.main import app

__all__ = ["app"]
