"""What the front door needs from outside, as ports the composition root fills.

:class:`ResourceApi` keeps the custom resources of ``checkpoint.controlplane.dev``
current, reads and patches them (``drivers.kube.custom`` implements it over the real API
server with the driver's watch cache; tests may pass a fake). Kinds are named by their
``kind`` (``Migration``), objects travel as parsed JSON. The failure the front door reacts
to is typed here, so it never imports a driver: :class:`StaleResource` (409, or gone:
read again); anything else is a ``ControlPlaneError`` to log and retry.

:class:`Faults` is where a test makes the process fail at a named point (a worker killed
right after it created an operation); the composition root passes :data:`NO_FAULTS`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from controlplane.errors import ControlPlaneError

Resource = dict[str, Any]
#: ``on_change(old, new)``: a resource appeared (``old`` is ``None``), changed, or is gone
#: (``new`` is ``None``).
ChangeHook = Callable[[Resource | None, Resource | None], None]


class StaleResource(ControlPlaneError):
    """The resource changed since it was read (409 on a precondition), or it is gone."""


class ResourceApi(Protocol):
    """The custom resources over the API server."""

    async def served(self) -> bool:
        """Whether the API server serves the group (the CRDs are installed)."""
        ...

    def informer(self, kind: str, on_change: ChangeHook) -> AbstractAsyncContextManager[None]:
        """While entered, keep every resource of ``kind`` (all namespaces) current and
        call ``on_change`` for each change, first for each resource listed. Watch
        failures are the implementation's to recover from (resume from the last
        resourceVersion, back off, list again after a 410 and diff): it never raises
        them, and a relist reports only what changed."""
        ...

    async def get(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        """The resource as the API server has it now (``None``: it does not exist)."""
        ...

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Resource, *,
                    status: bool = False) -> Resource:
        """A JSON merge patch of the resource (``status``: of its status subresource)."""
        ...


class Faults(Protocol):
    """Injected failures: called at each named point; a test's rule may end the process
    there (``controlplane.wiring.faults`` lists the points and builds the rules)."""

    def reached(self, point: str, detail: str = "") -> None: ...


class _NoFaults:
    def reached(self, point: str, detail: str = "") -> None:
        return None


#: What production runs with: no point fails.
NO_FAULTS: Faults = _NoFaults()
