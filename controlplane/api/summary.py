"""The summary page: the reporting views as pictures.

:func:`add_routes` is called by :func:`controlplane.api.app.make_app`. ``GET /summary``
is a page that holds no data, like the dashboard: its script reads the token from
``?token=`` (then drops it from the address bar) or the sign-in form it shows in place of
the charts when the API answers 401 (the sign-in link's cookie also opens the charts),
and fetches each chart,
``GET /api/v1/charts/{name}.svg`` (Bearer token; ``?drain=<id>`` picks the drain of the
drain chart), server-rendered by :mod:`controlplane.api.summary_charts`. The SVG is
parsed as XML and placed inline (so its ``<title>``/``<desc>`` reach a screen reader);
scripts and styles run only if the CSP's hashes name them. The page's own style and script
are ``static/summary.css`` and ``static/summary.js``, inlined.
"""

from __future__ import annotations

from aiohttp import web

from controlplane.api import summary_charts
from controlplane.api.charts import render
from controlplane.api.keys import CLOCK_KEY, DB_KEY
from controlplane.api.pages import NAV_CSS, TOKEN_JS, asset, page_csp, page_headers, page_html

#: ``static/summary.css`` and the header links' style.
STYLE = asset("summary.css") + NAV_CSS

#: ``static/summary.js`` with the token hand-off in place of ``__TOKEN_JS__``.
SCRIPT = asset("summary.js").replace("__TOKEN_JS__", TOKEN_JS)


#: Only this page's own script and style run; it talks only to its own origin.
CSP = page_csp(SCRIPT, STYLE)

_FIGURES = "\n".join(
    f'<figure data-chart="{name}"><div class="chart-box"></div>'
    f'<div class="error" role="alert"></div></figure>' for name in summary_charts.NAMES)

PAGE = page_html("controlplane summary", STYLE, "<span>controlplane — summary</span>",
                 _FIGURES, SCRIPT)

PATH = "/summary"


def add_routes(app: web.Application) -> None:
    """Register ``GET /summary`` (public, in ``keys.PUBLIC_PATHS``: a page without data,
    as ``/``) and
    ``GET /api/v1/charts/{name}.svg`` (behind the token, as every API route)."""
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", headers=page_headers(CSP))

    async def chart(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in summary_charts.NAMES:
            raise web.HTTPNotFound(
                reason=f"no chart {name!r} (charts: {', '.join(summary_charts.NAMES)})")
        drain = request.query.get("drain") or None
        try:
            built = await summary_charts.load(request.app[DB_KEY], name, drain=drain,
                                              now=request.app[CLOCK_KEY].now())
        except summary_charts.NoSuchDrain:
            raise web.HTTPNotFound(reason=f"no drain {drain!r}") from None
        svg = render(built)
        return web.Response(text=svg, content_type="image/svg+xml",
                            headers={"Cache-Control": "no-store",
                                     "Content-Security-Policy": "default-src 'none'",
                                     "X-Content-Type-Options": "nosniff"})

    app.router.add_get(PATH, page)
    app.router.add_get("/api/v1/charts/{name}.svg", chart)
