"""Gates on the nodes' runtime calls: a test holds an agent's ``podman container <verb>``
call at its start, does what it must while the call is held (kill the agent, delete the
node), then lets it go.

The agents of a criu world run ``podman`` from the world's own ``bin`` folder: a shell
wrapper that execs the real podman, unless a test armed a gate for that node, verb and
pod. The first call that matches takes the gate (an atomic rename, so only one call
waits), and waits until the test releases it. So the step a fault test aims at is caught
by the call itself, never by sampling ``/proc`` for a process that may come and go
between two samples.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.waiting import wait_for

_WRAPPER = """#!/bin/sh
# podman as this world's agents run it: the real one ({real}), except that a call a test
# armed a gate for (tests/criu/gates.py) waits at its start until the test lets it go.
for gate in {gates}/*.armed; do
  [ -e "$gate" ] || continue
  {{ IFS= read -r root; IFS= read -r verb; IFS= read -r name; }} < "$gate" || continue
  case "$*" in *"$root/storage"*) ;; *) continue ;; esac
  case " $* " in *" container $verb "*) ;; *) continue ;; esac
  case "$*" in *"$name"*) ;; *) continue ;; esac
  held="${{gate%.armed}}.held"
  mv "$gate" "$held.taken" 2>/dev/null || continue
  echo $$ > "$held.taken" && mv "$held.taken" "$held"  # held, naming this call's pid
  while [ -e "$held" ]; do sleep 0.02; done
  break
done
exec {real} "$@"
"""


def install_gated_podman(folder: Path) -> Path:
    """Write the wrapper as ``folder/bin/podman``, gates in ``folder/gates``; returns the
    ``bin`` folder to put first on the agents' PATH."""
    real = shutil.which("podman")
    assert real is not None, "podman is not installed: run scripts/ensure-criu"
    bin_dir, gates = folder / "bin", folder / "gates"
    bin_dir.mkdir(parents=True, exist_ok=True)
    gates.mkdir(exist_ok=True)
    wrapper = bin_dir / "podman"
    wrapper.write_text(_WRAPPER.format(real=real, gates=gates))
    wrapper.chmod(0o755)
    return bin_dir


class Gate:
    """One armed gate: :meth:`wait_held` until the call is held; leaving the ``with``
    block of :func:`holding` lets it go (or disarms a gate no call took). The held file
    is written whole under another name, then renamed: never read half-written."""

    def __init__(self, armed: Path, what: str) -> None:
        self.armed, self.what = armed, what
        self.held = armed.with_suffix(".held")

    def wait_held(self, ended: Callable[[], str | None], limit: float = 180) -> int:
        """Until the call is held; its pid (the same process then runs podman itself).
        Fails at once if ``ended()`` names an end first (the operation finished without
        ever making the call)."""
        def check() -> int | None:
            with contextlib.suppress(FileNotFoundError):
                return int(self.held.read_text())
            gone = ended()
            assert gone is None, f"{self.what} was never called: {gone}"
            return None
        pid: int = wait_for(check, f"{self.what} to be called", limit)
        return pid

    def release(self) -> None:
        self.armed.unlink(missing_ok=True)
        self.held.unlink(missing_ok=True)


@contextlib.contextmanager
def holding(gates: Path, node_root: Path, verb: str, name: str) -> Iterator[Gate]:
    """Arm a gate for the next ``podman container <verb>`` naming ``name`` on the node
    whose podman root is ``node_root``; released when the block ends."""
    key = uuid.uuid4().hex[:8]
    armed = gates / f"{verb}-{key}.armed"
    staged = gates / f"{verb}-{key}.staged"  # written whole, then renamed: never half-read
    staged.write_text(f"{node_root}\n{verb}\n{name}\n")
    staged.rename(armed)
    gate = Gate(armed, f"podman container {verb} of {name} on {node_root.name}")
    try:
        yield gate
    finally:
        gate.release()
