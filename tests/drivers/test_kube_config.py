"""Cluster configuration: kubeconfig, in-cluster service account, and clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivers.kube.config import KubeConfigError, load_configuration
from drivers.sim import SimCluster


def _service_account(tmp_path: Path) -> tuple[str, str]:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("secret-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return str(token), str(ca)


async def test_in_cluster_config_reads_the_service_account(tmp_path: Path) -> None:
    token, ca = _service_account(tmp_path)
    loaded = await load_configuration(
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        token_path=token, ca_path=ca)
    assert loaded.source == "in-cluster"
    assert loaded.loader is None
    assert loaded.configuration.host == "https://10.96.0.1:443"
    assert loaded.configuration.api_key["BearerToken"] == "Bearer secret-token"
    assert loaded.configuration.ssl_ca_cert == ca


async def test_in_cluster_config_outside_a_pod_says_what_to_do(tmp_path: Path) -> None:
    token, ca = _service_account(tmp_path)
    with pytest.raises(KubeConfigError) as caught:
        await load_configuration(in_cluster=True, environ={}, token_path=token, ca_path=ca)
    assert "in-cluster" in str(caught.value)
    assert "--kubeconfig" in caught.value.hint


async def test_a_missing_kubeconfig_names_the_file_and_what_to_pass(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError) as caught:
        await load_configuration(kubeconfig=str(missing), environ={})
    assert str(caught.value).startswith(f"kubeconfig {missing} (as given) does not exist")
    assert "\n" not in str(caught.value)
    assert "--kubeconfig" in caught.value.hint
    assert "KUBECONFIG" in caught.value.hint


async def test_a_missing_kubeconfig_from_the_environment_says_where_it_came_from(
        tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(KubeConfigError) as caught:
        await load_configuration(environ={"KUBECONFIG": str(missing)})
    assert f"kubeconfig {missing} (from $KUBECONFIG) does not exist" in str(caught.value)


async def test_an_unreadable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("clusters: []\n")
    with pytest.raises(KubeConfigError) as caught:
        await load_configuration(kubeconfig=str(broken), environ={})
    assert f"cannot load kubeconfig {broken}" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_the_simulators_kubeconfig_points_at_it(tmp_path: Path) -> None:
    async with SimCluster(nodes=1) as cluster:
        path = cluster.write_kubeconfig(tmp_path / "kc")
        loaded = await load_configuration(environ={"KUBECONFIG": str(path)})
        assert loaded.configuration.host == cluster.url
        assert loaded.source == f"kubeconfig {path}"


async def test_an_explicit_kubeconfig_wins_over_the_in_cluster_environment(
        tmp_path: Path) -> None:
    async with SimCluster(nodes=1) as cluster:
        path = cluster.write_kubeconfig(tmp_path / "kc")
        loaded = await load_configuration(
            kubeconfig=str(path), context="sim",
            environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
        assert loaded.configuration.host == cluster.url
