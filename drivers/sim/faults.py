"""Fault injection for the simulated API server: the hooks fault campaigns and tests use.

One-shot faults, for tests that need one failure at one point:

- :meth:`Faults.fail_next`: the next ``times`` requests of a verb (``get``, ``list``,
  ``watch``, ``create``, ``update``, ``patch``, ``delete``, ``deletecollection`` or ``*``),
  optionally of one resource, namespace or object, are answered with a ``Status`` error
  of ``code`` instead of being served; ``times=None``: until :meth:`Faults.clear`.
- :meth:`Faults.delay_next`: the next requests wait ``seconds`` before being served.
- :meth:`Faults.drop_watches` ends every open watch (``abrupt=True`` cuts the connection),
  :meth:`Faults.expire_watches` sends them ``ERROR 410 Expired``, :meth:`Faults.compact`
  forgets the change history so resuming from an older ``resourceVersion`` gets 410.

Standing faults, for reliability campaigns (until :meth:`Faults.clear` or
:meth:`Faults.remove`):

- :meth:`Faults.error_rate`: each matching request fails with probability ``rate``;
- :meth:`Faults.latency`: each matching request waits ``seconds`` (+ up to ``jitter``);
- :meth:`Faults.drop_watch_rate`: after each event a watch sends, the stream ends with
  probability ``rate``;
- :meth:`Faults.conflict_storm`: writes (to one object, or to every object of a resource)
  get ``409 Conflict`` for ``times`` requests and/or ``seconds``;
- :meth:`Faults.forbid`: a request the RBAC of a real cluster would refuse (403, with
  the real server's message).

Randomness comes from one ``random.Random(seed)``, so a campaign replays exactly when its
requests arrive in the same order; time windows read an injectable ``clock``. A request
takes at most one delay rule and one error rule, each the first that hits in the order
added; each hit uses one of the rule's ``times``. ``injected`` counts what was injected.
Called by the server's middleware (:meth:`Faults.take`), the watch streams
(:meth:`Faults.watch_interrupt`), ``cpctl sim up --fault`` (see
:mod:`drivers.sim.faultspec`) and tests through ``SimCluster.faults``. The same rules
also run in front of a real API server: :mod:`drivers.sim.faultproxy` builds a
:class:`Faults` over its own :class:`History` (etcd) and :class:`Watches` (proxied
streams).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from drivers.sim.objects import REASONS, ApiError

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITES = ("update", "patch", "delete")
SERVICE_ACCOUNT = "system:serviceaccount:default:controlplane"

Clock = Callable[[], float]


@dataclass(frozen=True)
class Request:
    """What one API request names (the server's middleware builds it)."""

    verb: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    user: str | None = None  # who sent it, when known (a 403 names them)


class History(Protocol):
    """The change history watches resume from (the simulator's store, or etcd)."""

    def compact(self) -> int:
        """Forget every change up to now; returns the version compacted at."""
        ...


class Watches(Protocol):
    """The open watch streams (the simulator's hub, or a proxy's proxied streams)."""

    #: Asked after every event a stream sends: ``"drop"``, ``"cut"`` or ``None``.
    interrupt: Callable[[], str | None]

    def drop(self, *, abrupt: bool = False) -> int: ...

    def expire(self) -> int: ...

    def send_bookmarks(self) -> int: ...


@dataclass
class Rule:
    """One injected fault: which requests it hits, what they get, how long it lasts."""

    verbs: tuple[str, ...]  # ("*",) for every verb
    resource: str | None
    remaining: int | None  # None: no count limit
    namespace: str | None = None
    name: str | None = None
    code: int = 0  # 0: serve normally (after the delay)
    reason: str | None = None
    message: str = ""
    retry_after: int | None = None
    delay: float = 0.0
    jitter: float = 0.0
    rate: float = 1.0  # probability that a matching request is hit
    until: float | None = None  # on the faults' clock; None: no deadline
    user: str | None = None  # who a 403 says was refused; None: the sender, if known

    def matches(self, request: Request, now: float) -> bool:
        return ("*" in self.verbs or request.verb in self.verbs) and \
            self.resource in (None, request.resource) and \
            self.namespace in (None, request.namespace) and \
            self.name in (None, request.name) and self.live(now)

    def live(self, now: float) -> bool:
        return (self.remaining is None or self.remaining > 0) and \
            (self.until is None or now < self.until)

    def error(self, request: Request) -> ApiError | None:
        """The refusal for ``request``, worded as a real API server words it."""
        if not self.code:
            return None
        reason = self.reason or REASONS.get(self.code, "Unknown")
        details = {"kind": request.resource, **({"name": request.name} if request.name else {})}
        message = self.message
        if not message and self.code == 403:
            message = forbidden_message(request, self.user or request.user or SERVICE_ACCOUNT)
        elif not message and self.code == 409 and reason == "Conflict":
            message = (f'Operation cannot be fulfilled on {request.resource} '
                       f'"{request.name or ""}": the object has been modified; please apply '
                       "your changes to the latest version and try again")
        return ApiError(self.code, message or f"injected fault: {reason}", reason=reason,
                        retry_after=self.retry_after, details=details)


def forbidden_message(request: Request, user: str) -> str:
    """A real API server's RBAC refusal (``pods "x" is forbidden: User ... cannot ...``)."""
    subject = f'{request.resource} "{request.name}"' if request.name else request.resource
    where = f'in the namespace "{request.namespace}"' if request.namespace else \
        "at the cluster scope"
    return (f'{subject} is forbidden: User "{user}" cannot {request.verb} resource '
            f'"{request.resource}" in API group "" {where}')


@dataclass(frozen=True)
class Hit:
    """What the middleware does to one request: wait ``delay``, then fail with ``error``."""

    delay: float = 0.0
    error: ApiError | None = None


class Faults:
    """The fault hooks of one simulated cluster (or of one proxy to a real one)."""

    def __init__(self, history: History, watches: Watches, *, seed: int = 0,
                 clock: Clock = time.monotonic) -> None:
        self._history = history
        self._watches = watches
        self.clock = clock
        self.rng = random.Random(seed)
        self.rules: list[Rule] = []
        self.watch_drop: tuple[float, bool] = (0.0, False)  # (rate, abrupt)
        self.injected: Counter[str] = Counter()  # "error 409", "delay", "watch drop"...
        watches.interrupt = self.watch_interrupt

    def seed(self, seed: int) -> None:
        """Restart the random sequence (a campaign replays from here)."""
        self.rng.seed(seed)

    # --- one-shot --------------------------------------------------------------------

    def fail_next(self, verb: str | Sequence[str], *, times: int | None = 1, code: int = 500,
                  resource: str | None = None, namespace: str | None = None,
                  name: str | None = None, reason: str | None = None, message: str = "",
                  retry_after: int | None = None) -> Rule:
        """Answer the next ``times`` matching requests with a ``code`` Status error."""
        if code == 429 and retry_after is None:
            retry_after = 1
        return self._add(Rule(check_verbs(verb), resource, times, namespace=namespace, name=name,
                              code=code, reason=reason, message=message,
                              retry_after=retry_after))

    def delay_next(self, verb: str | Sequence[str], seconds: float, *, times: int | None = 1,
                   resource: str | None = None) -> Rule:
        """Hold the next ``times`` matching requests ``seconds`` before serving them."""
        return self._add(Rule(check_verbs(verb), resource, times, delay=seconds))

    # --- standing (campaigns) --------------------------------------------------------

    def error_rate(self, verb: str | Sequence[str], rate: float, *, code: int = 500,
                   resource: str | None = None, namespace: str | None = None,
                   reason: str | None = None, message: str = "",
                   retry_after: int | None = None) -> Rule:
        """Fail each matching request with probability ``rate`` (seeded, reproducible)."""
        rule = self.fail_next(verb, times=None, code=code, resource=resource,
                              namespace=namespace, reason=reason, message=message,
                              retry_after=retry_after)
        rule.rate = check_rate(rate)
        return rule

    def latency(self, verb: str | Sequence[str], seconds: float, *, jitter: float = 0.0,
                resource: str | None = None) -> Rule:
        """Every matching request waits ``seconds`` plus a uniform share of ``jitter``."""
        if seconds < 0 or jitter < 0:
            raise ValueError("latency and jitter must not be negative")
        rule = self.delay_next(verb, seconds, times=None, resource=resource)
        rule.jitter = jitter
        return rule

    def conflict_storm(self, resource: str = "pods", *, namespace: str | None = None,
                       name: str | None = None, times: int | None = None,
                       seconds: float | None = None,
                       verbs: Sequence[str] = WRITES) -> Rule:
        """``409 Conflict`` on writes to ``name`` (or any object of ``resource``) for the
        next ``times`` writes and/or ``seconds`` of the clock, whichever ends first."""
        if times is None and seconds is None:
            raise ValueError("a conflict storm needs times= or seconds= (or both)")
        rule = self.fail_next(tuple(verbs), times=times, code=409, resource=resource,
                              namespace=namespace, name=name, reason="Conflict")
        if seconds is not None:
            rule.until = self.clock() + seconds
        return rule

    def forbid(self, verb: str | Sequence[str], resource: str, *,
               namespace: str | None = None, user: str | None = None) -> Rule:
        """Refuse ``verb`` on ``resource`` as a real cluster's RBAC would (403), naming
        ``user``; by default the sender when the request says who (a proxy to a real
        server), else the control plane's service account."""
        rule = self.fail_next(verb, times=None, code=403, resource=resource,
                              namespace=namespace, reason="Forbidden")
        rule.user = user
        return rule

    def drop_watch_rate(self, rate: float, *, abrupt: bool = False) -> None:
        """After each event a watch sends, end the stream with probability ``rate``
        (``abrupt``: cut the connection, losing what was in flight). 0 turns it off."""
        self.watch_drop = (check_rate(rate), abrupt)

    def remove(self, rule: Rule) -> None:
        if rule in self.rules:
            self.rules.remove(rule)

    def clear(self) -> None:
        """Remove every rule and the watch drop rate."""
        self.rules.clear()
        self.watch_drop = (0.0, False)

    # --- applied by the server ---------------------------------------------------------

    def take(self, request: Request) -> Hit:
        """What to do to ``request``: at most one delay and one error rule apply."""
        now = self.clock()
        delay: Rule | None = None
        error: Rule | None = None
        for rule in self.rules:
            if (rule.code and error is not None) or (not rule.code and delay is not None):
                continue
            if not rule.matches(request, now):
                continue
            if rule.rate < 1.0 and self.rng.random() >= rule.rate:
                continue
            if rule.remaining is not None:
                rule.remaining -= 1
            if rule.code:
                error = rule
            else:
                delay = rule
        self.rules = [r for r in self.rules if r.live(now)]
        seconds = 0.0
        if delay is not None:
            seconds = delay.delay + (self.rng.uniform(0.0, delay.jitter) if delay.jitter else 0.0)
            self.injected["delay"] += 1
        refusal = None if error is None else error.error(request)
        if refusal is not None:
            self.injected[f"error {refusal.code}"] += 1
        return Hit(seconds, refusal)

    def watch_interrupt(self) -> str | None:
        """After a watch event: ``"drop"``/``"cut"`` to end the stream, or ``None``."""
        rate, abrupt = self.watch_drop
        if rate <= 0.0 or self.rng.random() >= rate:
            return None
        self.injected["watch drop"] += 1
        return "cut" if abrupt else "drop"

    # --- watches and history -----------------------------------------------------------

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch stream; returns how many."""
        return self._watches.drop(abrupt=abrupt)

    def expire_watches(self) -> int:
        """Send ``ERROR 410 Expired`` on every open watch and end it; returns how many."""
        return self._watches.expire()

    def compact(self) -> int:
        """Forget the change history (resumes from older versions get 410)."""
        return self._history.compact()

    def send_bookmarks(self) -> int:
        """A ``BOOKMARK`` now on every watch that allows them (not a fault; a nudge).
        Returns how many: always 0 in front of a real server, which bookmarks when it
        chooses."""
        return self._watches.send_bookmarks()

    def _add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule


def check_verbs(verb: str | Sequence[str]) -> tuple[str, ...]:
    """``verb`` as a tuple of known verbs (or ``*``); ``ValueError`` otherwise."""
    verbs = (verb,) if isinstance(verb, str) else tuple(verb)
    for v in verbs:
        if v != "*" and v not in VERBS:
            raise ValueError(f"unknown verb {v!r}: one of {', '.join(VERBS)} or '*'")
    return verbs


def check_rate(rate: float) -> float:
    """``rate`` if it is a probability; ``ValueError`` otherwise."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"a rate is a probability in [0, 1], got {rate}")
    return rate
