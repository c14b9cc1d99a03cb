"""The kubelet role: a scheduler and kubelets for nodes it registers, through the API only.

Like kwok, it makes any API server (the simulator, a real ``kube-apiserver`` with no
nodes) look like a cluster: :meth:`KubeletRole.start` registers the nodes of
:class:`~drivers.kubelet.options.RoleOptions` (create, ``Ready`` through
``nodes/NAME/status``, the server's ``not-ready`` taint removed; see
:mod:`drivers.kubelet.nodes`), then list + watches pods and nodes
(:class:`~drivers.kube.cache.WatchCache`: relists after ``410 Gone``, reconnects with
backoff when a watch breaks or the server restarts) and reacts to every change:

- the actions :func:`~drivers.kubelet.decide.decide` returns are carried out here: bind
  (``POST pods/NAME/binding``), refuse (``PodScheduled=False`` in ``pods/NAME/status``),
  start (``pods/NAME/status``: :func:`drivers.sim.podstatus.running_status`, the same
  rule as the simulator's in-process kubelets, with a UID guard) and finish (``DELETE``
  with grace 0 and a UID precondition: 404 or a UID 409 means someone else finished it);
- a failed write the server may accept later (5xx, timeout, unreachable, 429) is tried
  again after a backoff; a refusal (409, 404, 422) is final for what the watch showed —
  the next change of that pod brings a fresh decision;
- a heartbeat restates every node's ``Ready`` (``lastHeartbeatTime``) and registers it
  again if someone deleted it.

Nothing here polls a pod: the loop sleeps until a watch event or the next timed step
(a start or stop delay, a retry). With runtime-backed nodes
(:class:`~drivers.kubelet.podman_nodes.RuntimeNodes`) a start runs real containers (or waits
for their restore) and reports ``Running`` only once they run, a finish removes them,
and a relist every ``relist_seconds`` (the kubelet's PLEG, the one poll: a runtime has
no watch) restates a running pod's status from its containers. Called by ``cpctl sim nodes``
(:mod:`controlplane.cli.sim`) and the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.errors import ControlPlaneError
from controlplane.logs import get_logger
from drivers.kube.cache import WatchCache
from drivers.kube.client import KubeObject
from drivers.kube.config import KubeSettings
from drivers.kube.errors import ApiAlreadyExists, ApiConflict, ApiNotFound, KubeApiError
from drivers.kube.resources import MERGE, NODES, PODS, CoreV1, path
from drivers.kubelet import nodes as node_rules
from drivers.kubelet.decide import Action, Bind, Finish, Refuse, Start, decide, key, uid
from drivers.kubelet.options import RoleOptions
from drivers.kubelet.podman_nodes import RuntimeNodes
from drivers.podman.podman import RuntimeFailed
from drivers.sim import podstatus
from drivers.sim.objects import clone, meta, set_condition, timestamp

log = get_logger("drivers.kubelet")

Monotonic = Callable[[], float]


class RoleNotReady(ControlPlaneError):
    """The nodes could not be registered Ready within ``ready_timeout``."""


@dataclass
class RoleStats:
    """What the role wrote, by kind (for tests and the final log line)."""

    binds: int = 0
    refusals: int = 0
    starts: int = 0
    finishes: int = 0
    retries: int = 0  # writes the server failed and that were tried again
    heartbeats: int = 0
    restatements: int = 0  # running pods whose status the runtime relist changed


class KubeletRole:
    """Registers ``options.nodes`` and schedules, runs and finishes pods, by watches."""

    def __init__(self, api: CoreV1, options: RoleOptions, *,
                 clock: Monotonic = time.monotonic, runtime: RuntimeNodes | None = None,
                 relist_seconds: float = 1.0) -> None:
        self.api = api
        self.runtime = runtime
        self.relist_seconds = relist_seconds
        self.options = options.check()
        self.clock = clock
        settings = KubeSettings(backoff_initial=options.backoff_initial,
                                backoff_max=options.backoff_max, resync_seconds=60.0)
        self.nodes = WatchCache(api, NODES, settings=settings, on_change=self._changed)
        self.pods = WatchCache(api, PODS, settings=settings, on_change=self._changed)
        self.stats = RoleStats()
        self._ours = frozenset(options.nodes)
        self._wake = asyncio.Event()
        self._assumed: dict[str, str] = {}  # pod UID -> node: bound, not yet seen so
        self._first_seen: dict[tuple[str, ...], float] = {}  # timed actions: when seen
        self._sent: set[tuple[str, ...]] = set()  # done; forgotten when no longer asked
        self._due: float | None = None  # the next timed step or retry
        self._backoff = options.backoff_initial
        self._tasks: list[asyncio.Task[None]] = []
        self._writes = asyncio.Semaphore(options.concurrent_writes)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Register every node, sync the watches, and return once all are Ready."""
        deadline = self.clock() + self.options.ready_timeout
        await self._register_all(deadline)
        self.nodes.start()
        self.pods.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop(), name="kubelet-role"),
                       loop.create_task(self._heartbeats(), name="kubelet-role-heartbeat")]
        if self.runtime is not None:
            self._tasks.append(loop.create_task(self._relists(), name="kubelet-role-pleg"))
        try:
            for cache in (self.nodes, self.pods):
                await cache.wait_synced(limit_seconds=max(1.0, deadline - self.clock()))
            await self.nodes.wait_until(
                lambda: all(node_rules.healthy(self.nodes.get(n)) for n in self.options.nodes),
                limit_seconds=max(1.0, deadline - self.clock()), what="every node Ready")
        except TimeoutError as exc:
            raise RoleNotReady(f"kubelet role: nodes not Ready within "
                               f"{self.options.ready_timeout:g}s: {exc}",
                               hint="check that the API server is up and that nothing "
                                    "else (a node lifecycle controller) marks these "
                                    "nodes NotReady; or raise --ready-timeout") from exc

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.pods.stop()
        await self.nodes.stop()

    # --- nodes ---------------------------------------------------------------------------

    def _index(self, name: str) -> int:
        return self.options.nodes.index(name) + 1

    async def _register_all(self, deadline: float) -> None:
        backoff = self.options.backoff_initial
        for name in self.options.nodes:
            while True:
                try:
                    await self._register(name)
                    break
                except KubeApiError as exc:
                    if not exc.retryable or self.clock() + backoff > deadline:
                        raise RoleNotReady(
                            f"kubelet role: node {name} not registered within "
                            f"{self.options.ready_timeout:g}s: {exc}",
                            hint=exc.hint or "check the kubeconfig's server and that its "
                            "user may create and patch nodes") from exc
                    log.warning("registering a node failed, retrying", node=name,
                                error=str(exc), backoff=backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.options.backoff_max)

    async def _register(self, name: str) -> KubeObject:
        """Create the node (or find it), state it Ready, take the not-ready taint off."""
        try:
            node = await self.api.create(NODES, node_rules.node_body(
                name, self._index(name), self.options, now=timestamp()))
        except ApiAlreadyExists:
            node = await self.api.get(NODES, name)
        node = await self._heartbeat(node)
        return await self._untaint(node)

    async def _heartbeat(self, node: KubeObject) -> KubeObject:
        name = str(meta(node)["name"])
        body = node_rules.status_patch(node, self._index(name), self.options, now=timestamp())
        self.stats.heartbeats += 1
        return await self.api.patch(NODES, name, body, patch_type=MERGE, subresource="status")

    async def _untaint(self, node: KubeObject) -> KubeObject:
        name = str(meta(node)["name"])
        for _ in range(5):  # fenced by resourceVersion: re-read after a conflict
            if not node_rules.has_not_ready_taint(node):
                return node
            try:
                return await self.api.patch(NODES, name, node_rules.untaint_patch(node),
                                            patch_type=MERGE)
            except ApiConflict:
                node = await self.api.get(NODES, name)
        return node

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.options.heartbeat_seconds)
            for name in self.options.nodes:
                try:
                    node = self.nodes.get(name)
                    if node is None:
                        node = await self.api.get(NODES, name)
                    await self._untaint(await self._heartbeat(node))
                except ApiNotFound:
                    await self._reregister(name)
                except KubeApiError as exc:
                    log.warning("node heartbeat failed", node=name, error=str(exc))

    async def _reregister(self, name: str) -> None:
        try:
            await self._register(name)
            log.info("node registered again (it had been deleted)", node=name)
        except KubeApiError as exc:
            log.warning("registering a node again failed", node=name, error=str(exc))

    # --- pods ----------------------------------------------------------------------------

    def _changed(self, old: KubeObject | None, new: KubeObject | None) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            if self._due is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, self._due - self.clock()))
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception as exc:  # a bug or a malformed object must not stop the role
                log.error("kubelet role: pass failed", error=repr(exc))
                self._retry_later()

    async def reconcile(self) -> None:
        """One pass: decide from the watches' view, carry out what is due."""
        now = self.clock()
        pods = list(self.pods)
        unbound = {uid(p) for p in pods if not (p.get("spec") or {}).get("nodeName")}
        self._assumed = {u: n for u, n in self._assumed.items() if u in unbound}
        actions = decide(pods, list(self.nodes), ours=self._ours, assumed=self._assumed,
                         start_seconds=self.options.start_seconds,
                         stop_seconds=self.options.stop_seconds,
                         schedule=self.options.schedule)
        wanted = {key(a) for a in actions}
        self._sent &= wanted
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in wanted}
        self._due = None
        due: list[Action] = []
        for action in actions:
            k = key(action)
            if k in self._sent:
                continue
            if isinstance(action, Start | Finish):
                at = self._first_seen.setdefault(k, now) + action.delay
                if at > now:
                    self._due = at if self._due is None else min(self._due, at)
                    continue
            due.append(action)
        # One pass's actions are for distinct pods (placement already counted every bind
        # of the pass), so they go out together, as many nodes' kubelets would send them:
        # one at a time, a pass of hundreds of writes left pods Pending for a minute.
        done = await asyncio.gather(*(self._bounded(a) for a in due))
        self._sent.update(key(a) for a, ok in zip(due, done, strict=True) if ok is True)
        if any(ok is False for ok in done):
            self._retry_later()
        else:
            self._backoff = self.options.backoff_initial

    async def _bounded(self, action: Action) -> bool | None:
        async with self._writes:
            return await self.carry_out(action)

    def _retry_later(self) -> None:
        self.stats.retries += 1
        at = self.clock() + self._backoff
        self._due = at if self._due is None else min(self._due, at)
        self._backoff = min(self._backoff * 2, self.options.backoff_max)

    async def carry_out(self, action: Action) -> bool | None:
        """Send one write; False when the server (or the runtime) failed and it should be
        tried again; None when a runtime-backed pod's containers do not run yet (the next
        relist looks again)."""
        pod = action.pod
        m = meta(pod)
        namespace, name = str(m.get("namespace")), str(m.get("name"))
        try:
            if isinstance(action, Bind):
                await self._bind(namespace, name, uid(pod), action.node)
                self._assumed[uid(pod)] = action.node
                self.stats.binds += 1
            elif isinstance(action, Refuse):
                status = clone(pod.get("status") or {})
                set_condition(status, "PodScheduled", False, reason="Unschedulable",
                              message=action.message)
                await self._patch_status(namespace, name, uid(pod),
                                         {"conditions": status["conditions"]})
                self.stats.refusals += 1
            elif isinstance(action, Start) and self._backed(action.node):
                return await self._start_containers(action)
            elif isinstance(action, Start):
                running = podstatus.running_status(pod, host=podstatus.host_ip(action.node),
                                                   started=timestamp())
                if running is not None:
                    await self._patch_status(namespace, name, uid(pod), {
                        f: running[f] for f in podstatus.RUNNING_FIELDS if f in running})
                    self.stats.starts += 1
            else:
                node = str((pod.get("spec") or {}).get("nodeName") or "")
                if self.runtime is not None and self.runtime.backs(node):
                    await self.runtime.finish(pod, node)
                await self.api.delete(PODS, name, namespace=namespace, uid=uid(pod),
                                      grace_period_seconds=0)
                self.stats.finishes += 1
        except RuntimeFailed as exc:
            log.warning("kubelet role: the runtime failed, will retry", action=type(action)
                        .__name__, pod=f"{namespace}/{name}", error=str(exc))
            return False
        except KubeApiError as exc:
            if exc.retryable and not isinstance(exc, ApiConflict):
                log.warning("kubelet role: write failed, will retry", action=type(action)
                            .__name__, pod=f"{namespace}/{name}", error=str(exc))
                return False
            # 404, 409 (already bound, another UID, deleting), 422: the watch shows what
            # happened instead, and the next change of this pod brings a new decision.
            log.info("kubelet role: write refused", action=type(action).__name__,
                     pod=f"{namespace}/{name}", error=str(exc))
        return True

    async def _bind(self, namespace: str, name: str, pod_uid: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": pod_uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self.api.client.request("create", "POST", path(PODS, namespace, name, "binding"),
                                      resource="pods", namespace=namespace, body=body)

    async def _patch_status(self, namespace: str, name: str, pod_uid: str,
                            status: KubeObject) -> None:
        # The UID makes the patch fail (422, immutable) on a same-name successor pod.
        await self.api.patch(PODS, name, {"metadata": {"uid": pod_uid}, "status": status},
                             namespace=namespace, patch_type=MERGE, subresource="status")

    # --- runtime-backed nodes ------------------------------------------------------------

    def _backed(self, node: KubeObject) -> bool:
        return self.runtime is not None and self.runtime.backs(str(meta(node).get("name")))

    async def _start_containers(self, action: Start) -> bool | None:
        assert self.runtime is not None
        pod = action.pod
        m = meta(pod)
        fields = await self.runtime.start(pod, str(meta(action.node).get("name")))
        if fields is None:
            return None
        running = podstatus.running_status(pod, host=podstatus.host_ip(action.node),
                                           started=timestamp())
        if running is None:
            return True
        body = {f: running[f] for f in podstatus.RUNNING_FIELDS if f in running}
        body.update(fields)
        await self._patch_status(str(m.get("namespace")), str(m.get("name")), uid(pod), body)
        self.stats.starts += 1
        return True

    async def _relists(self) -> None:
        assert self.runtime is not None
        while True:
            await asyncio.sleep(self.relist_seconds)
            try:
                pods = list(self.pods)
                for pod, fields in await self.runtime.relist(pods):
                    m = meta(pod)
                    await self._patch_status(str(m.get("namespace")), str(m.get("name")),
                                             uid(pod), fields)
                    self.stats.restatements += 1
                if any(podstatus.may_start(p) and self.runtime.backs(
                        str((p.get("spec") or {}).get("nodeName") or "")) for p in pods):
                    self._wake.set()  # a pod waiting for its containers: look again
            except (RuntimeFailed, KubeApiError) as exc:
                log.warning("kubelet role: runtime relist failed", error=str(exc))
