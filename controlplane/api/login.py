"""Signing a browser in to the pages: a one-time link, and the session cookie it opens.

``cpctl serve`` prints ``http://HOST:PORT/login?code=CODE``: opening it once (within
:data:`CODE_SECONDS`) answers ``303`` to the dashboard with an ``HttpOnly``,
``SameSite=Strict`` cookie naming a session. The session opens the API's **reads** (GET
and HEAD) for :data:`SESSION_SECONDS`: what the pages fetch. Anything that changes state
still needs the bearer token, so a page of another site can neither read (same-origin
policy) nor make a change with the cookie. A used, unknown or expired code answers
``303`` to ``/?signin=expired``, where the page's sign-in form says so and asks for the
token instead (``static/token.js``).

Codes and sessions live in this process only (a restarted server forgets them: sign in
again). No HTTP here (the import contract keeps aiohttp to the serving modules): made by
:func:`controlplane.cli.serve.serve_cmd`, used by :mod:`controlplane.api.app`'s auth
middleware and its ``/login`` route.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import datetime, timedelta

#: How long the printed link stays usable (it is also spent by its first use).
CODE_SECONDS = 15 * 60
#: How long a browser stays signed in by the cookie.
SESSION_SECONDS = 12 * 3600
COOKIE = "controlplane_session"
PATH = "/login"


class Login:
    """The one-time code of this server's sign-in link and the sessions it opened.

    ``secret()`` makes a fresh unguessable string (the code's and each session's);
    ``issued``: when the code was made (its clock starts then)."""

    def __init__(self, secret: Callable[[], str], issued: datetime) -> None:
        self._secret = secret
        self._code: str | None = secret()[:32]  # 128 bits: short to print, spent at once
        self._code_expires = issued + timedelta(seconds=CODE_SECONDS)
        self._sessions: dict[str, datetime] = {}  # session -> when it expires

    @property
    def code(self) -> str | None:
        """The link's code; ``None`` once spent."""
        return self._code

    def redeem(self, code: str, now: datetime) -> str | None:
        """A new session for the code, which is then spent; ``None`` if it is not (or no
        longer) this server's code."""
        if self._code is None or now >= self._code_expires or \
                not hmac.compare_digest(code.encode(), self._code.encode()):
            return None
        self._code = None
        session = self._secret()
        self._sessions[session] = now + timedelta(seconds=SESSION_SECONDS)
        return session

    def valid(self, session: str, now: datetime) -> bool:
        """Whether ``session`` (a cookie's value) is an open session; compared with every
        session, so the time taken tells nothing."""
        offered, found = session.encode(), False
        for known, expires in list(self._sessions.items()):
            if expires <= now:
                del self._sessions[known]
            elif hmac.compare_digest(offered, known.encode()):
                found = True
        return found
