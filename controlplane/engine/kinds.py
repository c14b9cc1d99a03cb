"""The registry of machine kinds the engine runs, looked up by name.

Built once at start-up by the runtime or CLI (``default_kinds()``) and passed down; the
store and worker stay generic over kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from controlplane.engine.decider import Decider


class UnknownKind(KeyError):
    """A machine kind nobody registered."""

    def __str__(self) -> str:
        return str(self.args[0])


class KindRegistry:
    """Kind name -> decider."""

    def __init__(self, deciders: Iterable[Decider[Any]] = ()) -> None:
        self._by_kind: dict[str, Decider[Any]] = {}
        for decider in deciders:
            self.register(decider)

    def register(self, decider: Decider[Any]) -> None:
        if decider.kind in self._by_kind:
            raise ValueError(f"machine kind {decider.kind!r} is registered twice")
        self._by_kind[decider.kind] = decider

    def get(self, kind: str) -> Decider[Any]:
        try:
            return self._by_kind[kind]
        except KeyError:
            known = ", ".join(sorted(self._by_kind)) or "none"
            raise UnknownKind(f"unknown operation kind {kind!r} (known kinds: {known})") from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._by_kind))
