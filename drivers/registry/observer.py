"""Registry tags for the worker: the ``Observer`` that answers ``Interests.tags``.

:class:`RegistryObserver` resolves every asked reference — ``registry/repo:tag`` and
``registry/repo@sha256:<hex>`` alike — on a :class:`~drivers.registry.port.Registry`
backend (HTTP or on-disk layout): a ``TagView(ref, digest, annotations)`` with the
manifest's annotations, ``None`` only for a definite 404, and a ``ProbeError`` for
anything else (auth, throttling, 5xx, timeouts, an unparsable reference): never "absent"
on error (safety gate 3). With a ``verifier`` (the agents' signing key, ``--trusted-key``),
a checkpoint manifest's signature is checked too and the view says ``verified`` or
``refused: <why>``, so a forged push is never pinned (docs/security.md). Probes run
concurrently (``concurrency``), each under ``timeout`` seconds; ``observe`` never raises.

``controlplane.worker.composite.CompositeObserver`` joins it with the Kubernetes observer
(pods and nodes), so the worker gets one ``Observer``. Wired by the composition root
(CLI, demo, tests).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import Interests, Observation, ProbeError, TagFact, TagView
from controlplane.machines.base.refs import parse_artifact_ref
from controlplane.machines.contract import protocol
from drivers.registry.errors import RegistryError, probe_error
from drivers.registry.port import Registry
from drivers.sealing.signatures import SignatureRefused, Verifier, verify_manifest

REMEMBERED = 4096  # verified digests kept (each verification is two registry reads)


class RegistryObserver:
    """Answers ``Interests.tags`` from one registry backend (pods and nodes: not asked)."""

    def __init__(self, registry: Registry, *, concurrency: int = 8,
                 timeout: float = 30.0, verifier: Verifier | None = None) -> None:
        self.registry = registry
        self.timeout = timeout
        self.verifier = verifier
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._verified: OrderedDict[str, None] = OrderedDict()  # repo@digest verified

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
        annotations = dict(resolved.annotations)
        if self.verifier is None or protocol.MANIFEST_CHECKPOINT_ID not in annotations:
            return TagView(ref, resolved.digest, annotations)
        try:
            async with self._slots, asyncio.timeout(self.timeout):
                signature = await self._signature(parsed.repo, resolved.digest)
        except RegistryError as exc:
            return probe_error(exc)
        except TimeoutError:
            return ProbeError("Timeout", f"verifying the signature of {ref} took longer than "
                              f"{self.timeout}s")
        return TagView(ref, resolved.digest, annotations, signature)

    async def _signature(self, repository: str, digest: str) -> str:
        """``verified`` or ``refused: <why>``; a verified digest is remembered (its bytes
        cannot change), a refused one is checked again next time."""
        assert self.verifier is not None
        key = f"{repository}@{digest}"
        if key in self._verified:
            self._verified.move_to_end(key)
            return "verified"
        try:
            await verify_manifest(self.registry, repository, digest, self.verifier)
        except SignatureRefused as exc:
            return f"refused: {type(exc).__name__}: {exc}"
        self._verified[key] = None
        while len(self._verified) > REMEMBERED:
            self._verified.popitem(last=False)
        return "verified"
