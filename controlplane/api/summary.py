"""The summary page's routes (issue 24, item 4: charts from the reporting views).

:func:`add_routes` is called by :func:`controlplane.api.app.make_app`; it registers
nothing yet.
"""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application) -> None:
    """Register the summary page's routes on ``app`` (none yet)."""
