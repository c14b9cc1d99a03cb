"""Registry tags for the worker: the ``Observer`` that answers ``Interests.tags``.

:class:`RegistryObserver` resolves every asked reference — ``registry/repo:tag`` and
``registry/repo@sha256:<hex>`` alike — on a :class:`~drivers.registry.port.Registry`
backend (HTTP or on-disk layout): a ``TagView(ref, digest, annotations)`` with the
manifest's annotations, ``None`` only for a definite 404, and a ``ProbeError`` for
anything else (auth, throttling, 5xx, timeouts, an unparsable reference): never "absent"
on error (safety gate 3). Probes run concurrently (``concurrency``), each under
``timeout`` seconds; ``observe`` never raises.

``controlplane.worker.composite.CompositeObserver`` joins it with the Kubernetes observer
(pods and nodes), so the worker gets one ``Observer``. Wired by the composition root
(CLI, demo, tests).
"""

from __future__ import annotations

import asyncio

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import Interests, Observation, ProbeError, TagFact, TagView
from controlplane.machines.base.refs import parse_artifact_ref
from drivers.registry.errors import RegistryError, probe_error
from drivers.registry.port import Registry


class RegistryObserver:
    """Answers ``Interests.tags`` from one registry backend (pods and nodes: not asked)."""

    def __init__(self, registry: Registry, *, concurrency: int = 8,
                 timeout: float = 30.0) -> None:
        self.registry = registry
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max(1, concurrency))

    async def observe(self, interests: Interests) -> Observation:
        refs = sorted(interests.tags)
        facts = await asyncio.gather(*(self.tag(ref) for ref in refs))
        return Observation(tags=dict(zip(refs, facts, strict=True)))

    async def tag(self, ref: str) -> TagFact:
        try:
            parsed = parse_artifact_ref(ref, field="tag")
        except InvalidSpec as exc:
            return ProbeError("BadReference", str(exc), retryable=False)
        reference = parsed.digest or parsed.tag
        assert reference is not None  # parse_artifact_ref guarantees one of them
        try:
            async with self._slots, asyncio.timeout(self.timeout):
                resolved = await self.registry.resolve(parsed.repo, reference)
        except RegistryError as exc:
            return probe_error(exc)
        except TimeoutError:
            return ProbeError("Timeout", f"resolving {ref} took longer than {self.timeout}s")
        if resolved is None:
            return None
        if parsed.digest is not None and resolved.digest != parsed.digest:
            return ProbeError("BadResponse", f"{ref} resolved to {resolved.digest}",
                              retryable=False)
        return TagView(ref, resolved.digest, dict(resolved.annotations))
