"""Build a registry backend from operator options (shared by the agent and the worker).

``layout``: OCI layouts under that directory (the embedded default); otherwise the
Distribution API over HTTP, with plain HTTP for the listed hosts (loopback always) and
basic credentials read from files (never from the command line itself).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from drivers.registry.auth import Credentials
from drivers.registry.client import RegistryClient
from drivers.registry.layout import OciLayout
from drivers.registry.port import Registry
from drivers.registry.transport import RegistrySettings


def registry_from_options(*, layout: str | None, plain_http: Iterable[str] = (),
                          credentials: Iterable[tuple[str, str, str]] = ()) -> Registry:
    """``credentials``: (host, user, password file) triples."""
    if layout:
        return OciLayout(Path(layout))
    creds = {host: Credentials(user, Path(path).read_text().strip())
             for host, user, path in credentials}
    return RegistryClient(RegistrySettings(plain_http=frozenset(plain_http),
                                           credentials=creds))
