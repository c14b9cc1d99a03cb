"""A real Kubernetes control plane for the tests, found or started the envtest way.

controller-runtime users know the convention: ``KUBEBUILDER_ASSETS`` names a folder
holding ``kube-apiserver`` and ``etcd`` (``scripts/ensure-envtest`` makes one from
``../shared/envtest``); or ``CONTROLPLANE_TEST_KUBECONFIG`` names an existing cluster.
:func:`find_real_cluster` answers which, or why neither (one line saying how to enable
it, the skip reason).

:class:`Envtest` starts Debian's etcd and the real ``kube-apiserver`` on free loopback
ports: TLS with a CA of its own, static bearer tokens (``--token-auth-file``; the
``admin`` identity is in ``system:masters``, other identities are named by the caller),
``AlwaysAllow`` or ``RBAC`` authorization. It stops them by PID (API server first, so
open watches end within the 2 s watch-termination grace), and can restart the API server
alone on the same port with the same etcd (what a control-plane upgrade looks like to
a client: every watch breaks, resumed watches may meet 410 Gone). Given a ``hosts_file``,
the API server runs in a mount namespace of its own where that file is ``/etc/hosts``
(real kubelets it dials by node name: ``tests/support/realnode.py``).

Nothing here mocks: the processes are the real binaries; tests talk to them only over
HTTPS with the kubeconfigs :meth:`Envtest.write_kubeconfig` writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from drivers.loopback import free_port

ASSETS = "KUBEBUILDER_ASSETS"
KUBECONFIG = "CONTROLPLANE_TEST_KUBECONFIG"
ADMIN_TOKEN = "envtest-admin-token"
HOW_TO_ENABLE = (f"no real API server: run `eval \"$(scripts/ensure-envtest)\"` (sets {ASSETS}; "
                 f"needs ../shared/envtest) or set {KUBECONFIG} to a cluster's kubeconfig")


@dataclass(frozen=True)
class Identity:
    """A user the API server authenticates by bearer token (``--token-auth-file``)."""

    user: str
    token: str
    groups: tuple[str, ...] = ()


def service_account(name: str, namespace: str, token: str) -> Identity:
    """The identity RBAC binds a ServiceAccount subject to (its user name and groups)."""
    return Identity(f"system:serviceaccount:{namespace}:{name}", token,
                    ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                     "system:authenticated"))


#: The controllers the controller-owned workload tests need (the README's list).
CONTROLLERS = ("replicaset", "deployment", "statefulset", "garbagecollector",
               "persistentvolume-binder")

ADMIN = Identity("envtest-admin", ADMIN_TOKEN, ("system:masters", "system:authenticated"))


def find_real_cluster() -> tuple[str, str]:
    """``("kubeconfig", path)``, ``("assets", folder)`` or ``("none", how to enable it)``."""
    kubeconfig = os.environ.get(KUBECONFIG)
    if kubeconfig:
        return "kubeconfig", kubeconfig
    assets = os.environ.get(ASSETS)
    if assets:
        missing = [b for b in ("kube-apiserver", "etcd")
                   if not os.access(Path(assets) / b, os.X_OK)]
        if missing:
            raise RuntimeError(f"{ASSETS}={assets} has no executable {', '.join(missing)}: "
                               "run scripts/ensure-envtest")
        return "assets", assets
    return "none", HOW_TO_ENABLE


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(folder: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost, and a service-account key."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=envtest-ca", cwd=folder)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=kube-apiserver", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext",
             cwd=folder)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)


@dataclass
class Envtest:
    """etcd + kube-apiserver on free loopback ports; :meth:`start`, :meth:`stop`."""

    assets: Path
    workdir: Path
    authorization: str = "AlwaysAllow"
    identities: Sequence[Identity] = ()
    extra_args: Sequence[str] = ()
    etcd_port: int = 0
    api_port: int = 0
    hosts_file: Path | None = None  # seen by the API server as /etc/hosts
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def start(self) -> Envtest:
        self.workdir.mkdir(parents=True, exist_ok=True)
        make_pki(self.workdir / "pki")
        rows = [ADMIN, *self.identities]
        (self.workdir / "tokens.csv").write_text("".join(
            f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"\n' for i in rows))
        self.etcd_port, peer, self.api_port = free_port(), free_port(), free_port()
        try:
            self._start_etcd(peer)
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self._procs[name] = subprocess.Popen(argv, stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _start_etcd(self, peer: int) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [str(self.assets / "etcd"), "--data-dir", str(self.workdir / "etcd"),
                             "--listen-client-urls", client, "--advertise-client-urls", client,
                             "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", f"default={peer_url}", "--name", "default",
                             "--unsafe-no-fsync"])
        self._wait("etcd", f"{client}/health", None, limit=30)

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        # unshare + a bind mount, then exec: the PID stays the API server's.
        private_hosts = [] if self.hosts_file is None else [
            "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts_file)]
        self._spawn("kube-apiserver", [
            *private_hosts, str(self.assets / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            f"--authorization-mode={self.authorization}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none", "--allow-privileged=true",
            "--shutdown-watch-termination-grace-period=2s",
            *self.extra_args])
        self._wait("kube-apiserver", f"{self.server}/readyz", ADMIN_TOKEN, limit=90)

    def _wait(self, name: str, url: str, token: str | None, *, limit: float) -> None:
        """Poll a health endpoint of a process we started (another process: no event)."""
        context = ssl.create_default_context(cafile=str(self.ca_file)) if token else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + limit
        last = ""
        while time.monotonic() < deadline:
            proc = self._procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting: "
                                   f"{self._tail(name)}")
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                            timeout=5, context=context) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:  # e.g. 500 while post-start hooks run
                exc.close()  # it holds the response and its TLS socket
                last = str(exc)
            except OSError as exc:  # not listening yet
                last = str(exc)
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready at {url} within {limit:.0f} s ({last}): "
                           f"{self._tail(name)}")

    def _tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def _stop(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def start_controllers(self, controllers: Sequence[str] = CONTROLLERS) -> None:
        """The real kube-controller-manager (``controllers``) and kube-scheduler, as
        ``../shared/envtest`` ships them; fails (the test) if the assets lack them."""
        missing = [b for b in ("kube-controller-manager", "kube-scheduler")
                   if not os.access(self.assets / b, os.X_OK)]
        if missing:
            raise RuntimeError(f"{self.assets} has no {', '.join(missing)}: run "
                               "scripts/ensure-envtest with ../shared/envtest holding them")
        kubeconfig = self.write_kubeconfig(self.workdir / "controllers.kubeconfig")
        common = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                  f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
                  "--bind-address=127.0.0.1", "--secure-port=0"]
        self._spawn("kube-controller-manager", [
            str(self.assets / "kube-controller-manager"), *common,
            f"--controllers={','.join(controllers)}",
            f"--service-account-private-key-file={self.workdir / 'pki' / 'sa.key'}",
            "--use-service-account-credentials=false"])
        self._spawn("kube-scheduler", [str(self.assets / "kube-scheduler"), *common])
        for name in ("kube-controller-manager", "kube-scheduler"):
            proc = self._procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited at once: {self._tail(name)}")

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port, same etcd."""
        self._stop("kube-apiserver")
        self._start_apiserver()

    def stop(self) -> None:
        self._stop("kube-scheduler")
        self._stop("kube-controller-manager")
        self._stop("kube-apiserver")
        self._stop("etcd")

    def write_kubeconfig(self, path: Path, identity: Identity = ADMIN, *,
                         namespace: str | None = None) -> Path:
        return write_kubeconfig(path, self.server, self.ca_file, identity.token,
                                user=identity.user, namespace=namespace)


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, *, user: str,
                     namespace: str | None = None) -> Path:
    context: dict[str, str] = {"cluster": "envtest", "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "envtest",
           "clusters": [{"name": "envtest", "cluster": {
               "server": server, "certificate-authority": str(ca_file)}}],
           "users": [{"name": user, "user": {"token": token}}],
           "contexts": [{"name": "envtest", "context": context}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def running_envtest(assets: Path, workdir: Path, *, authorization: str = "AlwaysAllow",
                    identities: Sequence[Identity] = (),
                    extra_args: Sequence[str] = (),
                    hosts_file: Path | None = None) -> Iterator[Envtest]:
    env = Envtest(assets, workdir, authorization, identities, extra_args,
                  hosts_file=hosts_file)
    env.start()
    try:
        yield env
    finally:
        env.stop()


NODES = ("node-1", "node-2", "node-3")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KubeletRole:
    """``cpctl sim nodes`` as a subprocess: the stand-in kubelets and scheduler."""

    proc: subprocess.Popen[str]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_kubelet_role(kubeconfig: Path, nodes: Sequence[str], log: Path,
                       *extra: str) -> KubeletRole:
    """Start ``cpctl sim nodes`` and wait for its ready line (nodes registered, Ready)."""
    import sys
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "sim", "nodes", "--kubeconfig",
             str(kubeconfig), "--nodes", ",".join(nodes), *extra],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    role = KubeletRole(proc, log)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        role.stop()
        raise RuntimeError(f"cpctl sim nodes exited before its ready line: "
                           f"{log.read_text(errors='replace')[-2000:]}")
    return role


@dataclass
class RealCluster:
    """A real API server for a test session: its admin kubeconfig and usable nodes."""

    kubeconfig: Path
    nodes: list[str]
    envtest: Envtest | None = None
    kubelets: KubeletRole | None = None

    def restart_apiserver(self) -> None:
        if self.envtest is None:
            import pytest
            pytest.skip("restarts the API server: only possible on the envtest one")
        self.envtest.restart_apiserver()


@contextlib.contextmanager
def open_real_cluster(workdir: Path) -> Iterator[RealCluster]:
    """The session's real cluster (see :func:`find_real_cluster`); skips when none."""
    import pytest
    kind, where = find_real_cluster()
    if kind == "none":
        pytest.skip(where)
    if kind == "kubeconfig":
        yield RealCluster(Path(where), [])
        return
    with running_envtest(Path(where), workdir) as env:
        kubeconfig = env.write_kubeconfig(workdir / "admin.kubeconfig")
        role = start_kubelet_role(kubeconfig, NODES, workdir / "kubelets.log")
        try:
            yield RealCluster(kubeconfig, list(NODES), env, role)
        finally:
            role.stop()
