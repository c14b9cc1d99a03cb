"""Registry authentication: credentials, ``WWW-Authenticate`` challenges, token cache. Pure.

The flow (Docker/OCI token auth), driven by :mod:`drivers.registry.transport`:

1. a request goes out with what we already hold for that host and scope (nothing, a
   ``Basic`` header once the host asked for it, or a cached bearer token);
2. a ``401`` carries a challenge: ``Basic realm=...`` -> retry with the credentials;
   ``Bearer realm=...,service=...,scope=...`` -> GET the realm with ``service`` and
   ``scope`` (with basic credentials if we have them, anonymously otherwise), take
   ``token`` (or ``access_token``) and retry with ``Authorization: Bearer``;
3. a second ``401`` means the credentials are wrong (or the token endpoint gave a token
   without the scope: ``error="insufficient_scope"``, which we report as forbidden).

Tokens are cached per (host, scope) until shortly before they expire.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

_PARAM = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')
DEFAULT_TOKEN_SECONDS = 60.0  # the token spec's default when expires_in is absent
EXPIRY_MARGIN = 10.0


@dataclass(frozen=True)
class Credentials:
    """Basic credentials (also sent to a token endpoint), or a fixed bearer token."""

    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)  # a pre-issued bearer token (no challenge)

    @property
    def basic(self) -> str | None:
        if not self.username:
            return None
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


ANONYMOUS = Credentials()


@dataclass(frozen=True)
class Challenge:
    """One parsed ``WWW-Authenticate`` header."""

    scheme: str  # "basic" | "bearer" (lowercase)
    params: dict[str, str]

    @property
    def realm(self) -> str:
        return self.params.get("realm", "")

    @property
    def scope(self) -> str:
        return self.params.get("scope", "")

    @property
    def insufficient_scope(self) -> bool:
        return self.params.get("error", "") == "insufficient_scope"


def parse_challenge(header: str) -> Challenge | None:
    """``Bearer realm="...",service="..."`` -> :class:`Challenge` (``None`` if unreadable)."""
    header = header.strip()
    if not header:
        return None
    scheme, _, rest = header.partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        match = _PARAM.match(rest, pos)
        if match is None or match.end() == pos:
            break
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else (bare or "")
        params[match.group(1).lower()] = value
        pos = match.end()
    return Challenge(scheme.lower(), params)


@dataclass
class TokenCache:
    """Bearer tokens by (host, scope), each with its expiry on a monotonic clock."""

    _tokens: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)

    def get(self, host: str, scope: str, now: float) -> str | None:
        found = self._tokens.get((host, scope))
        if found is None or found[1] <= now:
            return None
        return found[0]

    def put(self, host: str, scope: str, token: str, expires_in: float, now: float) -> None:
        self._tokens[(host, scope)] = (token, now + max(expires_in - EXPIRY_MARGIN, 1.0))

    def drop(self, host: str, scope: str) -> None:
        self._tokens.pop((host, scope), None)


def request_scope(repository: str, *, push: bool, delete: bool = False) -> str:
    """The scope a request on ``repository`` (path within the registry) needs."""
    actions = "delete" if delete else "pull,push" if push else "pull"
    return f"repository:{repository}:{actions}"


def canonical_scope(scope: str) -> str:
    """``scope`` with each entry's actions sorted: registries may list them in any order
    (distribution builds its challenge from a Go map), and a token request should not
    depend on that (``repository:team/app:push,pull`` -> ``...:pull,push``)."""
    entries = []
    for entry in scope.split():
        head, sep, actions = entry.rpartition(":")
        entries.append(f"{head}:{','.join(sorted(actions.split(',')))}" if sep else entry)
    return " ".join(entries)
