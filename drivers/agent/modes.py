"""Whether this node's dumper can migrate in the mode a capture request asks for.

A capture request may name a migration mode other than stop-and-copy
(:data:`~controlplane.machines.contract.protocol.CAPTURE_MODE`). The agent answers before
anything is frozen: a mode the agent does not speak, or one its dumper cannot perform
here, refuses the capture (report ``Failed``, reason ``Refused: ...``), and the control
plane ends the migration without having stopped the workload.

A dumper that can do more than stop-and-copy says so with an optional
``async def refuse_mode(mode: str, workload: Workload | None = None) -> str | None``
(``None``: it can; ``workload``: the pod to capture, whose containers may not suit the
mode); one without it
migrates by stop-and-copy only (the criu dumper asks CRIU about the kernel:
:mod:`drivers.podman.lazy_checks`). Used by :mod:`drivers.agent.agent`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from drivers.agent.dumper import Workload
from drivers.agent.errors import RequestRefused

#: The modes an agent speaks (``controlplane.machines.config.modes``; ``""``: the default).
SPOKEN = ("", "stop-and-copy", "precopy", "lazy")
STOP_AND_COPY = "use mode 'stop-and-copy'"


async def check_mode(dumper: Any, mode: str, *, node: str,
                     workload: Workload | None = None) -> None:
    """``RequestRefused`` when ``dumper`` cannot migrate in ``mode`` on ``node``."""
    if mode not in SPOKEN:
        raise RequestRefused(f"migration mode {mode!r} is not one this agent speaks "
                             f"({', '.join(m for m in SPOKEN if m)}); nothing was frozen")
    if mode in ("", "stop-and-copy"):
        return
    refuse: Callable[..., Awaitable[str | None]] | None = getattr(dumper, "refuse_mode", None)
    why = f"the {dumper.name} dumper migrates by stop-and-copy only" if refuse is None \
        else await refuse(mode, workload)
    if why is not None:
        raise RequestRefused(f"mode {mode!r} on node {node}: {why}; nothing was frozen: "
                             f"{STOP_AND_COPY}")
