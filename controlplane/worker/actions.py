"""Run a decision's actions after its commit: idempotent handlers, retried with tenacity.

Actions run in order and stop at the first failure (later actions may depend on it).
Retryable errors and timeouts are retried with jittered exponential backoff up to
``attempts``; a terminal error, an unknown action type, or exhausted retries come back as
an :class:`ActionFailure`, which the runtime records as an ``ActionFailed`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from controlplane.engine.decider import Action
from controlplane.engine.events import ActionFailed
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from controlplane.worker.ports import ActionHandler


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    timeout_seconds: float = 30.0
    backoff_base_seconds: float = 0.2
    backoff_max_seconds: float = 10.0


@dataclass(frozen=True)
class ActionFailure:
    action: Action
    error_class: str
    message: str
    retryable: bool
    attempts: int

    def to_event(self, at: datetime) -> ActionFailed:
        """The ``ActionFailed`` event; ``at`` lets ``evolve`` (which has no clock) time
        its backoff."""
        return ActionFailed(at=at, action=self.action.type, key=self.action.key,
                            params=self.action.params, error_class=self.error_class,
                            message=self.message, retryable=self.retryable,
                            attempts=self.attempts)


class ActionRunner:
    """Action type -> handler, with one retry policy."""

    def __init__(self, handlers: Mapping[str, ActionHandler], policy: RetryPolicy) -> None:
        self._handlers = dict(handlers)
        self._policy = policy

    def knows(self, action_type: str) -> bool:
        """Whether an action of this type has a handler here (an older worker may meet
        one a newer release wrote in a machine's outbox: ``worker.readable``)."""
        return action_type in self._handlers

    async def run_all(self, actions: Sequence[Action]) -> ActionFailure | None:
        for action in actions:
            failure = await self.run(action)
            if failure is not None:
                return failure
        return None

    async def run(self, action: Action) -> ActionFailure | None:
        handler = self._handlers.get(action.type)
        if handler is None:
            known = ", ".join(sorted(self._handlers)) or "none"
            return ActionFailure(action, "UnknownAction",
                                 f"no handler for action type {action.type!r} (known: {known})",
                                 retryable=False, attempts=0)
        policy = self._policy
        attempts = 0
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((RetryableActionError, TimeoutError)),
            wait=wait_random_exponential(multiplier=policy.backoff_base_seconds,
                                         max=policy.backoff_max_seconds),
            stop=stop_after_attempt(policy.attempts),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    async with asyncio.timeout(policy.timeout_seconds):
                        await handler(action)
        except TerminalActionError as exc:
            return ActionFailure(action, exc.error_class, str(exc), False, attempts)
        except RetryableActionError as exc:
            return ActionFailure(action, exc.error_class, str(exc), True, attempts)
        except TimeoutError:
            return ActionFailure(action, "Timeout",
                                 f"no answer within {policy.timeout_seconds}s", True, attempts)
        except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
            return ActionFailure(action, "RetryError", str(exc), True, attempts)
        return None
