"""The node agent: performs capture and restore requests on the pods of its node.

- :mod:`~drivers.agent.agent`: :class:`NodeAgent` (the protocol, locks, deadlines,
  reports); :mod:`~drivers.agent.requests`: reading and judging requests (pure);
- :mod:`~drivers.agent.dumper`: the :class:`Dumper` port; dumpers:
  :mod:`~drivers.agent.kubelet` (ContainerCheckpoint API) and :mod:`~drivers.agent.sim`
  (the simulator's workload marker);
- :mod:`~drivers.agent.pods`: the node's pod watch and UID-guarded patches;
  :mod:`~drivers.agent.runner`: wiring; ``python -m drivers.agent``: the process.

The protocol is documented in ``docs/protocol.md``.
"""

from drivers.agent.agent import AgentSettings, NodeAgent
from drivers.agent.dumper import Dumper
from drivers.agent.runner import node_agent

__all__ = ["AgentSettings", "Dumper", "NodeAgent", "node_agent"]
