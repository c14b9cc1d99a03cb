"""What every machine state derives the same way from its ``status``.

A state is a frozen dataclass with a ``status`` (its phase enum) and a class-level
``TERMINAL_PHASES``; ``phase``, ``terminal`` and (for the product kinds) ``to_json``
follow from those. ``CapturingState`` adds what the kinds that capture a running source
pod share (checkpoint, suspend): they wake on the source's UID and name it as a
``SourcePod``. Used by the machine modules only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base.codec import encode_object
from controlplane.machines.stages.source import SourcePod


class PhasedState:
    TERMINAL_PHASES: ClassVar[frozenset[Any]]
    status: StrEnum

    @property
    def phase(self) -> str:
        return self.status.value

    @property
    def terminal(self) -> bool:
        return self.status in self.TERMINAL_PHASES

    def to_json(self) -> JsonObject:
        return encode_object(self)


class CapturingState(PhasedState):
    spec: Any  # a CaptureSpec: namespace, name, uid, checkpoint_id

    @property
    def wake_keys(self) -> frozenset[str]:
        return frozenset() if self.terminal else frozenset({self.spec.uid})

    @property
    def source(self) -> SourcePod:
        s = self.spec
        return SourcePod(s.namespace, s.name, s.uid, s.checkpoint_id)
