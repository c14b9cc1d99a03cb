"""``python -m drivers.agent`` as a process: serves its node's requests, stops on SIGTERM.

The agent runs as its own process next to an in-process simulated cluster (as the
embedded default runs it), pushing to an OCI layout directory. Pins: it announces it is
serving, a capture request on its node is pushed and reported, and SIGTERM stops it
cleanly (exit status 0).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from controlplane.machines.contract import protocol
from drivers.registry import OciLayout
from drivers.sim import SimCluster

NS = "default"


async def test_agent_process_serves_a_capture_and_stops_on_sigterm(tmp_path: Path) -> None:
    async with SimCluster(nodes=2) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "sim.kubeconfig")
        cluster.create_pod(NS, "app", node="node-1", marker="counter=7")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drivers.agent", "--node", "node-1", "--kubeconfig",
            str(kubeconfig), "--layout", str(tmp_path / "oci"), "--dumper", "sim",
            "--workdir", str(tmp_path / "work"), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(30):
                output = b""
                while b"node agent serving node-1" not in output:
                    line = await proc.stdout.readline()
                    assert line, f"the agent exited: {output.decode()}"
                    output += line
            pod = cluster.pod(NS, "app")
            assert pod is not None
            uid = pod["metadata"]["uid"]
            artifact = "localhost:5000/checkpoints/app:ck-p"
            notes = protocol.capture_request(checkpoint_id="ck-p", artifact=artifact,
                                             source_uid=uid, containers=(), quiesce=False,
                                             saver="{}")

            def annotate(obj: dict[str, object]) -> None:
                obj["metadata"]["annotations"].update(notes)  # type: ignore[index]

            cluster.store.mutate("pods", NS, "app", annotate)

            def reported() -> str:
                p = cluster.pod(NS, "app") or {}
                return str(p["metadata"]["annotations"].get(protocol.REPORT_STATE, ""))

            await cluster.wait_for(lambda: reported() in ("Pushed", "Failed"),
                                   limit_seconds=20, what="the agent's report")
            assert reported() == "Pushed"
            tag = await OciLayout(tmp_path / "oci").resolve("localhost:5000/checkpoints/app",
                                                            "ck-p")
            assert tag is not None
            assert tag.annotations[protocol.MANIFEST_SOURCE_POD_UID] == uid
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                rest, _ = await proc.communicate()
        assert proc.returncode == 0, rest.decode()
        assert b"node agent stopped" in rest
