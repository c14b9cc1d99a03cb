"""What the HTML pages (the dashboard at ``/``, the summary at ``/summary``) share: the
document around their inline style and script, the CSP that lets exactly those run, the
headers they are served with, the token hand-off, and the links between them.

The token arrives once as ``?token=``; :data:`TOKEN_JS` drops it from the address bar
and keeps it in this tab's ``sessionStorage`` (never the URL, never a log line), so a link
from one page to the other keeps working without it in the URL.
"""

from __future__ import annotations

import base64
import hashlib


def csp_hash(source: str) -> str:
    """The CSP source expression admitting exactly this inline script or style."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


#: ``takeToken(url)``: the token from ``url``'s ``?token=`` (remembered for this tab and
#: removed from ``url``), else the one this tab remembered; "" when there is none.
TOKEN_JS = r"""
  function takeToken(url) {
    const given = url.searchParams.get("token");
    url.searchParams.delete("token");
    try {
      if (given) window.sessionStorage.setItem("controlplane.token", given);
      return given || window.sessionStorage.getItem("controlplane.token") || "";
    } catch (err) { return given || ""; }  // storage off: this page only
  }
"""

#: The header's links between the pages (the token follows in ``sessionStorage``).
NAV_HTML = ('<nav aria-label="pages"><a href="/">operations</a> · '
            '<a href="/summary">summary</a></nav>')
#: Their style, for a dark header.
NAV_CSS = "header nav a{color:#fff}header nav{margin-left:auto;font-weight:400}"


def page_csp(script: str, style: str, *, images: bool = False) -> str:
    """Only this page's own script and style run (by hash); it talks only to its own
    origin, is never framed, and (``images``) may show its own or ``data:`` images."""
    return (f"default-src 'none'; script-src {csp_hash(script)}; "
            f"style-src {csp_hash(style)}; connect-src 'self'; "
            + ("img-src 'self' data:; " if images else "")
            + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page_html(title: str, style: str, header: str, main: str, script: str) -> str:
    """The whole document: ``header`` (with the links between the pages), ``main``."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style></head>
<body>
<header>{header}{NAV_HTML}</header>
<main>
{main}
</main>
<script>{script}</script>
</body></html>
"""


def page_headers(csp: str) -> dict[str, str]:
    """How a page is served: under its CSP, never cached, sending no referrer."""
    return {"Content-Security-Policy": csp, "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store"}
