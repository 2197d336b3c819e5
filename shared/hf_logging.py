"""Keep transformers' weight-loading report for the cases that matter.

Loading the packaged all-MiniLM-L6-v2 into a bare BertModel leaves its sentence-transformers pooler
weights unused, and transformers prints a coloured "LOAD REPORT" table of those UNEXPECTED keys as a
warning on every load: it reads like an error and is expected. A report naming missing or
mismatched weights is still shown.
"""

from __future__ import annotations

import logging

REPORT_LOGGERS = ("transformers.modeling_utils", "transformers.modeling_layers")
_SERIOUS = ("MISSING", "MISMATCH", "CONVERSION")


class ExpectedLoadReportFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        return any(word in message for word in _SERIOUS)


def quiet_expected_load_reports() -> None:
    """Install the filter once per process (idempotent)."""
    for name in REPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedLoadReportFilter) for f in logger.filters):
            logger.addFilter(ExpectedLoadReportFilter())
