"""The simulated scheduler, kubelets and node lifecycle of :class:`~drivers.sim.cluster.SimCluster`.

One reconcile loop reacts to store changes (never polls) and, for every pod:

- **schedules** a pending pod with no ``nodeName`` and no ``schedulingGates`` (see
  :mod:`drivers.sim.scheduling`): binds it and sets ``PodScheduled``, or records
  ``PodScheduled=False/Unschedulable`` with the scheduler's message, retried whenever a
  node or pod changes;
- **runs** a bound pod on a ``Ready`` node after ``start_seconds``: phase ``Running``,
  ``Ready``/``ContainersReady``/``Initialized`` conditions, ``containerStatuses``,
  ``podIP``/``hostIP``/``startTime``;
- **stops** a terminating pod after ``min(stop_seconds, grace period)``, then removes it
  (a real kubelet's final ``DELETE`` with grace 0; finalizers still hold the object);
- follows its node: a ``NotReady`` node turns its pods ``Ready=False`` (and holds their
  deletion, like a real partition); a deleted node's pods are removed (pod GC).

The loop is incremental: a pass looks at the pods that changed since the last one (plus
those still waiting for a node), and every pod only when a node changed (or on
:meth:`reconcile`/:meth:`settle`). Looking at every pod on every change made the
simulator's CPU per operation grow with the number of pods: at 10,000 pods it cost more
than the control plane it serves (``bench.scale`` CPU per process). For the same reason
the scheduler's per-node usage is kept up to date from the changes, summed per node in
the same order as :func:`~drivers.sim.scheduling.usage` so the numbers are identical.

Node operations for tests and fault campaigns: :meth:`add_node`, :meth:`fail_node`,
:meth:`recover_node`, :meth:`cordon`, :meth:`uncordon`, :meth:`taint`, :meth:`drain`.
Called by :class:`~drivers.sim.cluster.SimCluster`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from controlplane.logs import get_logger
from drivers.sim import nodestatus, podstatus, scheduling
from drivers.sim.objects import (
    ApiError,
    Obj,
    is_true,
    meta,
    set_condition,
    timestamp,
)
from drivers.sim.store import Change, Key, Store

_Step = Callable[[Obj], None]
log = get_logger("drivers.sim.kubelet")


class Kubelets:
    """The scheduler and every node's kubelet, driven by store changes."""

    def __init__(self, store: Store, *, start_seconds: float = 0.0,
                 stop_seconds: float = 0.0) -> None:
        self.store = store
        self.start_seconds = start_seconds
        self.stop_seconds = stop_seconds
        self._wake = asyncio.Event()
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}  # (step, uid) -> timer
        self._task: asyncio.Task[None] | None = None
        self._full = True  # the next pass looks at every pod (first pass, a node changed)
        self._dirty: set[Key] = set()  # pods changed since the last pass
        self._waiting: set[Key] = set()  # pending pods the scheduler could not place yet
        # The scheduler's usage, from the changes: node -> {pod key: its requests}, the
        # node each counted pod is on, and per-node sums (recomputed when marked stale).
        self._counted: dict[str, dict[Key, dict[str, float]]] = {}
        self._counted_on: dict[Key, str] = {}
        self._sums: dict[str, dict[str, float]] = {}
        self._stale: set[str] = set()
        for pod in store.peek("pods"):
            self._count(_key(pod), pod)
        self._unsubscribe = store.subscribe(self._on_change)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-kubelets")
        self._wake.set()

    async def stop(self) -> None:
        self._unsubscribe()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_change(self, change: Change) -> None:
        if change.resource == "pods":
            key = _key(change.obj)
            self._count(key, None if change.type == "DELETED" else change.obj)
            self._dirty.add(key)
            self._wake.set()
        elif change.resource == "nodes":
            self._full = True
            self._wake.set()

    def _count(self, key: Key, pod: Obj | None) -> None:
        """Account ``pod`` (``None``: gone) in the scheduler's per-node usage."""
        before = self._counted_on.pop(key, None)
        if before is not None:
            del self._counted[before][key]
            self._stale.add(before)
        node = None if pod is None else scheduling.counted_node(pod)
        if node is not None and pod is not None:
            self._counted.setdefault(node, {})[key] = scheduling.pod_requests(pod)
            self._counted_on[key] = node
            self._stale.add(node)

    def usage(self) -> dict[str, dict[str, float]]:
        """What :func:`scheduling.usage` gives for the stored pods (a copy to spend)."""
        for node in self._stale:
            pods = self._counted.get(node) or {}
            if not pods:
                self._sums.pop(node, None)
                continue
            slot = {"cpu": 0.0, "memory": 0.0, "pods": 0.0}
            for key in sorted(pods):  # usage() adds in key order: the same float sums
                for name, value in pods[key].items():
                    slot[name] += value
                slot["pods"] += 1
            self._sums[node] = slot
        self._stale.clear()
        return {node: dict(slot) for node, slot in self._sums.items()}

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.reconcile_changed()
            except Exception as exc:  # one bad object must not stop every kubelet
                log.error("simulated kubelets: reconcile failed", error=repr(exc))

    def reconcile_changed(self) -> None:
        """Every pod after a node change, else the changed ones and those still waiting."""
        if self._full:
            self._full = False
            self._dirty.clear()
            self.reconcile()
            return
        keys = sorted(self._dirty | self._waiting)
        self._dirty.clear()
        pods = []
        for key in keys:
            pod = self.store.peek_one("pods", key)
            if pod is None:
                self._waiting.discard(key)  # deleted while it waited
            else:
                pods.append(pod)
        self._reconcile_pods(pods, everything=False)

    def settle(self, *, max_passes: int = 50) -> int:
        """Reconcile until a pass writes nothing; returns the passes that wrote.

        With ``start_seconds`` and ``stop_seconds`` at 0 every transition happens within a
        pass, so afterwards the cluster is quiescent: tests compare against a still world
        without waiting. (Timed transitions still happen later, on their timers.)
        """
        for done in range(max_passes):
            before = self.store.rv
            self.reconcile()
            if self.store.rv == before:
                return done
        raise RuntimeError(f"the simulated kubelets did not settle in {max_passes} passes")

    # --- the loop ------------------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass over every pod (idempotent: an unchanged pod costs no write)."""
        self._reconcile_pods(self.store.peek("pods"), everything=True)

    def _reconcile_pods(self, pods: list[Obj], *, everything: bool) -> None:
        nodes = self.store.peek("nodes")
        by_name = {str(meta(n)["name"]): n for n in nodes}
        used: dict[str, dict[str, float]] | None = None
        if everything:
            self._waiting.clear()
        for pod in pods:
            m = meta(pod)
            self._waiting.discard(_key(pod))
            node_name = (pod.get("spec") or {}).get("nodeName")
            node = by_name.get(node_name) if node_name else None
            if node_name and node is None:
                self._finish(pod)  # the node is gone: garbage-collect its pods
            elif m.get("deletionTimestamp") is not None:
                if node is not None and is_true(node, "Ready"):
                    grace = m.get("deletionGracePeriodSeconds")
                    delay = min(self.stop_seconds, grace if isinstance(grace, int) else 0)
                    self._later("stop", pod, delay, self._finish)
            elif not node_name:
                if (pod.get("status") or {}).get("phase", "Pending") == "Pending" and \
                        not (pod.get("spec") or {}).get("schedulingGates"):
                    if used is None:
                        used = self.usage()
                    if not self._schedule(pod, nodes, used):
                        self._waiting.add(_key(pod))
            elif node is not None:
                self._follow_node(pod, node)

    def _later(self, step: str, pod: Obj, delay: float, then: _Step) -> None:
        """Run ``then`` on this pod (same UID) after ``delay``; one timer per step and pod."""
        key = (step, str(meta(pod)["uid"]))
        if delay <= 0:
            then(pod)
            return
        if key not in self._timers:
            def fire() -> None:
                self._timers.pop(key, None)
                current = self.store.find("pods", str(meta(pod)["namespace"]),
                                          str(meta(pod)["name"]))
                if current is not None and meta(current).get("uid") == key[1]:
                    then(current)
            self._timers[key] = asyncio.get_running_loop().call_later(delay, fire)

    def _schedule(self, pod: Obj, nodes: list[Obj], used: dict[str, dict[str, float]]) -> bool:
        """Bind ``pod`` (True) or record why it cannot be placed yet (False)."""
        chosen, why = scheduling.choose(pod, nodes, used)
        uid = str(meta(pod)["uid"])

        def bind(obj: Obj) -> None:
            obj["spec"]["nodeName"] = chosen
            set_condition(obj.setdefault("status", {}), "PodScheduled", True)

        def refuse(obj: Obj) -> None:
            set_condition(obj.setdefault("status", {}), "PodScheduled", False,
                          reason="Unschedulable", message=why)

        self.store.mutate("pods", str(meta(pod)["namespace"]), str(meta(pod)["name"]),
                          bind if chosen else refuse, uid=uid)
        if chosen:
            slot = used.setdefault(chosen, {"cpu": 0.0, "memory": 0.0, "pods": 0.0})
            for key, value in scheduling.pod_requests(pod).items():
                slot[key] += value
            slot["pods"] += 1
        return chosen is not None

    def _follow_node(self, pod: Obj, node: Obj) -> None:
        phase = (pod.get("status") or {}).get("phase", "Pending")
        ready = is_true(node, "Ready")
        if phase == "Pending" and ready:
            self._later("start", pod, self.start_seconds, lambda p: self._run_pod(p, node))
        elif phase == "Running" and is_true(pod, "Ready") != ready:
            self._set_ready(pod, ready)

    # --- pod transitions -------------------------------------------------------------------

    def _run_pod(self, pod: Obj, node: Obj) -> None:
        host, started = podstatus.host_ip(node), timestamp()

        def run(obj: Obj) -> None:
            status = podstatus.running_status(obj, host=host, started=started)
            if status is not None:
                obj["status"] = status

        self.store.mutate("pods", str(meta(pod)["namespace"]), str(meta(pod)["name"]), run,
                          uid=str(meta(pod)["uid"]))

    def _set_ready(self, pod: Obj, ready: bool) -> None:
        def change(obj: Obj) -> None:
            status = obj.setdefault("status", {})
            why = "" if ready else "NodeNotReady"
            set_condition(status, "Ready", ready, reason=why)
            set_condition(status, "ContainersReady", ready, reason=why)
            for c in status.get("containerStatuses") or []:
                c["ready"] = ready

        self.store.mutate("pods", str(meta(pod)["namespace"]), str(meta(pod)["name"]), change,
                          uid=str(meta(pod)["uid"]))

    def _finish(self, pod: Obj) -> None:
        """The containers stopped: the kubelet's final delete (grace 0, same UID)."""
        m = meta(pod)
        with contextlib.suppress(ApiError):  # already gone, or another pod by now
            self.store.delete("pods", str(m["namespace"]), str(m["name"]), uid=str(m["uid"]),
                              grace=0)

    # --- node operations -------------------------------------------------------------------

    def add_node(self, name: str, *, cpu: str = "4", memory: str = "8Gi", pods: int = 110,
                 labels: Mapping[str, str] | None = None) -> Obj:
        index = len(self.store.select("nodes")[0]) + 1
        return self.store.create("nodes", "", nodestatus.node_object(
            name, index, cpu=cpu, memory=memory, pods=pods, now=timestamp(), labels=labels))

    def _node(self, name: str, change: _Step) -> Obj:
        self.store.get("nodes", "", name)  # 404 for an unknown node
        out = self.store.mutate("nodes", "", name, change)
        assert out is not None
        return out

    def fail_node(self, name: str) -> Obj:
        """The node stops reporting: ``Ready=False`` (``NotReady``)."""
        return self._node(name, lambda n: set_condition(
            n.setdefault("status", {}), "Ready", False, reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status."))

    def recover_node(self, name: str) -> Obj:
        return self._node(name, lambda n: set_condition(
            n.setdefault("status", {}), "Ready", True, reason="KubeletReady",
            message="kubelet is posting ready status"))

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        def change(node: Obj) -> None:
            node.setdefault("spec", {})["unschedulable"] = unschedulable
            if not unschedulable:
                node["spec"].pop("unschedulable")
        return self._node(name, change)

    def uncordon(self, name: str) -> Obj:
        return self.cordon(name, unschedulable=False)

    def taint(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> Obj:
        def change(node: Obj) -> None:
            taints = [t for t in node.setdefault("spec", {}).get("taints") or []
                      if t.get("key") != key]
            node["spec"]["taints"] = [*taints, {"key": key, "value": value, "effect": effect}]
        return self._node(name, change)

    def drain(self, name: str, *, grace: int | None = None) -> list[str]:
        """Cordon the node and delete (evict) its pods; returns their ``namespace/name``."""
        self.cordon(name)
        evicted: list[str] = []
        for pod in self.store.select("pods")[0]:
            m = meta(pod)
            if (pod.get("spec") or {}).get("nodeName") == name and not m.get("deletionTimestamp"):
                self.store.delete("pods", str(m["namespace"]), str(m["name"]),
                                  uid=str(m["uid"]), grace=grace)
                evicted.append(f"{m['namespace']}/{m['name']}")
        return evicted


def _key(pod: Obj) -> Key:
    m = meta(pod)
    return str(m.get("namespace") or ""), str(m.get("name"))

