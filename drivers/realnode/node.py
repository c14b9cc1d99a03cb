"""One real node's processes: a mount namespace, CRI-O and the kubelet; start and stop.

:meth:`RealNode.start` writes the node's files (:mod:`.config`), makes its cgroup root in
every v1 hierarchy, and starts, each with ``setpriv --pdeathsig`` so they end with the
process that started them:

1. a *holder*: ``unshare --mount --propagation private`` running ``pause``, whose mount
   namespace gets overlays on ``/var/lib`` and ``/var/log`` (upper layers under the node's
   folder: the fixed host paths the kubelet and CRI-O write stop colliding, and nothing
   lands on the host) and a bind-mounted ``/etc/hosts`` naming the nodes;
2. CRI-O inside it (``nsenter --mount``), CRIU 4.1 first in its PATH;
3. the kubelet inside it, once CRI-O answers on its socket.

:meth:`RealNode.stop` undoes it on every path, each step on its own: the kubelet stopped
first (it would restart what is removed), ``crictl stop -t 0`` and ``rmp -f`` for every
container and pod (a pod ignoring SIGTERM would cost CRI-O's 30 s stop timeout), CRI-O and
the holder stopped (SIGTERM, SIGKILL after a bound; the namespace and its mounts go with
its last process), what is left in the cgroup root killed, the cgroups and the bridge
removed. Used by :mod:`.world`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from drivers.realnode import config, host
from drivers.realnode.config import NodeSettings

STOP_GRACE = 10.0  # seconds a daemon gets after SIGTERM before SIGKILL
START_LIMIT = 60.0


class NodeFailed(RuntimeError):
    """A node's process could not start or exited; the message carries its log's tail."""


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


@dataclass
class RealNode:
    settings: NodeSettings
    hosts_file: Path
    on_started: Callable[[host.Owner], None] = lambda _owner: None  # recorded for sweepers
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stop_seconds: dict[str, float] = field(default_factory=dict)  # per step, last stop()

    @property
    def name(self) -> str:
        return self.settings.name

    def crictl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        s = self.settings
        return subprocess.run([str(s.binaries / "crictl"), "--runtime-endpoint",
                               f"unix://{s.crio_socket}", "--image-endpoint",
                               f"unix://{s.crio_socket}", "--timeout", f"{int(timeout)}s",
                               *args], capture_output=True, text=True, timeout=timeout + 5,
                              check=False)

    def set_decryption_keys(self, keys: Mapping[str, bytes]) -> None:
        """Exactly ``keys`` (file name: private key PEM) in CRI-O's ``decryption_keys_path``;
        none: the folder is left empty. CRI-O reads the folder at every pull, so this
        applies from the next pull on, with no restart."""
        folder = self.settings.decryption_keys
        for name in keys:
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"not a key file name: {name!r}")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, pem in keys.items():
            path = folder / name
            path.touch(mode=0o600)
            path.write_bytes(pem)

    # --- start ------------------------------------------------------------------------

    def write_files(self) -> None:
        s = self.settings
        longest = len(str(s.longest_socket).encode())
        if longest > config.SOCKET_PATH_MAX:
            raise NodeFailed(f"{s.name}: the node's folder {s.folder} is too deep for the "
                             f"kubelet's unix sockets ({longest} bytes, at most "
                             f"{config.SOCKET_PATH_MAX}); give the node a shorter folder")
        for folder in (s.folder, s.crio_conf_dir, s.cni_conf_dir, s.kubelet_root, s.pod_logs,
                       s.folder / "crio" / "tmp", s.folder / "upper" / "lib",
                       s.folder / "upper" / "log", s.folder / "work" / "lib",
                       s.folder / "work" / "log"):
            folder.mkdir(parents=True, exist_ok=True)
        s.decryption_keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        s.crio_conf.write_text(config.crio_conf(s))
        s.registries_conf.write_text(config.registries_conf([s.registry]))
        (s.cni_conf_dir / "10-realnode.conflist").write_text(config.cni_conflist(s))
        s.kubelet_config.write_text(config.kubelet_config(s))

    def start(self) -> None:
        s = self.settings
        self.write_files()
        host.make_cgroup_root(s.cgroup_root)
        pause = s.binaries / "pause"
        self._spawn("holder", ["unshare", "--mount", "--propagation", "private", "--",
                               str(pause)], pdeathsig="KILL")
        self._await_namespace(pause)
        self._in_namespace(["sh", "-c", _MOUNTS, "mounts", str(s.folder / "upper"),
                            str(s.folder / "work"), str(self.hosts_file)])
        self._spawn("crio", ["nsenter", "--target", str(self.procs["holder"].pid), "--mount",
                             "--", "env", f"PATH={s.path_env}", *config.crio_args(s)])
        self._await_socket()
        self._spawn("kubelet", ["nsenter", "--target", str(self.procs["holder"].pid),
                                "--mount", "--", "env", f"PATH={config.kubelet_path_env()}",
                                *config.kubelet_args(s)])

    def _spawn(self, name: str, argv: list[str], *, pdeathsig: str = "TERM") -> None:
        log = (self.settings.folder / f"{name}.log").open("ab")
        try:
            proc = subprocess.Popen(["setpriv", f"--pdeathsig={pdeathsig}", "--", *argv],
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            log.close()
        self.procs[name] = proc
        owner = host.Owner.of(proc.pid)
        if owner is not None:
            self.on_started(owner)

    def _await_namespace(self, pause: Path) -> None:
        """Until the holder runs ``pause`` in a mount namespace that is not ours: before
        that, ``nsenter --target`` would mount over the host's own /var/lib."""
        proc = self.procs["holder"]
        mine = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise NodeFailed(f"{self.name}: unshare exited with {proc.returncode}: "
                                 f"{_tail(self.settings.folder / 'holder.log')}")
            with contextlib.suppress(OSError):
                if (os.readlink(f"/proc/{proc.pid}/exe") == str(pause.resolve())
                        and os.readlink(f"/proc/{proc.pid}/ns/mnt") != mine):
                    return
            time.sleep(0.01)
        raise NodeFailed(f"{self.name}: the mount namespace holder did not start")

    def _in_namespace(self, argv: list[str]) -> None:
        done = subprocess.run(["nsenter", "--target", str(self.procs["holder"].pid),
                               "--mount", "--", *argv], capture_output=True, text=True,
                              timeout=30, check=False)
        if done.returncode != 0:
            raise NodeFailed(f"{self.name}: {' '.join(argv[:3])} failed: {done.stderr.strip()}")

    def _await_socket(self) -> None:
        s = self.settings
        deadline = time.monotonic() + START_LIMIT
        while time.monotonic() < deadline:
            proc = self.procs["crio"]
            if proc.poll() is not None:
                raise NodeFailed(f"{self.name}: CRI-O exited with {proc.returncode}: "
                                 f"{_tail(s.folder / 'crio.log')}")
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
                sock.connect(str(s.crio_socket))
                return
            time.sleep(0.05)
        raise NodeFailed(f"{self.name}: CRI-O not listening on {s.crio_socket} within "
                         f"{START_LIMIT:.0f} s: {_tail(s.folder / 'crio.log')}")

    def check_running(self) -> None:
        """Raise :class:`NodeFailed` if one of the node's daemons has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise NodeFailed(f"{self.name}: {name} exited with {proc.returncode}: "
                                 f"{_tail(self.settings.folder / f'{name}.log')}")

    # --- stop -------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop and remove everything of this node; the problems met (each step is tried
        whatever the one before did)."""
        problems: list[str] = []

        def attempt(what: str, step: Callable[[], None]) -> None:
            started = time.monotonic()
            try:
                step()
            except Exception as exc:  # keep going: the next step may still give back more
                problems.append(f"{self.name}: {what}: {exc}")
            self.stop_seconds[what] = time.monotonic() - started

        attempt("stopping the kubelet", lambda: self._stop("kubelet"))
        attempt("removing pods", self._remove_pods)
        attempt("stopping CRI-O", lambda: self._stop("crio"))
        attempt("stopping the namespace holder", lambda: self._stop("holder"))
        attempt("emptying the cgroups", lambda: host.empty_cgroup_root(self.settings.cgroup_root))
        attempt("removing the cgroups",
                lambda: host.remove_cgroup_root(self.settings.cgroup_root))
        attempt("removing the bridge", lambda: host.delete_link(self.settings.bridge))
        return problems

    def _remove_pods(self) -> None:
        proc = self.procs.get("crio")
        if proc is None or proc.poll() is not None:
            return
        host.thaw(self.settings.cgroup_root)  # a frozen container would not stop
        containers = self.crictl("ps", "-q", timeout=10).stdout.split()
        if containers:  # at once: CRI-O would give each its 30 s to stop on SIGTERM
            self.crictl("stop", "-t", "0", *containers, timeout=15)
        pods = self.crictl("pods", "-q", timeout=10).stdout.split()
        if pods:  # stops the sandboxes and removes them with their containers
            self.crictl("rmp", "-f", *pods, timeout=15)

    def _stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# Run by ``sh -c`` inside the holder's namespace: $1 upper, $2 work, $3 the hosts file.
_MOUNTS = """set -e
for d in lib log; do
  mount -t overlay overlay -o "lowerdir=/var/$d,upperdir=$1/$d,workdir=$2/$d" "/var/$d"
done
mount --bind "$3" /etc/hosts
"""
