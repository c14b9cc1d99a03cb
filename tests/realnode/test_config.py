"""The pure half of the real nodes: the files a node runs with, the runc wrapper's edits
and the reading of a restored counter's log. No node runs here (nothing skips)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from drivers.realnode import config, host
from drivers.realnode.runc_wrapper import command_and_bundle, fit_spec, has_v1_hugetlb
from tests.support.realnode import resumed_at, ticks


def settings(name: str = "node-a", index: int = 0, slot: int = 3) -> config.NodeSettings:
    folder = Path("/tmp/w/nodes") / name
    return config.NodeSettings(
        name=name, folder=folder, binaries=Path("/cache/bin"), criu_dir=Path("/opt/criu41"),
        runtime_wrapper=Path("/tmp/w/runc-wrapper"), conmon=Path("/usr/bin/conmon"),
        cni_plugins=Path("/usr/lib/cni"), pause_image="127.0.0.1:5000/realnode/pause:3.10",
        registry="127.0.0.1:5000", kubeconfig=Path("/tmp/w/kubelet.kubeconfig"),
        kubelet_port=40000 + index, cgroup_root=host.cgroup_root(slot, name),
        bridge=host.bridge_name(slot, index), subnet=host.subnet(slot, index),
        serving_cert=folder / "tls.crt", serving_key=folder / "tls.key",
        client_ca=Path("/tmp/w/ca.crt"))


def test_crio_keeps_all_its_state_under_the_node_and_restores_with_criu_first_in_path() -> None:
    s = settings()
    conf = tomllib.loads(config.crio_conf(s))
    runtime = conf["crio"]["runtime"]
    assert runtime["enable_criu_support"] is True
    assert runtime["drop_infra_ctr"] is False
    assert runtime["cgroup_manager"] == "cgroupfs"
    runc = runtime["runtimes"]["runc"]
    assert runc["runtime_path"] == "/tmp/w/runc-wrapper"
    assert runc["monitor_env"] == [f"PATH={s.path_env}"]
    assert s.path_env.startswith("/opt/criu41:")
    assert "signature_policy" not in conf["crio"]["image"]  # it breaks restores
    assert conf["crio"]["image"]["big_files_temporary_dir"].startswith(str(s.folder))
    assert conf["crio"]["nri"]["enable_nri"] is False
    paths = [conf["crio"][k] for k in ("root", "runroot", "log_dir", "version_file",
                                       "clean_shutdown_file")]
    paths += [runtime[k] for k in ("namespaces_dir", "container_exits_dir",
                                   "container_attach_socket_dir", "decryption_keys_path")]
    paths += [conf["crio"]["api"]["listen"], runc["runtime_root"]]
    assert all(p.startswith(f"{s.folder}/") for p in paths), paths
    assert len(str(s.crio_socket)) < 108


def test_crio_decrypts_with_the_keys_in_a_folder_of_the_nodes_own() -> None:
    a, b = settings(), settings("node-b", 1)
    keys = [tomllib.loads(config.crio_conf(n))["crio"]["runtime"]["decryption_keys_path"]
            for n in (a, b)]
    assert keys == [str(a.decryption_keys), str(b.decryption_keys)]
    assert keys[0] != keys[1]  # a key put on one node is not on the other


def test_the_loopback_registry_is_insecure_in_the_registries_conf() -> None:
    conf = tomllib.loads(config.registries_conf(["127.0.0.1:5000"]))
    assert conf["registry"] == [{"location": "127.0.0.1:5000", "insecure": True}]


def test_each_node_has_its_own_bridge_and_subnet_and_no_gateway() -> None:
    a, b = json.loads(config.cni_conflist(settings())), \
        json.loads(config.cni_conflist(settings("node-b", 1)))
    bridge_a, bridge_b = a["plugins"][0], b["plugins"][0]
    assert bridge_a["bridge"] != bridge_b["bridge"]
    assert bridge_a["ipam"]["ranges"] != bridge_b["ipam"]["ranges"]
    assert len(bridge_a["bridge"]) <= 15
    assert bridge_a["isGateway"] is False  # so the plugin never turns on ip_forward
    assert bridge_a["ipMasq"] is False  # nor writes iptables rules


def test_the_kubelet_checkpoints_on_cgroup_v1_with_its_own_cgroup_root() -> None:
    s = settings()
    kubelet = yaml.safe_load(config.kubelet_config(s))
    assert kubelet["featureGates"] == {"ContainerCheckpoint": True}
    assert kubelet["cgroupRoot"] == "/cprn-3-node-a"
    assert kubelet["failCgroupV1"] is False
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["authorization"]["mode"] == "Webhook"
    assert (kubelet["healthzPort"], kubelet["readOnlyPort"]) == (0, 0)
    assert kubelet["address"] == "127.0.0.1"
    assert "/usr/sbin" not in config.kubelet_path_env()  # no iptables canary chains


def test_the_hosts_file_maps_every_node_to_loopback() -> None:
    first = config.hosts_file(["node-a", "node-b"]).splitlines()[0].split()
    assert first == ["127.0.0.1", "localhost", "node-a", "node-b"]


@pytest.mark.parametrize(("argv", "command", "bundle"), [
    (["--root", "/r", "--log", "/l", "create", "--bundle", "/b", "id"], "create", "/b"),
    (["--root=/r", "--systemd-cgroup", "run", "-b", "/b2", "id"], "run", "/b2"),
    (["restore", "--bundle=/b3", "--image-path", "/i", "id"], "restore", "/b3"),
    (["--root", "/r", "state", "id"], "state", "/cwd"),
])
def test_the_wrapper_finds_runcs_command_and_bundle(argv: list[str], command: str,
                                                   bundle: str) -> None:
    assert command_and_bundle(argv, Path("/cwd")) == (command, Path(bundle))


def test_the_wrapper_raises_negative_oom_scores_and_drops_hugetlb_without_v1() -> None:
    huge = [{"pageSize": "2MB", "limit": 0}]
    spec: dict[str, Any] = {"process": {"oomScoreAdj": -998, "args": ["/pause"]},
                            "linux": {"resources": {"hugepageLimits": huge,
                                                    "memory": {"limit": 1}}}}
    fitted = fit_spec(spec, v1_hugetlb=False)
    assert fitted["process"] == {"oomScoreAdj": 0, "args": ["/pause"]}
    assert fitted["linux"]["resources"] == {"memory": {"limit": 1}}
    assert spec["process"]["oomScoreAdj"] == -998  # a copy
    kept = fit_spec({"process": {"oomScoreAdj": 500}, "linux": {"resources": {
        "hugepageLimits": []}}}, v1_hugetlb=True)
    assert kept == {"process": {"oomScoreAdj": 500}, "linux": {"resources": {
        "hugepageLimits": []}}}


def test_hugetlb_counts_only_on_a_v1_hierarchy() -> None:
    v2 = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    assert not has_v1_hugetlb(v2)
    assert has_v1_hugetlb(v2 + "cgroup /sys/fs/cgroup/hugetlb cgroup rw,hugetlb 0 0\n")


def log_of(*counts: int, token: str = "77") -> list[tuple[int, str]]:
    return ticks("".join(f"{c} {token}\n" for c in counts))


@pytest.mark.parametrize(("restored", "archived", "expected"), [
    (log_of(1, 2, 3, 4, 5, 6), log_of(1, 2, 3), 4),  # the archive copied at the dump
    (log_of(1, 2, 3, 4, 5, 4, 5, 6), log_of(1, 2, 3, 4, 5), 4),  # source ran on 2 ticks
    (log_of(1, 2, 3, 1, 2, 3), log_of(1, 2, 3), None),  # restarted from 0
    (log_of(1, 2, 3) + log_of(1, 2, token="88"), log_of(1, 2, 3), None),  # a new process
    (log_of(1, 2, 3, 5, 6), log_of(1, 2, 3), None),  # a gap
    (log_of(1, 2, 3), log_of(1, 2, 3), None),  # nothing printed since
    (log_of(4, 5, 6), [], 4),  # no archived log: it goes on at N+1
])
def test_a_restored_counter_goes_on_from_its_checkpoint(
        restored: list[tuple[int, str]], archived: list[tuple[int, str]],
        expected: int | None) -> None:
    assert resumed_at(restored, archived, "77") == expected


def test_a_node_folder_too_deep_for_the_kubelets_sockets_is_refused_before_it_starts(
        tmp_path: Path) -> None:
    """The kubelet binds ``<root>/pod-resources/<10 digits>``: past 107 bytes it exits
    with a bare "bind: invalid argument". The node says why, before anything runs."""
    from drivers.realnode.node import NodeFailed, RealNode

    deep = tmp_path / ("d" * (config.SOCKET_PATH_MAX - len(str(tmp_path))))
    s = settings()
    node = RealNode(config.NodeSettings(**{**s.__dict__, "folder": deep}), tmp_path / "hosts")
    assert len(str(node.settings.longest_socket)) > config.SOCKET_PATH_MAX
    with pytest.raises(NodeFailed, match="too deep for the kubelet's unix sockets"):
        node.write_files()
    assert not deep.exists()  # refused before any file was written
    fits = settings()
    assert len(str(fits.longest_socket)) <= config.SOCKET_PATH_MAX
