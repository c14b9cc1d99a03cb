"""Who asked: the identity recorded on every event a person causes.

Submit, cancel, retarget and wake are recorded with their requester in the event's
``worker_id`` column (``cpctl history`` shows it as "by"; reports group by it), so an
operator reading history sees who asked, not only what happened:

- the CLI: ``user@host`` of the OS account that ran ``cpctl``, followed by
  ``kube:<user>`` when it reached the cluster through a kubeconfig (the user entry of the
  kubeconfig's current, or chosen, context: the Kubernetes identity it acted as);
- the HTTP API: ``token:<name>``, the name of the bearer token that authenticated the
  request (never the token itself);
- a drain's children: ``drain:<drain id>``, the drain that submitted them.

Events a worker records carry the worker's id instead. The column holds 128 characters;
a longer identity is cut (with "…").
"""

from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path
from typing import Any

import yaml

LIMIT = 128  # the events.worker_id column


def _cut(text: str) -> str:
    return text if len(text) <= LIMIT else text[:LIMIT - 1] + "…"


def os_identity() -> str:
    """``user@host`` of the account running this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def kube_user(kubeconfig: str | None, context: str | None = None) -> str | None:
    """The user entry name of the kubeconfig's context (``context`` or the current one),
    or ``None`` without a readable kubeconfig."""
    if not kubeconfig:
        return None
    try:
        config: Any = yaml.safe_load(Path(kubeconfig).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    wanted = context or config.get("current-context")
    for entry in config.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == wanted:
            inner = entry.get("context")
            user = inner.get("user") if isinstance(inner, dict) else None
            return str(user) if user else None
    return None


def cli_requester(kubeconfig: str | None = None, context: str | None = None,
                  in_cluster: bool = False) -> str:
    """The CLI's requester: ``user@host``, plus the Kubernetes identity it acts as."""
    who = os_identity()
    if in_cluster:
        return _cut(f"{who} kube:serviceaccount")
    user = kube_user(kubeconfig, context)
    return _cut(f"{who} kube:{user}" if user else who)


def token_requester(name: str) -> str:
    """The HTTP API's requester: the authenticating token's name."""
    return _cut(f"token:{name}")


def drain_requester(drain_id: str) -> str:
    """Who submitted a drain's child: the drain."""
    return _cut(f"drain:{drain_id}")
