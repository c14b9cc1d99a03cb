"""The node agent's use of the checkpoint handoff (docs/protocol.md, "Handoff").

Source side: :meth:`Handoff.offer` hashes the dumped (plain) archives, offers them to the
target node on the agent's :class:`~drivers.agent.handoff.HandoffServer` and returns
the ``report-handoff`` the capture job writes on the source pod. Target side:
:meth:`Handoff.receive` reads the source pod named by a ``restore-handoff`` request
(a list by name: it may run on another node, outside the agent's watch), waits for its
``report-handoff``, checks the source's UID, fetches the stream and checks it carries
the digests the source reported.

Built by :mod:`drivers.agent.runner` from :class:`HandoffSettings` (``python -m
drivers.agent --handoff-key ...``); used by :class:`~drivers.agent.agent.NodeAgent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from controlplane.machines.contract import protocol
from drivers.agent.errors import AgentError, RequestRefused
from drivers.agent.handoff import HandoffServer, Offer, Received, fetch_checkpoint, frames
from drivers.kube.resources import PODS, CoreV1
from drivers.registry.checkpoints import Archive

#: Bytes read at once while hashing an archive.
_READ = 1 << 20


class HandoffUnavailable(AgentError):
    """The source never offered the checkpoint (no ``report-handoff`` in time, its
    capture failed, its pod is gone) or offered something else than it reported."""

    reason = "HandoffFailed"


class HandoffKeyUnusable(Exception):
    """``--handoff-key`` names no file of at least 32 bytes: one line naming the flag and
    the fix."""


@dataclass(frozen=True)
class HandoffSettings:
    key: bytes  # the agents' shared key (every node's agent has the same)
    host: str = "127.0.0.1"  # where the handoff server listens
    port: int = 0
    advertise: str = ""  # the host written into report-handoff ("": the listen host)
    #: Seconds between two reads of the source pod while a target waits for its offer
    #: (the agent's own watch sees only its node's pods).
    poll: float = 0.5


def read_handoff_key(path: Path) -> bytes:
    """The shared key in ``path``; :class:`HandoffKeyUnusable` if unreadable or short."""
    fix = (f"write at least {frames.MIN_KEY_BYTES} random bytes to it, the same file on "
           f"every node (head -c 32 /dev/urandom > {path})")
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise HandoffKeyUnusable(f"--handoff-key {path}: cannot read it "
                                 f"({exc.strerror or type(exc).__name__}); {fix}") from None
    if len(key) < frames.MIN_KEY_BYTES:
        raise HandoffKeyUnusable(f"--handoff-key {path}: {len(key)} bytes, the agents' shared "
                                 f"key must be at least {frames.MIN_KEY_BYTES}; {fix}")
    return key


def plain_digests(archives: Sequence[Archive]) -> dict[str, str]:
    """``sha256:...`` of each archive file, by container (blocking: run it in a thread)."""
    out = {}
    for archive in archives:
        digest = sha256()
        with archive.path.open("rb") as file:
            while chunk := file.read(_READ):
                digest.update(chunk)
        out[archive.container] = "sha256:" + digest.hexdigest()
    return out


class Handoff:
    """One agent's handoff: its running server, the shared key and its advertised host."""

    def __init__(self, settings: HandoffSettings, server: HandoffServer) -> None:
        self.settings, self.server = settings, server

    @property
    def address(self) -> str:
        """``host:port`` other agents fetch from (the advertised host, the bound port)."""
        return self.advertised(self.server.port)

    def advertised(self, port: int) -> str:
        """``host:port`` of this agent's ``port`` (a lazy dump's page server, say) as other
        agents reach it: the advertised host."""
        host = self.settings.advertise or self.server.host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def offer(self, checkpoint_id: str, archives: Sequence[Archive], *, source_uid: str,
                    target_node: str, format: str,
                    pages: str = "") -> tuple[Offer, protocol.HandoffReport]:
        """Offer the plain ``archives`` to ``target_node``; the report that announces it
        (``pages``: a lazy capture's page server, ``host:port``)."""
        digests = await asyncio.to_thread(plain_digests, archives)
        offer = self.server.offer(checkpoint_id, archives, source_uid=source_uid,
                                  target_node=target_node, format=format)
        return offer, protocol.HandoffReport(checkpoint_id, self.address, digests, pages)

    async def receive(self, api: CoreV1, request: protocol.RestoreHandoff, *, node: str,
                      dest: Path, within: float) -> Received:
        """The checkpoint from the source agent, verified against its report (see
        :meth:`fetch`)."""
        received, _ = await self.fetch(api, request, node=node, dest=dest, within=within)
        return received

    async def fetch(self, api: CoreV1, request: protocol.RestoreHandoff, *, node: str,
                    dest: Path, within: float) -> tuple[Received, protocol.HandoffReport]:
        """The checkpoint from the source agent, verified against its report, and that
        report (a lazy one names its page server); raises
        :class:`HandoffUnavailable` (no offer in ``within`` seconds, a failed capture),
        :class:`~drivers.agent.errors.RequestRefused` (the source pod is another one), or
        :class:`~drivers.agent.handoff.HandoffFailed` (the stream)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        report = await self._offered(api, request, deadline)
        received = await fetch_checkpoint(report.address, request.checkpoint_id,
                                          key=self.settings.key, target_node=node, dest=dest,
                                          timeout=max(0.1, deadline - loop.time()))
        got = {a.container: a.digest for a in received.archives}
        if got != dict(report.archives) or received.source_uid != request.source_uid:
            raise HandoffUnavailable(
                f"the stream from {report.address} (source uid {received.source_uid}, "
                f"archives {got}) is not what {request.namespace}/{request.name} reported "
                f"(uid {request.source_uid}, archives {dict(report.archives)})")
        return received, report

    async def _offered(self, api: CoreV1, request: protocol.RestoreHandoff,
                       deadline: float) -> protocol.HandoffReport:
        loop = asyncio.get_running_loop()
        source = f"{request.namespace}/{request.name}"
        while True:
            # A list by name, not a get: the agent's role lists pods already (its watch),
            # and needs no other verb for this.
            page = await api.list_page(PODS, namespace=request.namespace,
                                       field_selector=f"metadata.name={request.name}")
            pods = [p for p in page.get("items") or [] if isinstance(p, dict)]
            if not pods:
                raise HandoffUnavailable(f"the source pod {source} does not exist")
            meta = pods[0].get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if uid != request.source_uid:
                raise RequestRefused(f"the source pod {source} is uid {uid!r}, not "
                                     f"{request.source_uid!r} as the request names: not the "
                                     "source (recreated); nothing was fetched")
            notes = meta.get("annotations") or {}
            try:
                report = protocol.handoff_report(notes, request.checkpoint_id)
            except ValueError as exc:
                raise HandoffUnavailable(f"the source pod {source}: {exc}") from exc
            if report is not None:
                return report
            if notes.get(protocol.REPORT_CHECKPOINT_ID) == request.checkpoint_id and \
                    notes.get(protocol.REPORT_STATE) == protocol.ReportState.FAILED:
                raise HandoffUnavailable(
                    f"the capture of checkpoint {request.checkpoint_id} on {source} failed "
                    f"before it was offered: {notes.get(protocol.REPORT_REASON, '')}")
            left = deadline - loop.time()
            if left <= 0:
                raise HandoffUnavailable(
                    f"the source pod {source} carried no {protocol.REPORT_HANDOFF} for "
                    f"checkpoint {request.checkpoint_id} within the restore timeout: is its "
                    "capture asking for a handoff to this node, and does its agent run "
                    "with --handoff-key?")
            await asyncio.sleep(min(self.settings.poll, left))
