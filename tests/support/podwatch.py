"""A real watch of a namespace's pods while a block runs (``with PodWatch(world)``):
which pods were created, at most how many live copies of a marked workload ran at once,
and whether a pod was ever bound without a restore request. Works on the simulator and
on a real API server alike (raw HTTP, the world's kubeconfig)."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from controlplane.machines.contract.protocol import RESTORE_ARTIFACT
from drivers.agent.sim import FROZEN
from tests.e2e.world import Obj, World
from tests.support.waiting import wait_for


class PodWatch:
    """Every pod event in the test namespace, from a real watch, while the block runs:
    what was created, and at most how many live copies of a marked workload ran at once
    (Running, not terminating, not stopped by a quiesced checkpoint)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.events: list[tuple[str, Obj]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._response: Any = None

    def __enter__(self) -> PodWatch:
        listed = self.w.kube.request("GET", f"/api/v1/namespaces/{self.w.namespace}/pods")
        self._rv = listed["metadata"]["resourceVersion"]
        self._initial = {p["metadata"]["uid"]: p for p in listed["items"]}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Everything up to now: the watch must have seen each pod as a list shows it now.
        wait_for(self._caught_up, "the watch caught up with a fresh list", 30)
        self._stop.set()
        if self._response is not None:
            self._response.close()

    def _caught_up(self) -> bool:
        if self._failed:
            raise AssertionError("the pod watch broke")
        listed = self.w.kube.request("GET", f"/api/v1/namespaces/{self.w.namespace}/pods")
        now = {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in listed["items"]}
        seen = self._current()
        return {uid: p["metadata"]["resourceVersion"] for uid, p in seen.items()} == now

    def _current(self) -> dict[str, Obj]:
        pods = dict(self._initial)
        for kind, obj in list(self.events):
            if kind == "DELETED":
                pods.pop(obj["metadata"]["uid"], None)
            else:
                pods[obj["metadata"]["uid"]] = obj
        return pods

    _failed = False

    def _run(self) -> None:
        kube = self.w.kube
        url = (f"{kube.server}/api/v1/namespaces/{self.w.namespace}/pods?watch=true"
               f"&resourceVersion={self._rv}&allowWatchBookmarks=true")
        headers = {"Authorization": f"Bearer {kube.token}"} if kube.token else {}
        try:
            self._response = urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=300,
                context=kube.context)
            for line in self._response:
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.events.append((event["type"], event["object"]))
                if self._stop.is_set():
                    return
        except Exception:  # the response closed under us at the end
            if not self._stop.is_set():
                self._failed = True

    def ran_ungated(self, uid: str) -> bool:
        """Whether pod ``uid`` was ever bound to a node without the restore request."""
        return any(o["metadata"]["uid"] == uid and o["spec"].get("nodeName") and
                   RESTORE_ARTIFACT not in (o["metadata"].get("annotations") or {})
                   for _, o in self.events)

    def created(self, *apps: str) -> set[str]:
        """The pods created while watching (of ``apps``, by their last labels: a restored
        ReplicaSet pod starts with its labels parked)."""
        last = {o["metadata"]["uid"]: o for _, o in self.events}
        return {uid for t, o in self.events
                if t == "ADDED" and (uid := o["metadata"]["uid"]) not in self._initial
                and (not apps or (last[uid]["metadata"].get("labels") or {}).get("app")
                     in apps)}

    def most_running_with(self, annotation: str, value: str) -> int:
        pods = dict(self._initial)
        most = 0
        for kind, obj in self.events:
            if kind == "DELETED":
                pods.pop(obj["metadata"]["uid"], None)
            else:
                pods[obj["metadata"]["uid"]] = obj
            most = max(most, sum(1 for p in pods.values() if _live_copy(p, annotation, value)))
        return most


def _live_copy(pod: Obj, annotation: str, value: str) -> bool:
    meta = pod["metadata"]
    notes = meta.get("annotations") or {}
    return (notes.get(annotation) == value and FROZEN not in notes
            and not meta.get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") == "Running")
