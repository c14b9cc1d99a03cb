"""The OpenAPI 3.1 document of the API, hand-written; served at ``/api/v1/openapi.json``.

A test checks that every route of ``make_app`` appears here, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any

from controlplane.api import summary_charts
from controlplane.store import reports

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json_response(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": schema or {"type": "object"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Malformed input; `parameter` names it", 401: "Missing or wrong token",
            404: "Unknown operation",
            409: "The machine refused the command, or the workload has a live operation",
            413: "Body too large",
            503: "The cluster or registry did not answer, or none is configured; retry"}
    return {str(c): _json_response(text[c], _ERROR) for c in codes}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}


_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
#: The reads a dashboard polls answer with an ``ETag``; ``If-None-Match`` with it: ``304``.
_IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False,
                  "description": "an ETag this route returned: 304 if the answer is unchanged",
                  "schema": {"type": "string"}}
_NOT_MODIFIED = {"304": {"description": "unchanged since the ETag in If-None-Match"}}
_ETAG = {"ETag": {"description": "a hash of the body; send it back in If-None-Match",
                  "schema": {"type": "string"}}}


def _revalidated(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {**_json_response(description, schema), "headers": _ETAG}
_PUBLIC: list[dict[str, Any]] = [{}]


def document() -> dict[str, Any]:
    op_ref = {"$ref": "#/components/schemas/Operation"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "controlplane API", "version": "1",
                 "description": "Checkpoint, restore and migrate pods. See docs/api.md."},
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {
                    "error": {"type": "string"}, "parameter": {"type": "string"}}},
                "Operation": {"type": "object", "properties": {
                    "id": {"type": "string"}, "kind": {"type": "string"},
                    "phase": {"type": "string"}, "terminal": {"type": "boolean"},
                    "version": {"type": "integer"}, "workload": {"type": ["string", "null"]},
                    "node": {"type": ["string", "null"],
                             "description": "where it ran or landed"},
                    "source_node": {"type": ["string", "null"]},
                    "target_node": {"type": ["string", "null"]},
                    "pod": {"type": ["string", "null"],
                            "description": "the pod it left running"},
                    "held": {"type": "boolean"},
                    "attempts": {"type": "integer"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "updated_at": {"type": "string", "format": "date-time"},
                    "parent": {"type": ["string", "null"],
                               "description": "the drain that started this migration"},
                    "waiting_for": {"type": ["string", "null"],
                                    "description": "what it waits for now, as cpctl --wait "
                                    "says it; null once settled"},
                    "drain": {"$ref": "#/components/schemas/DrainSummary"}}},
                "DrainSummary": {
                    "type": "object", "description": "drains only: node and children counts",
                    "properties": {"node": {"type": "string"}, **{
                        n: {"type": "integer"} for n in ("children", "succeeded", "failed",
                                                         "running", "pending", "skipped")}}},
                "DrainChild": {"type": "object", "properties": {
                    "id": {"type": "string"}, "pod": {"type": "string"},
                    "target": {"type": "string"},
                    "status": {"type": "string", "enum": ["Pending", "Started", "Finished",
                                                          "Refused", "Skipped"]},
                    "phase": {"type": ["string", "null"],
                              "description": "the child migration's phase (its outcome once "
                                             "Finished); null if it has no machine"},
                    "reason": {"type": ["string", "null"]},
                    "started_at": {"type": ["string", "null"], "format": "date-time"},
                    "finished_at": {"type": ["string", "null"], "format": "date-time"}}},
                "Event": {"type": "object", "properties": {
                    "seq": {"type": "integer"}, "type": {"type": "string"},
                    "recorded_at": {"type": "string", "format": "date-time"},
                    "phase": {"type": ["string", "null"],
                              "description": "the machine's phase after this event"},
                    "data": {"type": "object"}, "facts": {"type": "object"},
                    "worker_id": {"type": "string"}}},
            },
        },
        "paths": {
            "/": {"get": {"summary": "The dashboard (HTML; reads ?token=, then keeps its "
                                     "view in the fragment: #/op/<id>?kind=...)",
                          "security": _PUBLIC, "responses": {"200": {
                              "description": "HTML page",
                              "content": {"text/html": {"schema": {"type": "string"}}}}}}},
            "/summary": {"get": {"summary": "The summary page: the reports as charts (HTML; "
                                            "reads ?token= as the dashboard does)",
                                 "security": _PUBLIC, "responses": {"200": {
                                     "description": "HTML page",
                                     "content": {"text/html": {"schema": {"type": "string"}}}}}}},
            "/api/v1/charts/{name}.svg": {"get": {
                "summary": "One chart of the summary page, server-rendered SVG",
                "parameters": [
                    {"name": "name", "in": "path", "required": True,
                     "schema": {"type": "string", "enum": list(summary_charts.NAMES)}},
                    _query("drain", "the drain whose per-node load to draw",
                           {"type": "string"})],
                "responses": {"200": {"description": "SVG image", "content": {
                    "image/svg+xml": {"schema": {"type": "string"}}}},
                              **_errors(401, 404)}}},
            "/login": {"get": {
                "summary": "The one-time sign-in link cpctl serve prints: sets the session "
                           "cookie that opens the reads to a browser, then to the dashboard",
                "security": _PUBLIC,
                "parameters": [{"name": "code", "in": "query", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"303": {"description": "to / (signed in), or to "
                                                     "/?signin=expired (a spent link)"}}}},
            "/healthz": {"get": {"summary": "Liveness", "security": _PUBLIC,
                                 "responses": {"200": _json_response("ok")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4)",
                                 "responses": {"200": {"description": "exposition", "content": {
                                     "text/plain": {"schema": {"type": "string"}}}},
                                     **_errors(401)}}},
            "/api/v1/openapi.json": {"get": {"summary": "This document", "security": _PUBLIC,
                                             "responses": {"200": _json_response("OpenAPI")}}},
            "/api/v1/operations": {"get": {
                "summary": "List operations, newest first",
                "parameters": [
                    _query("kind", "a registered kind", {"type": "string"}),
                    _query("phase", "a phase name", {"type": "string"}),
                    _query("node", "moving load off this node or onto it",
                           {"type": "string"}),
                    _query("namespace", "of the workload", {"type": "string"}),
                    _query("active", "true: not terminal; false: terminal",
                           {"type": "boolean"}),
                    _query("since", "submitted at or after (ISO 8601)",
                           {"type": "string", "format": "date-time"}),
                    _query("limit", "at most this many (default 100)",
                           {"type": "integer", "minimum": 1, "maximum": 1000}),
                    _query("offset", "skip this many first (paging; default 0)",
                           {"type": "integer", "minimum": 0, "maximum": 1000000}),
                    _query("sort", "order of every page: created_at, kind, phase, workload, "
                           "node or id, '-' first for descending (default -created_at)",
                           {"type": "string", "pattern":
                            "^-?(created_at|kind|phase|workload|node|id)$"}),
                    _IF_NONE_MATCH],
                "responses": {"200": _revalidated("a page of operations", {
                    "type": "object", "properties": {
                        "operations": {"type": "array", "items": op_ref},
                        "limit": {"type": "integer"}, "offset": {"type": "integer"},
                        "sort": {"type": "string"},
                        "total": {"type": "integer",
                                  "description": "how many the filter selects in all"}}}),
                              **_NOT_MODIFIED, **_errors(400, 401)}},
                "post": {
                "summary": "Submit an operation as the CLI's verbs do (dry_run: only the plan)",
                "description": "checkpoint, migration, suspend and resume name a workload "
                               "(namespace/pod) and a class ({\"repository\": ...} at "
                               "least); a migration its target_node; a resume may name its "
                               "node; a restore names the checkpoint operation and the node; "
                               "a drain names the node and a class (max_parallel, targets, "
                               "selector as cpctl drain). Fields are snake_case as every "
                               "output; the custom resources' camelCase (targetNode...) "
                               "is accepted too.",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": False,
                               "required": ["kind"], "properties": {
                                   "kind": {"type": "string", "enum": [
                                       "checkpoint", "migration", "suspend", "resume",
                                       "restore", "drain"]},
                                   "workload": {"type": "string"},
                                   "class": {"type": "object"},
                                   "target_node": {"type": "string"},
                                   "node": {"type": "string"},
                                   "checkpoint": {"type": "string"},
                                   "name": {"type": "string"},
                                   "quiesce": {"type": "boolean"},
                                   "keep_checkpoint": {"type": "boolean"},
                                   "mode": {"type": "string",
                                            "enum": ["stop-and-copy", "precopy", "lazy"]},
                                   "dry_run": {"type": "boolean"},
                                   "max_parallel": {"type": "integer", "minimum": 1},
                                   "targets": {"type": "array", "items": {"type": "string"}},
                                   "selector": {"type": "string"}}}}}},
                "responses": {
                    "201": _json_response("created (queued: why it waits)", {
                        "type": "object", "properties": {
                            "id": {"type": "string"}, "kind": {"type": "string"},
                            "queued": {"type": ["string", "null"]},
                            "location": {"type": "string"}}}),
                    "200": _json_response("dry_run: the plan; refused says why it would "
                                          "not be accepted"),
                    **_errors(400, 401, 409, 413, 503)}}},
            "/api/v1/operations/{id}": {"get": {
                "summary": "One operation, with spec and state (a drain: and its children)",
                "parameters": [_ID, _IF_NONE_MATCH],
                "responses": {"200": _revalidated("operation", {"allOf": [op_ref, {
                    "type": "object", "properties": {
                        "spec": {"type": "object"}, "state": {"type": "object"},
                        "children": {"type": "array", "description": "drains only",
                                     "items": {"$ref": "#/components/schemas/DrainChild"}}}}]}),
                              **_NOT_MODIFIED, **_errors(401, 404)}}},
            "/api/v1/operations/{id}/events": {"get": {
                "summary": "The operation's event history, in order",
                "parameters": [_ID, _IF_NONE_MATCH],
                "responses": {"200": _revalidated("history", {
                    "type": "object", "properties": {
                        "operation": op_ref, "events": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Event"}}}}),
                    **_NOT_MODIFIED, **_errors(401, 404)}}},
            "/api/v1/operations/{id}/cancel": {"post": {
                "summary": "Ask the operation to cancel", "parameters": [_ID],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": False}}}},
                "responses": {"202": _json_response("accepted (or already cancelling)"),
                              **_errors(400, 401, 404, 409, 413)}}},
            "/api/v1/operations/{id}/retarget": {"post": {
                "summary": "Move a running migration to another target node",
                "parameters": [_ID],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": False,
                               "required": ["node"],
                               "properties": {"node": {"type": "string"}}}}}},
                "responses": {"202": _json_response("accepted"),
                              **_errors(400, 401, 404, 409, 413)}}},
            "/api/v1/reports/{report}": {"get": {
                "summary": "Operations, checkpoints or migrations grouped by kind, node, "
                           "day or checkpoint class; or drains, one row each",
                "parameters": [
                    {"name": "report", "in": "path", "required": True,
                     "schema": {"type": "string", "enum": list(reports.NAMES)}},
                    _query("by", "grouping (default kind)",
                           {"type": "string", "enum": list(reports.GROUPINGS)}),
                    _query("since", "only rows at or after (ISO 8601)",
                           {"type": "string", "format": "date-time"})],
                "responses": {"200": _json_response("report rows"),
                              **_errors(400, 401, 404)}}},
        },
    }
