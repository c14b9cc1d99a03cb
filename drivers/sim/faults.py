"""Fault injection for the simulated API server: the hooks fault campaigns and tests use.

- :meth:`Faults.fail_next`: the next ``times`` requests of a verb (``get``, ``list``,
  ``watch``, ``create``, ``update``, ``patch``, ``delete`` or ``*``), optionally of one
  resource (``pods``...), are answered with a ``Status`` error of ``code`` (409, 429 with
  ``Retry-After``, 500, 403...) instead of being served; ``times=None``: until
  :meth:`Faults.clear`.
- :meth:`Faults.delay_next`: the next requests wait ``seconds`` before being served (to
  exercise client timeouts; the wait ends early when the server stops).
- :meth:`Faults.drop_watches` ends every open watch (``abrupt=True`` cuts the connection),
  :meth:`Faults.expire_watches` sends them ``ERROR 410 Expired``, :meth:`Faults.compact`
  forgets the change history so resuming from an older ``resourceVersion`` gets 410.

Rules are matched in the order they were added; each match consumes one use. Called by
the server's middleware (:meth:`take`) and by tests through ``SimCluster.faults``.
"""

from __future__ import annotations

from dataclasses import dataclass

from drivers.sim.objects import REASONS, ApiError
from drivers.sim.store import Store
from drivers.sim.watch import WatchHub

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass
class Rule:
    """One injected fault: which requests it hits, what they get, how many times more."""

    verb: str
    resource: str | None
    remaining: int | None
    code: int = 0  # 0: serve normally (after ``delay``)
    reason: str | None = None
    message: str = ""
    retry_after: int | None = None
    delay: float = 0.0

    def hits(self, verb: str, resource: str) -> bool:
        return (self.verb in ("*", verb) and self.resource in (None, resource)
                and (self.remaining is None or self.remaining > 0))

    def error(self) -> ApiError | None:
        if not self.code:
            return None
        reason = self.reason or REASONS.get(self.code, "Unknown")
        return ApiError(self.code, self.message or f"injected fault: {reason}", reason=reason,
                        retry_after=self.retry_after)


class Faults:
    """The fault hooks of one simulated cluster."""

    def __init__(self, store: Store, hub: WatchHub) -> None:
        self._store = store
        self._hub = hub
        self.rules: list[Rule] = []

    def fail_next(self, verb: str, *, times: int | None = 1, code: int = 500,
                  resource: str | None = None, reason: str | None = None, message: str = "",
                  retry_after: int | None = None) -> Rule:
        """Answer the next ``times`` matching requests with a ``code`` Status error."""
        _check_verb(verb)
        if code == 429 and retry_after is None:
            retry_after = 1
        rule = Rule(verb, resource, times, code=code, reason=reason, message=message,
                    retry_after=retry_after)
        self.rules.append(rule)
        return rule

    def delay_next(self, verb: str, seconds: float, *, times: int | None = 1,
                   resource: str | None = None) -> Rule:
        """Hold the next ``times`` matching requests ``seconds`` before serving them."""
        _check_verb(verb)
        rule = Rule(verb, resource, times, delay=seconds)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def take(self, verb: str, resource: str) -> Rule | None:
        """The first rule hitting this request, with one use consumed (server middleware)."""
        for rule in self.rules:
            if rule.hits(verb, resource):
                if rule.remaining is not None:
                    rule.remaining -= 1
                self.rules = [r for r in self.rules if r.remaining != 0]
                return rule
        return None

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch stream; returns how many."""
        return self._hub.drop(abrupt=abrupt)

    def expire_watches(self) -> int:
        """Send ``ERROR 410 Expired`` on every open watch and end it; returns how many."""
        return self._hub.expire()

    def compact(self) -> int:
        """Forget the change history (resumes from older versions get 410)."""
        return self._store.compact()

    def send_bookmarks(self) -> int:
        """A ``BOOKMARK`` now on every watch that allows them (not a fault; a nudge)."""
        return self._hub.send_bookmarks()


def _check_verb(verb: str) -> None:
    if verb != "*" and verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}: one of {', '.join(VERBS)} or '*'")
