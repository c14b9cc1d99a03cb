"""The simulated API server's storage: objects, resourceVersions, the change history.

Like etcd behind a real API server, one global counter versions every write; each write
is a :class:`Change` appended to a bounded history that watches replay from a
``resourceVersion``. Resuming from a version older than the history (after
:meth:`Store.compact`, or once the bounded history has moved on) fails with
``410 Expired``, as a real server does after etcd compaction.

Semantics kept from Kubernetes:

- ``create``: ``name`` or ``generateName``; ``409 AlreadyExists``; the namespace must exist
  (404) and not be terminating (403); ``uid``, ``creationTimestamp``, ``resourceVersion``.
- ``update``/``patch``: a ``metadata.resourceVersion`` in the body (or put there by the
  patch) is a precondition (409 ``Conflict`` when stale); a write that changes nothing
  does not bump the version nor emit an event.
- ``delete``: ``preconditions.uid``/``resourceVersion`` (409 on mismatch), graceful
  deletion (``deletionTimestamp`` + ``deletionGracePeriodSeconds``) for pods on a node,
  finalizers hold an object until an update empties them. Deleting a namespace deletes
  what it holds.

Every write takes ``dry_run``: validated and answered as the write would be, but nothing
is stored, versioned or sent to watches (``?dryRun=All``).

All methods are synchronous (one event loop, no awaits inside), so every write and the
fan-out of its change to listeners is atomic. Called by the HTTP server, the simulated
scheduler/kubelet and :class:`~drivers.sim.cluster.SimCluster`.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from drivers.sim import custom, strategies
from drivers.sim import patch as patches
from drivers.sim.objects import (
    CRDS,
    RESOURCES,
    ApiError,
    Obj,
    Resource,
    already_exists,
    clone,
    conflict,
    invalid,
    meta,
    not_found,
    set_condition,
    timestamp,
)
from drivers.sim.selectors import EVERYTHING, Selector

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (STRATEGIC, MERGE, JSON_PATCH)

Key = tuple[str, str]  # (namespace or "", name)

# apimachinery's utilrand alphabet: no vowels (no words) and no 0, 1, 3 (no look-alikes).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generated_suffix() -> str:
    """The 5 characters a real server's ``generateName`` appends (SimpleNameGenerator)."""
    return "".join(random.choice(_NAME_ALPHABET) for _ in range(5))


@dataclass(frozen=True)
class Change:
    """One write: ``type`` is ADDED, MODIFIED or DELETED; ``prev`` the object before."""

    rv: int
    resource: str
    type: str
    obj: Obj
    prev: Obj | None


Listener = Callable[[Change], None]


class Store:
    """Objects of every served resource, versioned by one counter, with a change history."""

    def __init__(self, *, history_limit: int = 100_000) -> None:
        self.rv = 0
        #: What this store serves: the built-in resources, and those its CRDs define.
        self.resources: dict[str, Resource] = dict(RESOURCES)
        self._objects: dict[str, dict[Key, Obj]] = {plural: {} for plural in RESOURCES}
        self._history: deque[Change] = deque()
        self._history_limit = history_limit
        self._compacted = 0  # changes up to this version are gone from the history
        self._listeners: list[Listener] = []

    # --- reading ---------------------------------------------------------------------

    def resource(self, plural: str) -> Resource:
        found = self.resources.get(plural)
        if found is None:
            raise ApiError(404, f"the server could not find the requested resource ({plural})")
        return found

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        return clone(self._find(plural, namespace, name))

    def find(self, plural: str, namespace: str, name: str) -> Obj | None:
        obj = self._objects[plural].get((namespace, name))
        return None if obj is None else clone(obj)

    def select(self, plural: str, namespace: str | None = None,
             selector: Selector = EVERYTHING) -> tuple[list[Obj], int]:
        """Matching objects sorted by (namespace, name), and the list's version."""
        # Filter, then sort only what matched; a node-scoped selector (a node agent's
        # list) rejects other nodes' pods on one lookup. At 10,000 pods, 100 agents
        # relisting at once (their resync) held the server's loop for seconds: the sort
        # of every key and the generic match of every pod, 100 times over.
        node = selector.node_name
        found = [(key, obj) for key, obj in self._objects[plural].items()
                 if (namespace is None or key[0] == namespace)
                 and (node is None or (obj.get("spec") or {}).get("nodeName") == node)
                 and selector.matches(obj)]
        found.sort(key=lambda pair: pair[0])
        return [clone(obj) for _, obj in found], self.rv

    def peek(self, plural: str) -> list[Obj]:
        """The stored objects themselves, sorted by key: READ-ONLY (no copies, for the
        simulated kubelets' reconcile pass; write through :meth:`mutate`)."""
        return [obj for _, obj in sorted(self._objects[plural].items())]

    def peek_one(self, plural: str, key: Key) -> Obj | None:
        """One stored object itself by key, or ``None``: READ-ONLY, as :meth:`peek`."""
        return self._objects[plural].get(key)

    def changes_since(self, rv: int) -> list[Change]:
        """Every change after version ``rv``; ``410 Expired`` if the history lost some."""
        if rv < self._compacted:
            raise ApiError(410, f"too old resource version: {rv} ({self._compacted})",
                           reason="Expired")
        return [c for c in self._history if c.rv > rv]

    # --- listening --------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def compact(self) -> int:
        """Forget the whole history (etcd compaction): older resumes get 410."""
        self._history.clear()
        self._compacted = self.rv
        return self.rv

    # --- writing ----------------------------------------------------------------------

    def create(self, plural: str, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        resource = self.resource(plural)
        obj = clone(body)
        m = meta(obj)
        if resource.namespaced:
            self._check_namespace(namespace)
            if m.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "the namespace of the provided object does not match "
                               "the namespace sent on the request")
            m["namespace"] = namespace
        else:
            m.pop("namespace", None)
        if not m.get("name"):
            if not m.get("generateName"):
                raise ApiError(422, f"{resource.kind} is invalid: metadata.name: Required value",
                               reason="Invalid")
            m["name"] = f"{m['generateName']}{generated_suffix()}"
        key = (namespace if resource.namespaced else "", str(m["name"]))
        if key in self._objects[plural]:
            raise already_exists(resource, key[1])
        strategies.prepare_create(resource, obj)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            m.pop(field, None)
        m["uid"] = str(uuid.uuid4())
        m["creationTimestamp"] = timestamp()
        return self._write(resource, key, obj, None, dry_run=dry_run)

    def update(self, plural: str, namespace: str, name: str, body: Obj, *,
               subresource: str | None = None, dry_run: bool = False) -> Obj:
        resource = self.resource(plural)
        old = self._find(plural, namespace, name)
        wanted = str(meta(body).get("resourceVersion") or "")
        if wanted and wanted != meta(old).get("resourceVersion"):
            raise conflict(resource, name, "the object has been modified; please apply your "
                           "changes to the latest version and try again")
        new = strategies.prepare_update(resource, old, body, subresource=subresource)
        return self._replace(resource, old, new, dry_run=dry_run)

    def patch(self, plural: str, namespace: str, name: str, content_type: str, body: object, *,
              subresource: str | None = None, dry_run: bool = False,
              check: Callable[[Obj], None] | None = None) -> Obj:
        """``check``: called with the patched object before it is stored (strict fields)."""
        resource = self.resource(plural)
        current = self.get(plural, namespace, name)
        if resource.custom and content_type == STRATEGIC:  # as a real server: no schema
            raise ApiError(415, "the body of the request was in an unknown format - accepted "
                           f"media types include: {JSON_PATCH}, {MERGE}")
        try:
            if content_type == STRATEGIC:
                patched = patches.strategic_merge_patch(current, body)
            elif content_type == MERGE:
                patched = patches.merge_patch(current, body)
            elif content_type == JSON_PATCH:
                patched = patches.json_patch(current, body)
            else:
                raise ApiError(415, f"the body of the request was in an unknown format - "
                               f"accepted media types include: {', '.join(PATCH_TYPES)}")
        except patches.PatchError as exc:
            raise ApiError(exc.code, f"the server rejected our request due to an error in our "
                           f"request: {exc}", details={"causes": [{"message": str(exc)}]},
                           ) from exc
        if not isinstance(patched, dict):
            raise ApiError(422, f"the patch turned {resource.kind} {name} into a non-object")
        if check is not None:
            check(patched)
        return self.update(plural, namespace, name, patched, subresource=subresource,
                           dry_run=dry_run)

    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        """``POST pods/NAME/binding``: assign the pod to ``target.name`` (a scheduler's write).

        Answers as a real API server does: 201 with a ``Success`` Status; 409 when the pod
        is already assigned, being deleted, gated, or is another one than
        ``metadata.uid``; 404 when it does not exist; 400/422 for a malformed Binding.
        """
        resource = self.resource("pods")
        if meta(binding).get("name") not in (None, "", name):
            raise ApiError(400, "name in URL does not match name in Binding object")
        raw = binding.get("target")
        target: Obj = raw if isinstance(raw, dict) else {}
        node = str(target.get("name") or "")
        if target.get("kind") not in (None, "", "Node"):
            raise invalid(resource, name, "target.kind", "must be empty or 'Node'")
        if not node:
            raise invalid(resource, name, "target.name", "Required value")
        old = self._find("pods", namespace, name)
        m = meta(old)
        where = dataclasses.replace(resource, plural="pods/binding")
        uid = meta(binding).get("uid")
        if uid and uid != m.get("uid"):
            raise conflict(where, name, f"Precondition failed: UID in precondition: {uid}, "
                           f"UID in object meta: {m.get('uid')}")
        if m.get("deletionTimestamp") is not None:
            raise conflict(where, name, f"pod {name} is being deleted, cannot be assigned "
                           "to a host")
        assigned = (old.get("spec") or {}).get("nodeName")
        if assigned:
            raise conflict(where, name, f'pod {name} is already assigned to node "{assigned}"')
        if (old.get("spec") or {}).get("schedulingGates"):
            raise conflict(where, name, f"pod {name} has non-empty .spec.schedulingGates")
        new = clone(old)
        new.setdefault("spec", {})["nodeName"] = node
        annotations = meta(binding).get("annotations")
        if isinstance(annotations, dict) and annotations:
            meta(new).setdefault("annotations", {}).update(annotations)
        set_condition(new.setdefault("status", {}), "PodScheduled", True)
        self._replace(resource, old, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    def mutate(self, plural: str, namespace: str, name: str, change: Callable[[Obj], None], *,
               uid: str | None = None) -> Obj | None:
        """A system write (scheduler, kubelet): ``change`` edits a copy; no API rules.

        Returns ``None`` when the object is gone (or is another one than ``uid``).
        """
        old = self._objects[plural].get((namespace, name))
        if old is None or (uid is not None and meta(old).get("uid") != uid):
            return None
        new = clone(old)
        change(new)
        return self._replace(self.resource(plural), old, new)

    def delete(self, plural: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None, grace: int | None = None,
               dry_run: bool = False) -> Obj:
        resource = self.resource(plural)
        old = self._find(plural, namespace, name)
        m = meta(old)
        # The registry's wording (rest.BeforeDelete), which names the kind, not the plural.
        if uid and uid != m.get("uid"):
            raise conflict(resource, name, f"the UID in the precondition ({uid}) does not "
                           f"match the UID in record ({m.get('uid')}). The object might have "
                           "been deleted and then recreated", by_kind=True)
        if resource_version and resource_version != m.get("resourceVersion"):
            raise conflict(resource, name, "the ResourceVersion in the precondition "
                           f"({resource_version}) does not match the ResourceVersion in record "
                           f"({m.get('resourceVersion')}). The object might have been modified",
                           by_kind=True)
        if plural == "namespaces" and not dry_run:
            for inner in list(self.resources.values()):
                if inner.namespaced:
                    for key in [k for k in self._objects[inner.plural] if k[0] == name]:
                        self._remove(inner, key)
        seconds = strategies.deletion_grace(resource, old, grace)
        if m.get("deletionTimestamp") is not None:
            current = m.get("deletionGracePeriodSeconds")
            seconds = min(seconds, current if isinstance(current, int) else seconds)
            if seconds == current:
                return clone(old)
        if seconds == 0 and not m.get("finalizers"):
            key = (namespace if resource.namespaced else "", name)
            return self._remove(resource, key, dry_run=dry_run)
        new = clone(old)
        meta(new)["deletionGracePeriodSeconds"] = seconds
        if meta(new).get("deletionTimestamp") is None or seconds == 0:
            meta(new)["deletionTimestamp"] = timestamp(datetime.now(UTC)
                                                       + timedelta(seconds=seconds))
        return self._replace(resource, old, new, dry_run=dry_run)

    # --- internals --------------------------------------------------------------------

    def _find(self, plural: str, namespace: str, name: str) -> Obj:
        resource = self.resource(plural)
        obj = self._objects[plural].get((namespace if resource.namespaced else "", name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def _check_namespace(self, namespace: str) -> None:
        ns = self._objects["namespaces"].get(("", namespace))
        if ns is None:
            raise not_found(RESOURCES["namespaces"], namespace)
        if meta(ns).get("deletionTimestamp"):
            raise ApiError(403, f"unable to create new content in namespace {namespace} "
                           "because it is being terminated")

    def _replace(self, resource: Resource, old: Obj, new: Obj, *, dry_run: bool = False) -> Obj:
        key = (str(meta(old).get("namespace") or ""), str(meta(old)["name"]))
        meta(new)["resourceVersion"] = meta(old).get("resourceVersion")
        if new == old:
            return clone(old)
        m = meta(new)
        if (m.get("deletionTimestamp") is not None and not m.get("finalizers")
                and m.get("deletionGracePeriodSeconds") in (0, None)):
            return self._remove(resource, key, last=new, dry_run=dry_run)
        return self._write(resource, key, new, old, dry_run=dry_run)

    def _write(self, resource: Resource, key: Key, obj: Obj, prev: Obj | None, *,
               dry_run: bool = False) -> Obj:
        if dry_run:  # validated and answered, not stored: a new object has no version yet
            if prev is None:
                meta(obj).pop("resourceVersion", None)
            return clone(obj)
        self.rv += 1
        meta(obj)["resourceVersion"] = str(self.rv)
        self._objects[resource.plural][key] = obj
        if resource.plural == CRDS:
            self._define(obj)
        self._emit(Change(self.rv, resource.plural, "MODIFIED" if prev else "ADDED",
                          clone(obj), prev))
        return clone(obj)

    def _define(self, crd: Obj) -> None:
        """Serve what a CRD defines (its objects kept if it was served already)."""
        for resource in custom.resources(crd):
            if resource.plural in RESOURCES:
                continue  # a built-in name is not taken over
            self.resources[resource.plural] = resource
            self._objects.setdefault(resource.plural, {})

    def _undefine(self, crd: Obj) -> None:
        """A deleted CRD's kind is served no more, and its objects go with it."""
        for resource in custom.resources(crd):
            if self.resources.get(resource.plural) == resource:
                for key in list(self._objects.get(resource.plural, {})):
                    self._remove(resource, key)
                del self.resources[resource.plural]
                self._objects.pop(resource.plural, None)

    def _remove(self, resource: Resource, key: Key, *, last: Obj | None = None,
                dry_run: bool = False) -> Obj:
        if dry_run:
            return clone(last if last is not None else self._objects[resource.plural][key])
        prev = self._objects[resource.plural].pop(key)
        self.rv += 1
        gone = clone(last if last is not None else prev)
        meta(gone)["resourceVersion"] = str(self.rv)
        self._emit(Change(self.rv, resource.plural, "DELETED", gone, prev))
        if resource.plural == CRDS:
            self._undefine(prev)
        return clone(gone)

    def _emit(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for listener in list(self._listeners):
            listener(change)
