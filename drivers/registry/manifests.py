"""Reading manifests: annotations and the blobs they reference. Pure.

A manifest is JSON bytes; its digest is the sha256 of exactly those bytes, so it is never
re-serialised once stored. :func:`manifest_annotations` reads the top-level
``annotations`` (an image manifest's or an index's); :func:`referenced_digests` lists the
blobs a manifest keeps alive (config, layers, the manifests of an index), which is what
the on-disk layout's garbage collection spares. Used by both registry backends and the
checkpoint artifact codec.
"""

from __future__ import annotations

import json
from typing import Any

from drivers.registry.errors import RegistryBadResponse


def parse_manifest(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise RegistryBadResponse(f"the manifest is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise RegistryBadResponse("the manifest is not a JSON object")
    return parsed


def manifest_annotations(body: bytes) -> dict[str, str]:
    annotations = parse_manifest(body).get("annotations") or {}
    if not isinstance(annotations, dict):
        raise RegistryBadResponse("the manifest's annotations are not an object")
    return {str(k): str(v) for k, v in annotations.items()}


def referenced_digests(body: bytes) -> set[str]:
    parsed = parse_manifest(body)
    found: set[str] = set()
    config = parsed.get("config")
    if isinstance(config, dict) and isinstance(config.get("digest"), str):
        found.add(config["digest"])
    for key in ("layers", "manifests", "blobs"):
        for item in parsed.get(key) or []:
            if isinstance(item, dict) and isinstance(item.get("digest"), str):
                found.add(item["digest"])
    subject = parsed.get("subject")
    if isinstance(subject, dict) and isinstance(subject.get("digest"), str):
        found.add(subject["digest"])
    return found
