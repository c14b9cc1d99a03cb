"""The kubelet role's knobs, checked once: node names and sizes, delays, heartbeat, backoff.

:class:`RoleOptions` is what ``cpctl sim nodes`` parses its flags into; :meth:`check`
refuses bad input with a :class:`RoleInputError` (exit code 2) that names the flag and
says what to pass instead. Called by the CLI and :mod:`drivers.kubelet.role`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.errors import UsageError
from drivers.sim.objects import quantity

#: A node name is a DNS subdomain (lowercase alphanumerics, '-' and '.').
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class RoleInputError(UsageError):
    """A flag of ``cpctl sim nodes`` has a value the role cannot use."""


@dataclass(frozen=True)
class RoleOptions:
    """What the kubelet role registers and how fast its pods start and stop."""

    nodes: tuple[str, ...]
    cpu: str = "4"  # capacity = allocatable, like the simulator's SimCluster nodes
    memory: str = "8Gi"
    pods: int = 110
    start_seconds: float = 0.0  # a bound pod turns Running this long after it is seen
    stop_seconds: float = 0.0  # a deleted pod goes after min(this, its grace period)
    heartbeat_seconds: float = 15.0  # node status refresh (a node lifecycle controller's
    # default grace is 40 s: two missed heartbeats still leave the node Ready)
    ready_timeout: float = 60.0  # how long registration may take before giving up
    backoff_initial: float = 0.2  # retry backoff after a failed write or a broken watch
    backoff_max: float = 5.0
    concurrent_writes: int = 16  # writes of one pass in flight at once (many nodes' kubelets)
    schedule: bool = True  # bind pending pods; off when a real kube-scheduler runs

    def check(self) -> RoleOptions:
        """``self`` when every value is usable, else a :class:`RoleInputError`."""
        if not self.nodes:
            raise RoleInputError("--nodes: no node names given",
                                 hint="pass a comma-separated list, e.g. --nodes node-1,node-2")
        for name in self.nodes:
            if len(name) > 253 or not _NAME.match(name):
                raise RoleInputError(
                    f"--nodes: {name!r} is not a valid node name",
                    hint="use lowercase letters, digits, '-' and '.', e.g. "
                         "--nodes node-1,node-2,node-3")
        if len(set(self.nodes)) != len(self.nodes):
            raise RoleInputError("--nodes: a node name is listed twice",
                                 hint="name each node once, e.g. --nodes node-1,node-2")
        for flag, value, example in (("--node-cpu", self.cpu, "4 or 500m"),
                                     ("--node-memory", self.memory, "8Gi or 512Mi")):
            try:
                ok = quantity(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise RoleInputError(f"{flag}: {value!r} is not a positive Kubernetes "
                                     f"quantity", hint=f"pass e.g. {flag} {example}")
        if self.pods < 1:
            raise RoleInputError(f"--node-pods: {self.pods} is not a positive number of pods",
                                 hint="pass e.g. --node-pods 110 (a kubelet's default)")
        for flag, seconds in (("--start-seconds", self.start_seconds),
                              ("--stop-seconds", self.stop_seconds)):
            if not 0 <= seconds <= 3600:
                raise RoleInputError(f"{flag}: {seconds} is not between 0 and 3600 seconds",
                                     hint=f"pass e.g. {flag} 0 (at once) or {flag} 2")
        if self.concurrent_writes < 1:
            raise RoleInputError(f"concurrent_writes: {self.concurrent_writes} is not a "
                                 "positive number of writes", hint="use e.g. 16")
        return self
