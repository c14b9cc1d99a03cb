"""Checkpoint handoff: the source node's agent streams a dumped checkpoint straight to the
target node's agent (sealed with the agents' shared key), while the registry copy is
written beside it; the target restores as soon as it has it.

- :mod:`~drivers.agent.handoff.server`: :class:`HandoffServer` (in the source agent):
  ``offer`` / ``withdraw``; :class:`Offer`'s ``delivered()``;
- :mod:`~drivers.agent.handoff.client`: :func:`fetch_checkpoint` (in the target agent);
- :mod:`~drivers.agent.handoff.frames`: the wire format, pure;
- :mod:`~drivers.agent.handoff.errors`: :class:`HandoffFailed` and its two kinds.
"""

from drivers.agent.handoff.client import Received, ReceivedArchive, fetch_checkpoint
from drivers.agent.handoff.errors import HandoffFailed, HandoffInterrupted, HandoffRefused
from drivers.agent.handoff.server import Delivery, HandoffServer, Offer

__all__ = ["Delivery", "HandoffFailed", "HandoffInterrupted", "HandoffRefused",
           "HandoffServer", "Offer", "Received", "ReceivedArchive", "fetch_checkpoint"]
