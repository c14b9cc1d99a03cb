"""The simulated kube-controller-manager: ReplicaSet, Deployment and StatefulSet
controllers and the garbage collector of :class:`~drivers.sim.cluster.SimCluster`.

Like :mod:`drivers.sim.kubelet`, one loop reacts to store changes (never polls): a change
to a pod, claim or workload marks its namespace, and a pass syncs every workload of the
marked namespaces, reading the store as it is (so no expectations are needed: the real
controllers keep them because their informers lag). :meth:`Controllers.reconcile` is
one pass over everything; ``SimCluster.settle`` alternates it with the kubelets' until
nothing changes. Writes go through the store's API rules (creates, updates with a
``resourceVersion`` precondition, graceful pod deletion the kubelets finish).

- **ReplicaSet** (``replica_set.go``): claims the active pods of its namespace
  (``ClaimPods``: adopts a matching orphan, releases an owned pod that stopped
  matching), creates pods from the template (``generateName: <rs>-``) up to
  ``spec.replicas``, deletes the surplus in :func:`~drivers.sim.replicas.deletion_order`,
  writes ``status``.
- **Deployment** (``sync.go``): claims its ReplicaSets; the one whose template is the
  Deployment's (ignoring ``pod-template-hash``) is scaled to ``spec.replicas``, others to
  0 (no surge: the new one is scaled up at once; ``Recreate`` waits for the old pods to go).
- **StatefulSet** (``stateful_set_control.go``): pods ``<set>-<ordinal>`` created in
  order (``OrderedReady``: each waits for its predecessors to be Running and Ready, and a
  terminating pod blocks; ``Parallel``: all at once), claims ``<template>-<set>-<ordinal>``
  made before the pod and never deleted, scale-down from the highest ordinal, a pod
  deleted for good is recreated with its name, a pod of an older template replaced
  highest ordinal first.
- **Garbage collector**: when an owner is deleted, a dependent that has no other owner
  left is deleted (background propagation); one that has loses the dangling reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from datetime import UTC, datetime

from controlplane.logs import get_logger
from drivers.sim import replicas as rules
from drivers.sim.objects import RESOURCES, ApiError, Obj, clone, is_true, meta
from drivers.sim.selectors import label_selector_matches
from drivers.sim.store import Change, Store

log = get_logger("drivers.sim.controllers")

WATCHED = ("pods", "persistentvolumeclaims", "replicasets", "deployments", "statefulsets")
KIND_PLURALS = {r.kind: r.plural for r in RESOURCES.values()}
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
_MEMBER = re.compile(r"^(.*)-([0-9]+)$")
Clock = Callable[[], datetime]


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class Controllers:
    """The workload controllers and the garbage collector, driven by store changes."""

    def __init__(self, store: Store, *, clock: Clock = _wall_clock) -> None:
        self.store = store
        self.clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dirty: set[str] = set()  # namespaces changed since the last pass
        self._gone: list[Obj] = []  # deleted objects whose dependents the GC visits
        # owner uid -> dependents (plural, namespace, name): the GC's index.
        self._dependents: dict[str, set[tuple[str, str, str]]] = {}
        for plural in WATCHED:
            for obj in store.peek(plural):
                self._index(plural, obj, None)
        self._unsubscribe = store.subscribe(self._on_change)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-controllers")
        self._wake.set()

    async def stop(self) -> None:
        self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_change(self, change: Change) -> None:
        if change.resource not in WATCHED:
            return
        self._index(change.resource, None if change.type == "DELETED" else change.obj,
                    change.prev)
        if change.type == "DELETED" and str(meta(change.obj).get("uid")) in self._dependents:
            self._gone.append(change.obj)
        self._dirty.add(str(meta(change.obj).get("namespace") or ""))
        self._wake.set()

    def _index(self, plural: str, obj: Obj | None, prev: Obj | None) -> None:
        for old, add in ((prev, False), (obj, True)):
            if old is None:
                continue
            key = (plural, str(meta(old).get("namespace") or ""), str(meta(old)["name"]))
            for ref in meta(old).get("ownerReferences") or []:
                uid = str(ref.get("uid"))
                if add:
                    self._dependents.setdefault(uid, set()).add(key)
                elif uid in self._dependents:
                    self._dependents[uid].discard(key)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.reconcile_changed()
            except Exception as exc:  # one bad object must not stop every controller
                log.error("simulated controllers: reconcile failed", error=repr(exc))

    def reconcile_changed(self) -> None:
        namespaces, self._dirty = self._dirty, set()
        self._collect_garbage()
        for namespace in sorted(namespaces):
            self._sync_namespace(namespace)

    def reconcile(self) -> None:
        """One pass over every namespace (idempotent: a synced workload costs no write)."""
        self._dirty.clear()
        self._collect_garbage()
        for namespace in sorted({str(meta(n)["name"]) for n in self.store.peek("namespaces")}):
            self._sync_namespace(namespace)

    def _sync_namespace(self, namespace: str) -> None:
        for plural, sync in (("deployments", self._sync_deployment),
                             ("replicasets", self._sync_replicaset),
                             ("statefulsets", self._sync_statefulset)):
            for obj in self._in(plural, namespace):
                try:
                    sync(obj)
                except ApiError as exc:  # a conflict: the change it lost to brings a pass
                    log.info("simulated controllers: sync refused", kind=obj.get("kind"),
                             name=meta(obj).get("name"), error=exc.message)

    def _in(self, plural: str, namespace: str) -> list[Obj]:
        """Copies of the namespace's objects, by name."""
        return [clone(o) for o in self.store.peek(plural)
                if meta(o).get("namespace") == namespace]

    # --- claims (controller_ref_manager.go) --------------------------------------------

    def _claim(self, owner: Obj, plural: str, candidates: list[Obj]) -> list[Obj]:
        """``ClaimObject`` over ``candidates``: the ones ``owner`` controls afterwards."""
        selector = (owner.get("spec") or {}).get("selector")
        owner_uid = meta(owner)["uid"]
        deleting = meta(owner).get("deletionTimestamp") is not None
        claimed: list[Obj] = []
        for obj in candidates:
            matches = label_selector_matches(selector, meta(obj).get("labels") or {})
            ref = rules.controller_ref(obj)
            if ref is not None:
                if ref.get("uid") != owner_uid:
                    continue  # another controller's
                if matches:
                    claimed.append(obj)
                elif not deleting:  # release (kept while the owner is being deleted)
                    self._drop_owner(plural, obj, owner_uid)
                continue
            if deleting or not matches or meta(obj).get("deletionTimestamp") is not None:
                continue
            # canAdopt: RecheckDeletionTimestamp reads the owner afresh.
            fresh = self.store.find(_plural_of(owner), meta(owner)["namespace"],
                                    meta(owner)["name"])
            if fresh is None or meta(fresh).get("uid") != owner_uid or \
                    meta(fresh).get("deletionTimestamp") is not None:
                continue
            adopted = self._edit_meta(plural, obj, lambda m: m.__setitem__("ownerReferences", [
                *(m.get("ownerReferences") or []), rules.owner_ref(owner)]))
            if adopted is not None:
                claimed.append(adopted)
        return claimed

    def _edit_meta(self, plural: str, obj: Obj, change: Callable[[Obj], None]) -> Obj | None:
        """Update ``obj``'s metadata (its version a precondition); ``None`` if it is gone."""
        body = clone(obj)
        change(meta(body))
        if not meta(body).get("ownerReferences"):
            meta(body).pop("ownerReferences", None)
        try:
            return self.store.update(plural, meta(obj)["namespace"], meta(obj)["name"], body)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _drop_owner(self, plural: str, obj: Obj, uid: str) -> Obj | None:
        def change(m: Obj) -> None:
            m["ownerReferences"] = [r for r in m.get("ownerReferences") or []
                                    if r.get("uid") != uid]
        return self._edit_meta(plural, obj, change)

    def _write_status(self, plural: str, obj: Obj, status: Obj) -> None:
        if obj.get("status") == status:
            return
        body = clone(obj)
        body["status"] = status
        self.store.update(plural, meta(obj)["namespace"], meta(obj)["name"], body,
                          subresource="status")

    # --- ReplicaSet (replica_set.go) -------------------------------------------------------

    def _sync_replicaset(self, rs: Obj) -> None:
        namespace, now = meta(rs)["namespace"], self.clock()
        every = self._in("pods", namespace)
        pods = self._claim(rs, "pods", [p for p in every if rules.is_active(p)])
        terminating = sum(1 for p in every if (rules.controller_ref(p) or {}).get("uid") ==
                          meta(rs)["uid"] and meta(p).get("deletionTimestamp") is not None
                          and (p.get("status") or {}).get("phase") not in ("Succeeded",
                                                                           "Failed"))
        spec = rs.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        status = _omit_zero({
            "replicas": len(pods),
            "fullyLabeledReplicas": sum(1 for p in pods if template_labels.items()
                                        <= (meta(p).get("labels") or {}).items()),
            "readyReplicas": sum(1 for p in pods if is_true(p, "Ready")),
            "availableReplicas": sum(1 for p in pods if rules.is_available(p, min_ready, now)),
            "observedGeneration": meta(rs).get("generation"),
            "terminatingReplicas": terminating,  # v1.33+: a count, 0 included
        }, keep=("replicas", "terminatingReplicas"))
        self._write_status("replicasets", rs, status)
        if meta(rs).get("deletionTimestamp") is not None:
            return
        if len(pods) < wanted:
            for _ in range(wanted - len(pods)):
                self.store.create("pods", namespace,
                                  rules.pod_from_template(spec.get("template") or {}, rs))
        elif len(pods) > wanted:
            doomed = rules.deletion_order(pods, self._related_pods(rs), now)
            for pod in doomed[:len(pods) - wanted]:
                with contextlib.suppress(ApiError):  # gone already: nothing to delete
                    self.store.delete("pods", namespace, meta(pod)["name"],
                                      uid=meta(pod)["uid"])

    def _related_pods(self, rs: Obj) -> list[Obj]:
        """The pods of every ReplicaSet with the same controller (``getIndirectlyRelatedPods``)."""
        namespace = meta(rs)["namespace"]
        owner = rules.controller_ref(rs)
        if owner is None:
            siblings = {meta(rs)["uid"]}
        else:
            siblings = {meta(r)["uid"] for r in self._in("replicasets", namespace)
                        if (rules.controller_ref(r) or {}).get("uid") == owner.get("uid")}
        return [p for p in self._in("pods", namespace)
                if (rules.controller_ref(p) or {}).get("uid") in siblings]

    # --- Deployment (sync.go, simplified: no surge, no history cleanup) ---------------------

    def _sync_deployment(self, d: Obj) -> None:
        namespace = meta(d)["namespace"]
        spec = d.get("spec") or {}
        sets = self._claim(d, "replicasets", self._in("replicasets", namespace))
        template = spec.get("template") or {}
        current = next((r for r in sets if _without_hash(
            (r.get("spec") or {}).get("template") or {}) == template), None)
        old = [r for r in sets if r is not current]
        wanted = int(spec.get("replicas", 1))
        if meta(d).get("deletionTimestamp") is None and not spec.get("paused"):
            for r in old:
                if (r.get("spec") or {}).get("replicas"):
                    self._scale(r, 0)
            recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
            waiting = recreate and any(
                (rules.controller_ref(p) or {}).get("uid") in {meta(r)["uid"] for r in old}
                for p in self._in("pods", namespace))
            if current is None and not waiting:
                current = self._new_replicaset(d, old)
            elif current is not None and not waiting and \
                    (current.get("spec") or {}).get("replicas") != wanted:
                current = self._scale(current, wanted)
        every = [*old, *([current] if current is not None else [])]

        def total(field: str, among: list[Obj]) -> int:
            return sum(int((r.get("status") or {}).get(field) or 0) for r in among)

        available = total("availableReplicas", every)
        self._write_status("deployments", d, _omit_zero({
            "observedGeneration": meta(d).get("generation"),
            "replicas": total("replicas", every),
            "updatedReplicas": total("replicas", [current] if current is not None else []),
            "readyReplicas": total("readyReplicas", every),
            "availableReplicas": available,
            "unavailableReplicas": max(0, wanted - available),
            "terminatingReplicas": total("terminatingReplicas", every),
        }, keep=("terminatingReplicas",)))
        revision = (meta(current).get("annotations") or {}).get(REVISION_ANNOTATION) \
            if current is not None else None
        if revision and (meta(d).get("annotations") or {}).get(REVISION_ANNOTATION) != revision:
            fresh = self.store.get("deployments", namespace, meta(d)["name"])
            meta(fresh).setdefault("annotations", {})[REVISION_ANNOTATION] = revision
            self.store.update("deployments", namespace, meta(d)["name"], fresh)

    def _new_replicaset(self, d: Obj, old: list[Obj]) -> Obj:
        spec = d.get("spec") or {}
        template = clone(spec.get("template") or {})
        hash_ = rules.template_hash(template, int((d.get("status") or {}).get(
            "collisionCount") or 0))
        labels = {**((template.get("metadata") or {}).get("labels") or {}),
                  rules.TEMPLATE_HASH: hash_}
        template.setdefault("metadata", {})["labels"] = labels
        selector = clone(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[rules.TEMPLATE_HASH] = hash_
        revision = 1 + max((int((meta(r).get("annotations") or {}).get(
            REVISION_ANNOTATION) or 0) for r in old), default=0)
        wanted = int(spec.get("replicas", 1))
        surge = _percent_up((spec.get("strategy") or {}).get("rollingUpdate", {}).get(
            "maxSurge", "25%"), wanted)
        rs_spec: Obj = {"replicas": wanted, "selector": selector, "template": template}
        if spec.get("minReadySeconds"):
            rs_spec["minReadySeconds"] = spec["minReadySeconds"]
        return self.store.create("replicasets", meta(d)["namespace"], {
            "metadata": {"name": f"{meta(d)['name']}-{hash_}", "labels": labels,
                         "annotations": {REVISION_ANNOTATION: str(revision),
                                         "deployment.kubernetes.io/desired-replicas":
                                             str(wanted),
                                         "deployment.kubernetes.io/max-replicas":
                                             str(wanted + surge)},
                         "ownerReferences": [rules.owner_ref(d)]},
            "spec": rs_spec})

    def _scale(self, rs: Obj, replicas: int) -> Obj:
        body = clone(rs)
        body["spec"]["replicas"] = replicas
        return self.store.update("replicasets", meta(rs)["namespace"], meta(rs)["name"], body)

    # --- StatefulSet (stateful_set_control.go) --------------------------------------------

    def _sync_statefulset(self, sts: Obj) -> None:
        namespace, name, now = meta(sts)["namespace"], meta(sts)["name"], self.clock()
        spec = sts.get("spec") or {}
        members = [p for p in self._in("pods", namespace) if _parent(p) == name]
        pods = self._claim(sts, "pods", members)
        revision = f"{name}-{rules.template_hash(spec.get('template') or {})}"
        start = int((spec.get("ordinals") or {}).get("start") or 0)
        count = int(spec.get("replicas", 1))
        slots: dict[int, Obj] = {}
        condemned: list[Obj] = []
        for pod in pods:
            ordinal = _ordinal(pod)
            if start <= ordinal < start + count:
                slots[ordinal] = pod
            elif ordinal >= 0:
                condemned.append(pod)
        condemned.sort(key=_ordinal, reverse=True)
        min_ready = int(spec.get("minReadySeconds") or 0)
        self._write_status("statefulsets", sts, _statefulset_status(
            sts, pods, revision, min_ready, now))
        if meta(sts).get("deletionTimestamp") is not None:
            return
        monotonic = spec.get("podManagementPolicy", "OrderedReady") != "Parallel"

        def unavailable(pod: Obj | None) -> bool:
            return pod is None or not rules.is_active(pod) or \
                not rules.is_available(pod, min_ready, now)

        first_unavailable = next((p for p in [*[slots.get(o) for o in range(
            start, start + count)], *reversed(condemned)] if unavailable(p)), None)
        for ordinal in range(start, start + count):
            if self._process_replica(sts, ordinal, slots.get(ordinal), revision, monotonic,
                                     min_ready, now) and monotonic:
                return
        for pod in condemned:
            if meta(pod).get("deletionTimestamp") is not None:
                if monotonic:
                    return
                continue
            if monotonic and pod is not first_unavailable and unavailable(pod):
                return
            self.store.delete("pods", namespace, meta(pod)["name"], uid=meta(pod)["uid"])
            if monotonic:
                return
        partition = int(((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get(
            "partition") or 0)
        if (spec.get("updateStrategy") or {}).get("type") == "OnDelete":
            return
        for ordinal in range(start + count - 1, start + partition - 1, -1):
            target = slots.get(ordinal)
            if target is None:
                return
            if (meta(target).get("labels") or {}).get(REVISION_LABEL) != revision and \
                    meta(target).get("deletionTimestamp") is None:
                self.store.delete("pods", namespace, meta(target)["name"],
                                  uid=meta(target)["uid"])
                return
            if unavailable(target):
                return

    def _process_replica(self, sts: Obj, ordinal: int, pod: Obj | None, revision: str,
                         monotonic: bool, min_ready: int, now: datetime) -> bool:
        """``processReplica``: True when an OrderedReady set must stop here this pass."""
        namespace = meta(sts)["namespace"]
        if pod is not None and (pod.get("status") or {}).get("phase") in ("Failed",
                                                                          "Succeeded"):
            if meta(pod).get("deletionTimestamp") is None:
                self.store.delete("pods", namespace, meta(pod)["name"], uid=meta(pod)["uid"])
            return True
        if pod is None:
            if not self._make_claims(sts, ordinal):
                return True
            self.store.create("pods", namespace, _statefulset_pod(sts, ordinal, revision))
            return monotonic
        if (pod.get("status") or {}).get("phase") == "Pending":
            self._make_claims(sts, ordinal)
        if meta(pod).get("deletionTimestamp") is not None:
            return monotonic
        if not rules.is_running_and_ready(pod) or not rules.is_available(pod, min_ready, now):
            return monotonic
        return False

    def _make_claims(self, sts: Obj, ordinal: int) -> bool:
        """Create the pod's missing claims; False when one is being deleted (the pod waits)."""
        namespace = meta(sts)["namespace"]
        for claim in _claims(sts, ordinal):
            found = self.store.find("persistentvolumeclaims", namespace, meta(claim)["name"])
            if found is None:
                self.store.create("persistentvolumeclaims", namespace, claim)
            elif meta(found).get("deletionTimestamp") is not None:
                return False
        return True

    # --- garbage collector -------------------------------------------------------------------

    def _collect_garbage(self) -> None:
        gone, self._gone = self._gone, []
        for owner in gone:
            uid = str(meta(owner).get("uid"))
            for plural, namespace, name in sorted(self._dependents.pop(uid, set())):
                obj = self.store.find(plural, namespace, name)
                refs = [] if obj is None else meta(obj).get("ownerReferences") or []
                if not any(r.get("uid") == uid for r in refs):
                    continue
                if any(self._owner_exists(namespace, r) for r in refs if r.get("uid") != uid):
                    assert obj is not None
                    with contextlib.suppress(ApiError):
                        self._drop_owner(plural, obj, uid)
                    continue
                with contextlib.suppress(ApiError):  # already gone
                    self.store.delete(plural, namespace, name)

    def _owner_exists(self, namespace: str, ref: Obj) -> bool:
        plural = KIND_PLURALS.get(str(ref.get("kind")))
        if plural is None:
            return True  # a kind the simulator does not serve: not ours to judge
        where = namespace if RESOURCES[plural].namespaced else ""
        found = self.store.peek_one(plural, (where, str(ref.get("name"))))
        return found is not None and meta(found).get("uid") == ref.get("uid")


# --- pure helpers ------------------------------------------------------------------------------

def _plural_of(obj: Obj) -> str:
    return KIND_PLURALS[str(obj.get("kind"))]


def _omit_zero(status: Obj, keep: tuple[str, ...] = ()) -> Obj:
    """As Go's ``omitempty`` writes a status: zero counts left out."""
    return {k: v for k, v in status.items() if k in keep or v not in (0, None)}


def _without_hash(template: Obj) -> Obj:
    out = clone(template)
    labels = (out.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(rules.TEMPLATE_HASH, None)
    return out


def _percent_up(value: object, total: int) -> int:
    text = str(value)
    if text.endswith("%"):
        return -(-int(text[:-1]) * total // 100)
    return int(text)


def _parent(pod: Obj) -> str | None:
    match = _MEMBER.match(str(meta(pod).get("name")))
    return match[1] if match else None


def _ordinal(pod: Obj) -> int:
    match = _MEMBER.match(str(meta(pod).get("name")))
    return int(match[2]) if match else -1


def _claims(sts: Obj, ordinal: int) -> list[Obj]:
    """``getPersistentVolumeClaims``: one claim per template, labelled with the selector."""
    spec = sts.get("spec") or {}
    selector_labels = (spec.get("selector") or {}).get("matchLabels") or {}
    out = []
    for template in spec.get("volumeClaimTemplates") or []:
        claim = clone(template)
        claim.pop("status", None)
        m = meta(claim)
        m["name"] = f"{m.get('name')}-{meta(sts)['name']}-{ordinal}"
        m["labels"] = {**(m.get("labels") or {}), **selector_labels}
        out.append({"metadata": m, "spec": claim.get("spec") or {}})
    return out


def _statefulset_pod(sts: Obj, ordinal: int, revision: str) -> Obj:
    """``newStatefulSetPod``: the template, the identity (name, hostname, subdomain,
    labels) and the storage (a volume per claim template, in the template's order)."""
    spec = sts.get("spec") or {}
    pod = rules.pod_from_template(spec.get("template") or {}, sts)
    name = f"{meta(sts)['name']}-{ordinal}"
    meta(pod)["name"] = name
    meta(pod)["labels"] = {**(meta(pod).get("labels") or {}), POD_NAME_LABEL: name,
                           POD_INDEX_LABEL: str(ordinal), REVISION_LABEL: revision}
    pod["spec"]["hostname"] = name
    if spec.get("serviceName"):
        pod["spec"]["subdomain"] = spec["serviceName"]
    templates = [str(meta(t).get("name")) for t in spec.get("volumeClaimTemplates") or []]
    if templates:
        claims = [{"name": t, "persistentVolumeClaim": {
            "claimName": f"{t}-{meta(sts)['name']}-{ordinal}"}} for t in templates]
        pod["spec"]["volumes"] = [*claims, *[v for v in pod["spec"].get("volumes") or []
                                            if v.get("name") not in templates]]
    return pod


def _statefulset_status(sts: Obj, pods: list[Obj], revision: str, min_ready: int,
                        now: datetime) -> Obj:
    current = str((sts.get("status") or {}).get("currentRevision") or revision)
    created = [p for p in pods if (p.get("status") or {}).get("phase")]
    live = [p for p in created if meta(p).get("deletionTimestamp") is None]
    ready = [p for p in pods if rules.is_running_and_ready(p)]

    def at(rev: str) -> int:
        return sum(1 for p in live if (meta(p).get("labels") or {}).get(REVISION_LABEL) == rev)

    updated = at(revision)
    if updated == len(created) and len(ready) == len(created):
        current = revision  # completeRollingUpdate
    status: Obj = {"observedGeneration": meta(sts).get("generation"),
                   "replicas": len(created), "readyReplicas": len(ready),
                   "currentReplicas": at(current), "updatedReplicas": updated,
                   "currentRevision": current, "updateRevision": revision,
                   "collisionCount": 0,
                   "availableReplicas": sum(1 for p in ready
                                            if rules.is_available(p, min_ready, now))}
    return _omit_zero(status, keep=("replicas", "availableReplicas", "collisionCount"))
