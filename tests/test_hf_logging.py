"""transformers' expected LOAD REPORT (unused pooler weights of the packaged MiniLM) stays quiet."""

from __future__ import annotations

import logging

import pytest

from p2p.models.modeling import default_spec, load_model
from p2p.shared.hf_logging import quiet_expected_load_reports


def test_loading_the_default_model_prints_no_load_report(capfd: pytest.CaptureFixture[str]) -> None:
    # transformers logs through its own stderr handler (its loggers do not propagate to the root)
    load_model(default_spec())
    captured = capfd.readouterr()
    assert "LOAD REPORT" not in captured.err + captured.out


def test_a_report_of_missing_weights_is_still_shown(caplog: pytest.LogCaptureFixture) -> None:
    quiet_expected_load_reports()
    logger = logging.getLogger("transformers.modeling_utils")
    with caplog.at_level(logging.WARNING):
        logger.warning("BertModel LOAD REPORT from: x\nKey | Status\npooler.dense.bias | UNEXPECTED")
        logger.warning("BertModel LOAD REPORT from: x\nKey | Status\nencoder.weight | MISSING")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "MISSING" in said[0]
