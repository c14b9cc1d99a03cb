"""The ports the worker needs from the world; drivers implement them.

- :class:`Observer`: answer a machine's :class:`Interests` with an :class:`Observation`
  (a failed probe is a ``ProbeError`` inside the observation; ``observe`` itself should
  not raise).
- :class:`ActionHandler`: perform one action idempotently; raise
  :class:`~controlplane.worker.errors.RetryableActionError` or
  :class:`~controlplane.worker.errors.TerminalActionError` when it does not take effect.
"""

from __future__ import annotations

from typing import Protocol

from controlplane.engine.decider import Action
from controlplane.engine.observation import EMPTY_OBSERVATION, Interests, Observation


class Observer(Protocol):
    async def observe(self, interests: Interests) -> Observation: ...


class ActionHandler(Protocol):
    async def __call__(self, action: Action, /) -> None: ...


class NullObserver:
    """Observes nothing: for machine kinds whose decisions need no outside facts."""

    async def observe(self, interests: Interests) -> Observation:
        return EMPTY_OBSERVATION
