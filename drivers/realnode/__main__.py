"""``python -m drivers.realnode``: real nodes by hand, against a running API server.

``cpctl sim nodes --real`` runs ``up`` (its flags and help live in
:mod:`controlplane.cli.sim`; the CLI may not import a driver, so it execs this). Verbs:

- ``up --kubeconfig K --nodes node-a,node-b [--state-dir D] [--pki-dir P]``: start the
  nodes (:class:`~drivers.realnode.world.RealNodes`), print one ready line once all are
  Ready, run until SIGTERM/SIGINT, give everything back, exit 0 (1 if a node fails);
- ``pki --nodes node-a,node-b --dir P``: make the certificates and hosts file first and
  print the kube-apiserver flags that name them, for a server started afterwards (then
  ``kubectl logs`` and ``exec`` reach the kubelets); ``up --pki-dir P`` uses them;
- ``sweep``: give back what worlds killed with SIGKILL left on this host.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from drivers.realnode import config, host
from drivers.realnode.node import NodeFailed
from drivers.realnode.world import HOW_TO_ENABLE, RealNodes, binaries_folder, prepared_pki


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def up(args: argparse.Namespace) -> int:
    binaries = binaries_folder()
    if binaries is None:
        print(f"realnode: {HOW_TO_ENABLE}", file=sys.stderr)
        return 2
    kubeconfig = Path(args.kubeconfig or os.environ.get("KUBECONFIG")
                      or Path.home() / ".kube" / "config")
    state = Path(args.state_dir) if args.state_dir else Path(
        tempfile.mkdtemp(prefix="realnode-"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    nodes = RealNodes(state, _names(args.nodes), binaries, log_level=args.log_level,
                      pki_dir=Path(args.pki_dir) if args.pki_dir else None)
    try:
        nodes.prepare().start(kubeconfig)
        nodes.wait_ready(args.ready_timeout)
        assert nodes.api is not None
        print(f"real nodes ready: {','.join(nodes.names)} on {nodes.api.server}; "
              f"registry {nodes.registry.host if nodes.registry else '-'}; "
              f"images {nodes.pause_image} {nodes.busybox_image}; state {state}", flush=True)
        for node in nodes.nodes.values():
            s = node.settings
            print(f"  {s.name}: kubelet https://127.0.0.1:{s.kubelet_port} "
                  f"(CA {nodes.pki.ca_cert if nodes.pki else '-'}), CRI-O "
                  f"unix://{s.crio_socket}, logs {s.folder}", flush=True)
        while not stop.wait(1):
            for node in nodes.nodes.values():
                node.check_running()
        return 0
    except NodeFailed as exc:
        print(f"realnode: {exc}", file=sys.stderr)
        return 1
    finally:
        problems = nodes.stop()
        for problem in problems:
            print(f"realnode: {problem}", file=sys.stderr)
        print("real nodes stopped", flush=True)


def pki(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    names = _names(args.nodes)
    made = prepared_pki(folder, names, reuse=True)
    hosts = folder / "hosts"  # where ``up --pki-dir`` keeps it too
    hosts.write_text(config.hosts_file(names))
    cert, key = made.apiserver_client
    print(f"# start kube-apiserver with these flags, seeing {hosts} as /etc/hosts")
    print(" ".join(config.apiserver_args(client_cert=cert, client_key=key,
                                         kubelet_ca=made.ca_cert)))
    return 0


def sweep(_args: argparse.Namespace) -> int:
    with host.host_lock():
        for record in sorted((host.RUN_DIR / "worlds").glob("*.json")):
            held = host.Holding.load(record)
            if not held.owner.alive():
                print(f"giving back slot {held.slot} ({held.folder})")
                host.give_back(held)
                record.unlink(missing_ok=True)
        host.SysctlRecord.let_go(host.me())
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m drivers.realnode",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    verbs = p.add_subparsers(dest="verb", required=True)
    u = verbs.add_parser("up", help="start real nodes until SIGTERM/SIGINT")
    u.add_argument("--kubeconfig", default=None)
    u.add_argument("--nodes", default="node-a,node-b")
    u.add_argument("--state-dir", default=None)
    u.add_argument("--pki-dir", default=None)
    u.add_argument("--ready-timeout", type=float, default=90.0)
    u.add_argument("--log-level", default="info")
    u.set_defaults(run=up)
    k = verbs.add_parser("pki", help="make the certificates; print the API server's flags")
    k.add_argument("--nodes", default="node-a,node-b")
    k.add_argument("--dir", required=True)
    k.set_defaults(run=pki)
    s = verbs.add_parser("sweep", help="give back what killed worlds left on this host")
    s.set_defaults(run=sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
