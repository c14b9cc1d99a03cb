"""Checkpoint classes by name for the front door: a ``CheckpointClass`` resource first,
then the classes file the worker was given (``--classes-file``), so the file keeps
working beside the resources. Read per submission (one GET): an edited class applies to
the next operation, never to a running one (its spec embeds the class)."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.frontdoor.classes import class_from_resource
from controlplane.frontdoor.ports import ResourceApi


class ResourceClasses:
    """``requests.ClassSource`` over the API server and the classes file."""

    def __init__(self, api: ResourceApi, file_classes: Mapping[str, JsonObject]) -> None:
        self.api = api
        self.file_classes = dict(file_classes)

    async def class_named(self, name: str) -> JsonObject | None:
        found = await self.api.get("CheckpointClass", None, name)
        if found is not None:
            return class_from_resource(found)
        return self.file_classes.get(name)
