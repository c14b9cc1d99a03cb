"""Parsing and validating API inputs: query parameters and JSON command bodies.

Pure functions called by :mod:`controlplane.api.app`. Each raises :class:`BadRequest`
naming the offending parameter, so a malformed request never reaches the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from controlplane.clock import instant
from controlplane.engine.kinds import KindRegistry
from controlplane.store import reports
from controlplane.store.queries import NAMESPACE_NAME, ORDERS, PHASE_NAME, MachineFilter

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
#: Phases are StrEnum names (``CollectingGarbage``); anything else cannot match a row.
_PHASE = PHASE_NAME
#: A Kubernetes node name (RFC 1123 subdomain), the decider re-checks it.
_NODE_MAX = 253
LIST_PARAMS = frozenset({"kind", "phase", "active", "since", "limit", "offset", "sort",
                         "node", "namespace"})
#: How deep ``offset`` may page.
MAX_OFFSET = 1_000_000
REPORTS = reports.NAMES
REPORT_BY = reports.GROUPINGS


_NAMESPACE = NAMESPACE_NAME


class BadRequest(Exception):
    """A request input is malformed; ``parameter`` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


def machine_filter(query: Mapping[str, str], kinds: KindRegistry) -> MachineFilter:
    """``GET /api/v1/operations`` query -> :class:`MachineFilter`."""
    unknown = sorted(set(query) - LIST_PARAMS)
    if unknown:
        raise BadRequest(unknown[0], f"unknown query parameter {unknown[0]!r} "
                                     f"(known: {', '.join(sorted(LIST_PARAMS))})")
    kind = query.get("kind")
    if kind is not None and kind not in kinds:
        raise BadRequest("kind", f"unknown kind {kind!r} (known: {', '.join(kinds)})")
    phase = query.get("phase")
    if phase is not None and not _PHASE.fullmatch(phase):
        raise BadRequest("phase", "phase must be a phase name such as 'Succeeded'")
    terminal: bool | None = None
    if "active" in query:
        active = query["active"].lower()
        if active not in ("true", "false"):
            raise BadRequest("active", "active must be 'true' or 'false'")
        terminal = active == "false"
    node = query.get("node")
    namespace = query.get("namespace")
    if namespace is not None and not _NAMESPACE.fullmatch(namespace):
        raise BadRequest("namespace", "namespace must be a DNS label such as 'default'")
    return MachineFilter(kind=kind, phase=phase, terminal=terminal,
                         since=since(query.get("since")),
                         node=None if node is None else node_name(node), namespace=namespace,
                         limit=limit(query.get("limit")), offset=offset(query.get("offset")),
                         order=order(query.get("sort")))


def offset(raw: str | None) -> int:
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_OFFSET:
        raise BadRequest("offset", f"offset must be an integer between 0 and {MAX_OFFSET}")
    return int(raw)


def order(raw: str | None) -> str:
    """``sort``: a column of :data:`queries.ORDERS`, ``-`` first for descending."""
    if raw is None:
        return "-created_at"
    if raw.removeprefix("-") not in ORDERS:
        raise BadRequest("sort", f"sort must be one of {', '.join(ORDERS)}, '-' first for "
                                 "descending (e.g. -created_at)")
    return raw


def since(raw: str | None) -> datetime | None:
    """An ISO 8601 timestamp; a naive one is taken as UTC."""
    if raw is None:
        return None
    try:
        return instant(raw)
    except ValueError:
        raise BadRequest("since", "since must be an ISO 8601 timestamp, "
                                  "e.g. 2026-01-01T00:00:00Z") from None


def limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit():
        raise BadRequest("limit", f"limit must be an integer between 1 and {MAX_LIMIT}")
    value = int(raw)
    if not 1 <= value <= MAX_LIMIT:
        raise BadRequest("limit", f"limit must be an integer between 1 and {MAX_LIMIT}")
    return value


def report_by(query: Mapping[str, str]) -> str:
    unknown = sorted(set(query) - {"by", "since"})
    if unknown:
        raise BadRequest(unknown[0], f"unknown query parameter {unknown[0]!r}")
    by = query.get("by", "kind")
    if by not in REPORT_BY:
        raise BadRequest("by", f"by must be one of {', '.join(REPORT_BY)}")
    return by


def json_fields(body: bytes) -> dict[str, Any]:
    """A JSON object body, any fields (the reader checks them)."""
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body", "the body must be a JSON object")
    return data


def json_object(body: bytes, *, allowed: Mapping[str, type], required: frozenset[str]
                ) -> dict[str, Any]:
    """A JSON object body with only ``allowed`` fields of the given types."""
    data = json_fields(body)
    for key, value in data.items():
        if key not in allowed:
            raise BadRequest(key, f"unknown field {key!r} "
                                  f"(allowed: {', '.join(sorted(allowed)) or 'none'})")
        if not isinstance(value, allowed[key]):
            raise BadRequest(key, f"{key} must be a {allowed[key].__name__}")
    for key in sorted(required - set(data)):
        raise BadRequest(key, f"missing field {key!r}")
    return data


def node_name(value: str) -> str:
    if not value or len(value) > _NODE_MAX:
        raise BadRequest("node", f"node must be a non-empty string of at most {_NODE_MAX} "
                                 "characters")
    return value
