"""Structured logging (structlog): JSON lines in production, readable in a terminal.

``configure`` is called once by the CLI; the worker binds every line to the machine id,
kind, phase and event seq it concerns. structlog itself is imported by the first
:func:`get_logger`, so a verb that never logs (``cpctl list``, ``get``, ``history``)
does not pay for it at start-up (~50 ms of ~0.45 s).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import structlog

LogFormat = Literal["auto", "json", "console"]

#: What ``configure`` asked for and has not yet been applied (no logger asked for yet).
_pending: tuple[LogFormat, str] | None = None


def configure(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Log as ``fmt`` at ``level`` from now on: applied at once when structlog is in use
    already, else at the first :func:`get_logger`."""
    global _pending
    _pending = (fmt, level)
    if "structlog" in sys.modules:
        _apply()


def _apply() -> None:
    global _pending
    if _pending is None:
        return
    (fmt, level), _pending = _pending, None
    import structlog

    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def reset() -> None:
    """Forget a ``configure`` not yet applied (tests put logging back between cases)."""
    global _pending
    _pending = None


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    import structlog

    _apply()
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
