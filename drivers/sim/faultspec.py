"""``--fault`` flags of ``cpctl sim up``: one standing fault per flag.

A spec is a kind, then ``key=value`` pairs, comma-separated; several verbs join with
``+``::

    error,verb=patch+delete,rate=0.1,code=503      Faults.error_rate
    latency,verb=*,seconds=0.05,jitter=0.02         Faults.latency
    drop-watches,rate=0.01,abrupt=true              Faults.drop_watch_rate
    conflicts,resource=pods,name=app,seconds=30     Faults.conflict_storm (times= too)
    forbid,verb=delete,resource=pods                Faults.forbid (namespace= too)

:func:`parse` checks a spec completely (a ``ValueError`` names the bad part) and returns
a :class:`FaultSpec`; :meth:`FaultSpec.install` applies it to a cluster's ``Faults``.
Pure apart from ``install``. Called by :mod:`controlplane.wiring.sim` and tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from drivers.sim.faults import Faults, check_rate, check_verbs

KINDS: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {  # kind -> (required, optional)
    "error": (frozenset({"rate"}),
              frozenset({"verb", "code", "resource", "namespace", "retry_after"})),
    "latency": (frozenset({"seconds"}), frozenset({"verb", "jitter", "resource"})),
    "drop-watches": (frozenset({"rate"}), frozenset({"abrupt"})),
    "conflicts": (frozenset(), frozenset({"resource", "namespace", "name", "times",
                                          "seconds"})),
    "forbid": (frozenset({"verb", "resource"}), frozenset({"namespace"})),
}


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("not true or false")
    return text.lower() in ("true", "1", "yes")


def _rate(text: str) -> float:
    return check_rate(float(text))


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("negative")
    return value


CONVERT: Mapping[str, Callable[[str], Any]] = {
    "verb": lambda text: check_verbs(tuple(text.split("+"))), "rate": _rate, "code": int,
    "resource": str, "namespace": str, "name": str, "retry_after": int, "seconds": _seconds,
    "jitter": _seconds, "times": int, "abrupt": _bool,
}


@dataclass(frozen=True)
class FaultSpec:
    """One parsed ``--fault``: its kind and its checked options."""

    kind: str
    verb: tuple[str, ...] = ("*",)
    rate: float = 0.0
    code: int = 500
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    retry_after: int | None = None
    seconds: float | None = None
    jitter: float = 0.0
    times: int | None = None
    abrupt: bool = False

    def install(self, faults: Faults) -> None:
        if self.kind == "error":
            faults.error_rate(self.verb, self.rate, code=self.code, resource=self.resource,
                              namespace=self.namespace, retry_after=self.retry_after)
        elif self.kind == "latency":
            faults.latency(self.verb, self.seconds or 0.0, jitter=self.jitter,
                           resource=self.resource)
        elif self.kind == "drop-watches":
            faults.drop_watch_rate(self.rate, abrupt=self.abrupt)
        elif self.kind == "conflicts":
            faults.conflict_storm(self.resource or "pods", namespace=self.namespace,
                                  name=self.name, times=self.times, seconds=self.seconds)
        else:
            faults.forbid(self.verb, str(self.resource), namespace=self.namespace)


def parse(text: str) -> FaultSpec:
    """``kind,key=value,...`` -> :class:`FaultSpec`; a ``ValueError`` says what is wrong."""
    kind, *pairs = [p.strip() for p in text.split(",")]
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r} in {text!r}: one of {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not raw:
            raise ValueError(f"{pair!r} in {text!r} is not key=value")
        if key not in required | optional:
            raise ValueError(f"{kind} faults take {', '.join(sorted(required | optional))}, "
                             f"not {key!r}")
        try:
            values[key] = CONVERT[key](raw)
        except ValueError as exc:
            raise ValueError(f"{key}={raw!r} in {text!r}: {exc}") from None
    missing = required - values.keys()
    if missing:
        raise ValueError(f"{kind} faults need {', '.join(sorted(missing))} (in {text!r})")
    if kind == "conflicts" and "times" not in values and "seconds" not in values:
        raise ValueError(f"conflicts faults need times= or seconds= (in {text!r})")
    return FaultSpec(kind, **values)
