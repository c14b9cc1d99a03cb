"""How a migration moves memory: its mode, and which modes a node kind can take. Pure.

- ``stop-and-copy`` (the default): the source is frozen, dumped whole, and restored on the
  target from that dump. Every node kind takes it.
- ``precopy``: pre-dump rounds copy memory while the process runs, then a last short dump
  copies what changed since. It needs CRIU driven by the node agent (CRI-O restores whole
  checkpoint images through the CRI, so a CRI-O node cannot) and the kernel's dirty-page
  tracking on the source node, which only the node's agent can see: it refuses the capture
  before anything is frozen when the kernel lacks it (``docs/runtime.md``).
- ``lazy`` (post-copy): the source dumps everything but memory and serves its pages; the
  target runs at once while CRIU's ``lazy-pages`` daemon fetches them; the source is
  removed only after every page arrived. No memory is pushed to the registry, so from
  the moment the target runs until the last page arrives, losing either node loses the
  workload (``docs/runtime.md``, *Migration modes*). A CRI-O target restores from a
  checkpoint image without memory, which its agent pushes where the restore pod names it
  (:func:`lazy_checkpoint_images`). It needs the agents' handoff (the capture request
  carries ``capture-handoff``) and plain TCP for the pages: a sealed class is refused at
  submission.

A migration names its mode in ``spec.mode`` (``cpctl migrate --mode``, the ``Migration``
resource's ``spec.mode``); a checkpoint class may set the default for its migrations
(``migration_mode``). The capture request carries a mode other than stop-and-copy to the
agent (:data:`~controlplane.machines.contract.protocol.CAPTURE_MODE`).

A class also says how the checkpoint travels (``transfer``): ``registry`` (the default:
the target's agent pulls the pushed artifact after the source is deleted) or ``stream``
(the source's agent hands the archives straight to the target's while it pushes; the
source stays frozen until the target runs verified against the registry's copy:
``docs/protocol.md``, *Handoff*). Only a stop-and-copy migration between agent nodes of a
bare pod or a ReplicaSet's pod streams; the others keep the registry path.

Used by the migration request and decider, the class parser and the submission checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TypeVar

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonValue
from controlplane.machines.config.runtimes import RestorePath

E = TypeVar("E", bound=StrEnum)


class MigrationMode(StrEnum):
    STOP_AND_COPY = "stop-and-copy"
    PRECOPY = "precopy"
    LAZY = "lazy"


DEFAULT_MODE = MigrationMode.STOP_AND_COPY
_MEANINGS = {
    MigrationMode.STOP_AND_COPY: "freeze, dump whole, restore (the default)",
    MigrationMode.PRECOPY: "copy memory while the process runs, then a short last dump",
    MigrationMode.LAZY: "dump all but memory, run on the target at once, fetch the pages "
                        "after (post-copy)",
}


def parse_mode(value: JsonValue, *, field: str) -> MigrationMode:
    """``value`` as a mode, or a refusal naming ``field`` and the modes there are."""
    return _choice(MigrationMode, _MEANINGS, value, field=field, what="a migration mode")


def _choice(kind: type[E], meanings: Mapping[E, str], value: JsonValue, *, field: str,
            what: str) -> E:
    """``value`` as one of ``kind``, or a refusal naming ``field`` and each choice with
    its meaning."""
    if isinstance(value, str):
        for choice in kind:
            if value == choice.value:
                return choice
    known = "; ".join(f"{c.value!r}: {meaning}" for c, meaning in meanings.items())
    raise InvalidSpec(f"{field} {value!r} is not {what} ({known})")


class Transfer(StrEnum):
    REGISTRY = "registry"
    STREAM = "stream"


DEFAULT_TRANSFER = Transfer.REGISTRY
_TRANSFERS = {
    Transfer.REGISTRY: "push, delete the source, then pull on the target (the default)",
    Transfer.STREAM: "hand the archives to the target's agent beside the push; the source "
                     "is deleted once the target runs verified",
}


def parse_transfer(value: JsonValue, *, field: str) -> Transfer:
    """``value`` as a transfer, or a refusal naming ``field`` and the transfers there are."""
    return _choice(Transfer, _TRANSFERS, value, field=field, what="a transfer")


def lazy_checkpoint_images(artifact: str, checkpoint_id: str,
                           containers: Sequence[str]) -> dict[str, str]:
    """Where a lazy migration to a CRI-O node puts each container's memory-less checkpoint
    image (``repo:lazy-<checkpoint id>-<container>`` beside the capture's ``artifact``
    ``repo:tag``): the target pod names it from the start, the target's agent pushes it
    once it has the hand-over, and the kubelet's next pull finds it."""
    repo = artifact.rpartition(":")[0] if "/" not in artifact.rpartition(":")[2] \
        else artifact
    return {c: f"{repo}:lazy-{checkpoint_id}-{c}"[:len(repo) + 129] for c in containers}


def mode_refusal(mode: MigrationMode, path: RestorePath, *, node: str,
                 sealed: bool = False) -> str | None:
    """Why ``node``, restoring on ``path``, cannot migrate in ``mode`` (``None``: it may;
    the source node's agent still checks its kernel before anything is frozen).
    ``sealed``: the class encrypts its checkpoints."""
    if mode is MigrationMode.LAZY and sealed:
        return ("mode 'lazy' sends memory as plain TCP from CRIU's page server, and this "
                "class seals its checkpoints (encryption): migrate with mode "
                "'stop-and-copy', or with a class without encryption on a trusted network")
    if mode is MigrationMode.PRECOPY and path is RestorePath.RUNTIME:
        return (f"mode 'precopy' needs CRIU driven by the node agent, and node {node} "
                "restores through CRI-O, which takes whole checkpoint images only: migrate "
                "with mode 'stop-and-copy'")
    return None
