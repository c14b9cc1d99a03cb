"""Every configuration file a real node runs with, rendered from :class:`NodeSettings`.

Pure: strings in, strings out, no file is read or written here (:mod:`.node` writes them).
One node is one CRI-O and one kubelet; the settings keep all of their state under the
node's own folder, on ports, a bridge, a subnet and a cgroup root of its own, so several
nodes (and several worlds) share one host. Each setting's reason is in docs/realnode.md;
the few that only make sense with that reason carry it here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The kubelet's disk-pressure thresholds: low, so a busy shared test disk evicts nothing.
EVICTION_HARD = {"nodefs.available": "1%", "nodefs.inodesFree": "1%",
                 "imagefs.available": "1%", "imagefs.inodesFree": "1%",
                 "memory.available": "1Mi"}

#: The sysctls the kubelet sets on the host (README: 0→1, 1→10, 0→1), plus the bridge
#: plugin's forwarding switch in case a conflist ever asks for a gateway.
HOST_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops",
                "net.ipv4.ip_forward")


#: A unix socket's path holds at most 107 bytes (``sun_path`` is 108, with the NUL).
SOCKET_PATH_MAX = 107

@dataclass(frozen=True)
class NodeSettings:
    """One node of a world: where its state lives and what it listens on."""

    name: str
    folder: Path  # all of the node's state: CRI-O, kubelet, CNI, runc, pod logs
    binaries: Path  # kubelet, crio, pinns, crictl, pause (scripts/ensure-realnode)
    criu_dir: Path  # first in CRI-O's PATH: the CRIU 4.1 that runc runs
    runtime_wrapper: Path  # CRI-O runs this instead of runc (:mod:`.runc_wrapper`)
    conmon: Path
    cni_plugins: Path
    pause_image: str  # in the loopback registry
    registry: str  # 127.0.0.1:<port>: plain HTTP, marked insecure
    kubeconfig: Path  # the kubelet's credentials for the API server
    kubelet_port: int
    cgroup_root: str  # e.g. /cprn-3-node-a: made beforehand in every v1 hierarchy
    bridge: str  # at most 15 characters (IFNAMSIZ)
    subnet: str  # e.g. 10.235.24.0/24
    serving_cert: Path  # the kubelet's, for the node's name, signed by the world's CA
    serving_key: Path
    client_ca: Path  # CA of the clients the kubelet accepts by certificate
    log_level: str = "info"

    # Where things go, all under ``folder`` (kept short: unix socket paths ≤ 107 bytes).
    @property
    def crio_socket(self) -> Path:
        return self.folder / "crio.sock"

    @property
    def crio_conf(self) -> Path:
        return self.folder / "crio.conf"

    @property
    def crio_conf_dir(self) -> Path:
        """An empty drop-in folder: the host's /etc/crio/crio.conf.d is never read."""
        return self.folder / "crio.conf.d"

    @property
    def registries_conf(self) -> Path:
        return self.folder / "registries.conf"

    @property
    def cni_conf_dir(self) -> Path:
        return self.folder / "cni" / "net.d"

    @property
    def kubelet_config(self) -> Path:
        return self.folder / "kubelet.yaml"

    @property
    def kubelet_root(self) -> Path:
        return self.folder / "kubelet"

    @property
    def longest_socket(self) -> Path:
        """The longest unix socket path the kubelet binds under its root (the
        pod-resources endpoint's, a 10-digit name): it must fit :data:`SOCKET_PATH_MAX`."""
        return self.kubelet_root / "pod-resources" / ("0" * 10)

    @property
    def pod_logs(self) -> Path:
        return self.folder / "pods"

    @property
    def decryption_keys(self) -> Path:
        """CRI-O's ``decryption_keys_path``: the private keys (PEM) it decrypts ocicrypt
        layers with while it pulls. Empty unless a test puts a key there
        (:meth:`.node.RealNode.set_decryption_keys`); plain images pull as before."""
        return self.folder / "crio" / "keys"

    @property
    def checkpoints(self) -> Path:
        """Where the kubelet checkpoint API writes its archives."""
        return self.kubelet_root / "checkpoints"

    @property
    def network_name(self) -> str:
        return f"cprn-{self.bridge}"

    @property
    def path_env(self) -> str:
        """CRI-O's PATH: CRIU 4.1 first (Debian's 3.17 fails on this kernel), and no
        iptables for the kubelet (see :func:`kubelet_path_env`)."""
        return f"{self.criu_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _toml(value: object) -> str:
    """A TOML value: JSON's string escapes are TOML's basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _toml_doc(tables: Mapping[str, Mapping[str, object]]) -> str:
    out = []
    for table, values in tables.items():
        out.append(f"[{table}]")
        out.extend(f"{key} = {_toml(value)}" for key, value in values.items())
        out.append("")
    return "\n".join(out)


def crio_conf(s: NodeSettings) -> str:
    """CRI-O's crio.conf (README "Settings that mattered"), every path under the node."""
    crio = s.folder / "crio"
    return _toml_doc({
        "crio": {
            "root": crio / "storage", "runroot": crio / "run", "storage_driver": "overlay",
            "log_dir": crio / "pod-logs", "version_file": crio / "run" / "version",
            "version_file_persist": crio / "version",
            "clean_shutdown_file": crio / "clean.shutdown",
        },
        "crio.api": {"listen": s.crio_socket, "stream_address": "127.0.0.1",
                     "stream_port": "0"},
        "crio.runtime": {
            "cgroup_manager": "cgroupfs", "conmon_cgroup": "pod",
            "enable_criu_support": True,
            # The infra container stays: CRIU restores into the sandbox's namespaces.
            "drop_infra_ctr": False,
            "pinns_path": s.binaries / "pinns", "namespaces_dir": crio / "ns",
            "container_exits_dir": crio / "exits",
            "container_attach_socket_dir": crio / "attach",
            "default_runtime": "runc", "log_level": s.log_level,
            # Read at every pull (server/image_pull.go, getDecryptionKeys): keys come and
            # go without a restart. Only a pull by tag decrypts: by digest, containers/image
            # refuses to rewrite the manifest ("Destination specifies a digest").
            "decryption_keys_path": s.decryption_keys,
            # Not /etc/sysconfig: nothing of the host's is rewritten.
            "irqbalance_config_file": "", "irqbalance_config_restore_file": "",
            "hooks_dir": [],
        },
        "crio.runtime.runtimes.runc": {
            "runtime_path": s.runtime_wrapper, "runtime_type": "oci",
            "runtime_root": s.folder / "runc", "monitor_path": s.conmon,
            "monitor_cgroup": "pod", "monitor_env": [f"PATH={s.path_env}"],
        },
        # No signature_policy: with one set, a restore from a checkpoint image fails
        # ("signature validation is not supported for container restore").
        "crio.image": {"pause_image": s.pause_image, "pause_command": "/pause",
                       # The only section where it works; else pulls stage in /var/tmp.
                       "big_files_temporary_dir": crio / "tmp",
                       "short_name_mode": "disabled"},
        "crio.network": {"network_dir": s.cni_conf_dir, "plugin_dirs": [s.cni_plugins],
                         "cni_default_network": s.network_name},
        "crio.metrics": {"enable_metrics": False},
        # NRI's socket is a fixed host path (/var/run/nri/nri.sock): two nodes would share it.
        "crio.nri": {"enable_nri": False},
    })


def registries_conf(registries: Iterable[str]) -> str:
    """containers-registries.conf(5) marking the loopback registries insecure (plain
    HTTP). CRI-O reads it from ``--registries-conf`` only: ``CONTAINERS_REGISTRIES_CONF``
    is ignored and the old ``insecure_registries`` option no longer works."""
    out = ["unqualified-search-registries = []", ""]
    for registry in registries:
        out += ["[[registry]]", f"location = {_toml(registry)}", "insecure = true", ""]
    return "\n".join(out)


def cni_conflist(s: NodeSettings) -> str:
    """A bridge of the node's own with host-local addresses on its own subnet. No
    gateway and no masquerade: pods need no way out, and so the plugin changes neither
    ``net.ipv4.ip_forward`` nor iptables on the host."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": s.network_name,
        "plugins": [{
            "type": "bridge", "bridge": s.bridge, "isGateway": False, "ipMasq": False,
            "hairpinMode": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": s.subnet}]],
                     "dataDir": str(s.folder / "cni" / "ipam")},
        }, {"type": "loopback"}],
    }, indent=2) + "\n"


def kubelet_config(s: NodeSettings) -> str:
    """The KubeletConfiguration (YAML is a superset of JSON: written as JSON)."""
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs", "cgroupRoot": s.cgroup_root,
        "failSwapOn": False,
        "failCgroupV1": False,  # v1.36 refuses cgroup v1 by default; this host has v1
        "containerRuntimeEndpoint": f"unix://{s.crio_socket}",
        "imageServiceEndpoint": f"unix://{s.crio_socket}",
        "featureGates": {"ContainerCheckpoint": True},
        "address": "127.0.0.1", "port": s.kubelet_port, "healthzPort": 0, "readOnlyPort": 0,
        "podLogsDir": str(s.pod_logs),
        "tlsCertFile": str(s.serving_cert), "tlsPrivateKeyFile": str(s.serving_key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(s.client_ca)}},
        "authorization": {"mode": "Webhook"},
        "evictionHard": EVICTION_HARD,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True, "rotateCertificates": False, "serverTLSBootstrap": False,
        "resolvConf": "/etc/resolv.conf",
        "nodeStatusUpdateFrequency": "2s", "syncFrequency": "5s",
    }, indent=2) + "\n"


def kubelet_args(s: NodeSettings) -> list[str]:
    return [str(s.binaries / "kubelet"), f"--config={s.kubelet_config}",
            f"--kubeconfig={s.kubeconfig}", f"--root-dir={s.kubelet_root}",
            f"--hostname-override={s.name}", "--v=1"]


def crio_args(s: NodeSettings) -> list[str]:
    return [str(s.binaries / "crio"), f"--config={s.crio_conf}",
            f"--config-dir={s.crio_conf_dir}", f"--registries-conf={s.registries_conf}"]


def kubelet_path_env() -> str:
    """The kubelet's PATH, without /usr/sbin: with iptables in reach it writes its
    canary chains into the host's mangle, nat and filter tables, which nothing here
    needs (no kube-proxy, no host ports) and teardown would have to take back."""
    return "/usr/local/bin:/usr/bin:/bin"


def hosts_file(names: Iterable[str]) -> str:
    """An /etc/hosts mapping the node names to 127.0.0.1: the API server reaches each
    kubelet by its Hostname address (``--kubelet-preferred-address-types``), since a
    loopback ``--node-ip`` is refused."""
    return ("127.0.0.1\tlocalhost " + " ".join(names) + "\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n")


def apiserver_args(*, client_cert: Path, client_key: Path, kubelet_ca: Path) -> list[str]:
    """What the API server needs to reach these kubelets (logs, exec, port-forward)."""
    return [f"--kubelet-client-certificate={client_cert}",
            f"--kubelet-client-key={client_key}",
            f"--kubelet-certificate-authority={kubelet_ca}",
            "--kubelet-preferred-address-types=Hostname,InternalIP"]
