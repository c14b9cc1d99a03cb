"""The request counter's opt-in timing: off by default (a worker keeps nothing per
request), and once asked, one client-side duration per request by verb, failures too."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from drivers.kube.client import KubeClient
from drivers.kube.config import load_configuration
from drivers.kube.errors import KubeApiError
from drivers.kube.metrics import RequestCounter
from drivers.kube.resources import PODS, CoreV1
from drivers.sim import SimCluster


async def test_durations_are_kept_by_verb_only_after_time_requests(tmp_path: Path) -> None:
    counter = RequestCounter()
    async with SimCluster(nodes=1) as cluster:
        cluster.create_pod("default", "timed")
        loaded = await load_configuration(
            kubeconfig=str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        client = KubeClient(ApiClient(loaded.configuration), counter=counter)
        try:
            api = CoreV1(client)
            await api.get(PODS, "timed", namespace="default")
            assert counter.durations is None
            counter.time_requests()
            for _ in range(3):
                await api.get(PODS, "timed", namespace="default")
            with pytest.raises(KubeApiError):
                await api.get(PODS, "missing", namespace="default")
        finally:
            await client.close()
    assert counter.snapshot()["get"] == 5
    assert counter.durations is not None
    assert list(counter.durations) == ["get"]
    assert len(counter.durations["get"]) == 4  # the untimed first one is not there
    assert all(0 < d < 15 for d in counter.durations["get"])
