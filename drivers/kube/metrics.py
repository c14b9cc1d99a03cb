"""API request accounting: how many requests by verb (and resource, and failure).

Benchmarks report "API requests per migration by verb": take :meth:`RequestCounter.
snapshot` before, :meth:`RequestCounter.since` after. A request is counted once when it
is sent (retries are new requests), failures once more under ``errors`` by verb and
status (``"patch 409"``, ``"get timeout"``). After :meth:`RequestCounter.time_requests`,
every non-watch request's client-side duration is kept by verb too (off by default: a
long-running worker would keep one float per request forever).

Called by :class:`~drivers.kube.client.KubeClient`; read by benchmarks and tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


class RequestCounter:
    """Counts of API requests sent, by verb and by (verb, resource), and of failures."""

    def __init__(self) -> None:
        self.by_verb: Counter[str] = Counter()
        self.by_resource: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[str] = Counter()
        #: Seconds each request took, by verb, once :meth:`time_requests` was called.
        self.durations: dict[str, list[float]] | None = None

    def time_requests(self) -> None:
        """From now on keep every request's duration by verb (for benchmarks)."""
        if self.durations is None:
            self.durations = {}

    @property
    def timing(self) -> bool:
        return self.durations is not None

    def took(self, verb: str, seconds: float) -> None:
        """One request's duration, sent to answer (kept only while timing)."""
        if self.durations is not None:
            self.durations.setdefault(verb, []).append(seconds)

    def sent(self, verb: str, resource: str) -> None:
        self.by_verb[verb] += 1
        self.by_resource[(verb, resource)] += 1

    def failed(self, verb: str, status: int | str) -> None:
        self.errors[f"{verb} {status}"] += 1

    @property
    def total(self) -> int:
        return sum(self.by_verb.values())

    def snapshot(self) -> dict[str, int]:
        """Requests so far by verb (every verb listed, zeros included)."""
        return {verb: self.by_verb.get(verb, 0) for verb in (*VERBS, *sorted(
            set(self.by_verb) - set(VERBS)))}

    def since(self, before: Mapping[str, int]) -> dict[str, int]:
        """Requests by verb since ``before`` (a :meth:`snapshot`), zeros left out."""
        now = self.snapshot()
        return {verb: n - before.get(verb, 0) for verb, n in now.items()
                if n - before.get(verb, 0)}
