"""The operator's commands to a running machine: ``Cancel`` (every kind) and
``Retarget`` (a migration). Sent by ``cpctl cancel``/``retarget``, the HTTP API and the
front door through ``app.operations.send_command``; each kind's ``accept`` decodes them
with its ``CommandSet`` (:mod:`controlplane.engine.commands`). A kind's own commands live
with it (the drain's ``NodePodsListed``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.commands import Command


@dataclass(frozen=True)
class Cancel(Command):
    """Stop the operation as safely as its phase allows (recorded as ``{}``)."""


@dataclass(frozen=True)
class Retarget(Command):
    """Move a running migration to another node (``{"node": name}``)."""

    node: str
