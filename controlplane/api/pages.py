"""What the HTML pages (the dashboard at ``/``, the summary at ``/summary``) share: the
document around their inline style and script, the CSP that lets exactly those run, the
headers they are served with, the token hand-off and sign-in form, and the links between
them.

The token arrives once as ``?token=``, or through the sign-in form a page shows in place
of its panels when the API answers 401; :data:`TOKEN_JS` drops it from the address bar
and keeps it in this tab's ``sessionStorage`` (never the URL, never a log line), so a link
from one page to the other keeps working without it in the URL. Without a token, the
cookie of ``cpctl serve``'s one-time sign-in link opens the reads (:mod:`.login`).

The pages' CSS and JavaScript are package files, ``controlplane/api/static/*.css|js`` (so
editors, linters and diffs see them as CSS and JavaScript), read once at import by
:func:`asset` and still inlined: the CSP hashes the exact text the page carries.
"""

from __future__ import annotations

import base64
import hashlib
from importlib.resources import files


def csp_hash(source: str) -> str:
    """The CSP source expression admitting exactly this inline script or style."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def asset(name: str) -> str:
    """The text of ``static/<name>`` (package data, in the wheel), after a newline: an
    inline ``<style>``/``<script>`` body starts on a line of its own."""
    return "\n" + (files(__package__) / "static" / name).read_text(encoding="utf-8")


#: ``takeToken(url)``: the token from ``url``'s ``?token=`` (remembered for this tab and
#: removed from ``url``), else the one this tab remembered; "" when there is none.
#: ``bearer(token)``: the fetch headers (none without a token: the cookie then speaks).
#: ``signIn(refused)``: the sign-in form in place of the page's panels.
TOKEN_JS = asset("token.js")

#: The header's links between the pages (the token follows in ``sessionStorage``).
NAV_HTML = ('<nav aria-label="pages"><a href="/">operations</a> · '
            '<a href="/summary">summary</a></nav>')
#: Their style, for a dark header; and the sign-in form's (``static/token.js``).
NAV_CSS = ("header nav a{color:#fff}header nav{margin-left:auto;font-weight:400}"
           "[hidden]{display:none!important}"
           "#sign-in{max-width:34em;margin:2em auto;background:#fff;border:1px solid #d8dce3;"
           "border-radius:6px;padding:16px 20px}#sign-in input{width:22em;margin:0 8px}")


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
