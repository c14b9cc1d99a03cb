"""What a real API server refuses before storing: object metadata, unknown fields, options.

- :func:`metadata_errors`: ``metadata.name`` (an RFC 1123 subdomain of at most 253
  characters; a label of at most 63 for namespaces), label keys and values, annotation
  keys and the annotations' 256 KiB total, in apimachinery's words
  (``k8s.io/apimachinery/pkg/util/validation``), field by field, in its order.
- :func:`unknown_fields`: the fields ``fieldValidation=Strict`` refuses, found by walking
  the object through ``fields.json`` (every field of every type the served kinds hold,
  written from a real server's OpenAPI document by ``scripts/sim-fields``).
- :func:`check_options`: ``dryRun`` (only ``All``) and ``fieldValidation`` values.

Called by :mod:`drivers.sim.strategies` (metadata) and :mod:`drivers.sim.server`
(options, strict decoding). Pure.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from drivers.sim.objects import ApiError, Obj, Resource

MAX_NAME = 253
MAX_LABEL_VALUE = 63
MAX_ANNOTATIONS_BYTES = 256 * 1024

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_WORDS = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                   "characters, '-' or '.', and must start and end with an alphanumeric "
                   "character (e.g. 'example.com', regex used for validation is "
                   r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_WORDS = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
               "or '-', and must start and end with an alphanumeric character (e.g. 'my-name',"
               "  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
NAME_PART_WORDS = ("name part must consist of alphanumeric characters, '-', '_' or '.', and "
                   "must start and end with an alphanumeric character (e.g. 'MyName',  or "
                   "'my.name',  or '123-abc', regex used for validation is "
                   "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_VALUE_WORDS = ("a valid label must be an empty string or consist of alphanumeric "
                     "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                     "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
                     "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")

#: (field, message, cause reason), as a ``Status``'s ``details.causes`` carry them.
Cause = tuple[str, str, str]


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _invalid(field: str, value: str, why: str) -> Cause:
    return field, f"Invalid value: {_quoted(value)}: {why}", "FieldValueInvalid"


def name_errors(resource: Resource, name: str) -> list[Cause]:
    if resource.plural == "namespaces":
        limit, pattern, words = MAX_LABEL_VALUE, _LABEL, LABEL_WORDS
    else:
        limit, pattern, words = MAX_NAME, _SUBDOMAIN, SUBDOMAIN_WORDS
    out: list[Cause] = []
    if len(name) > limit:
        out.append(_invalid("metadata.name", name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        out.append(_invalid("metadata.name", name, words))
    return out


def _qualified_name_errors(field: str, key: str, *, any_case: bool = False) -> list[Cause]:
    """``any_case``: checked in lower case (annotation keys), still quoted as given."""
    prefix, _, part = (key.lower() if any_case else key).rpartition("/")
    out: list[Cause] = []
    if "/" in key and not prefix:
        out.append(_invalid(field, key, "prefix part must be non-empty"))
    elif prefix:
        if len(prefix) > MAX_NAME:
            out.append(_invalid(field, key, f"prefix part must be no more than {MAX_NAME} "
                                "characters"))
        if not _SUBDOMAIN.match(prefix):
            out.append(_invalid(field, key, f"prefix part {SUBDOMAIN_WORDS}"))
    if not part:
        out.append(_invalid(field, key, "name part must be non-empty"))
    elif len(part) > MAX_LABEL_VALUE:
        out.append(_invalid(field, key, f"name part must be no more than {MAX_LABEL_VALUE} "
                            "bytes"))
    if not _NAME_PART.match(part):
        out.append(_invalid(field, key, NAME_PART_WORDS))
    return out


def metadata_errors(resource: Resource, metadata: Obj, *, check_name: bool) -> list[Cause]:
    """Every refusal of ``metadata`` (whose maps are already known to hold strings)."""
    out = name_errors(resource, str(metadata.get("name") or "")) if check_name else []
    for key, value in (metadata.get("labels") or {}).items():
        out += _qualified_name_errors("metadata.labels", key)
        if len(value) > MAX_LABEL_VALUE:
            out.append(_invalid("metadata.labels", value,
                                f"must be no more than {MAX_LABEL_VALUE} bytes"))
        if not _LABEL_VALUE.match(value):
            out.append(_invalid("metadata.labels", value, LABEL_VALUE_WORDS))
    annotations = metadata.get("annotations") or {}
    for key in annotations:
        out += _qualified_name_errors("metadata.annotations", key, any_case=True)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        out.append(("metadata.annotations",
                    f"Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes",
                    "FieldValueTooLong"))
    return out


def invalid_object(resource: Resource, name: str, causes: list[Cause]) -> ApiError:
    """``422 Invalid`` listing ``causes``, worded as a real server joins them."""
    texts = [f"{field}: {message}" for field, message, _ in causes]
    joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    return ApiError(422, f'{resource.qualified_kind} "{name}" is invalid: {joined}',
                    details={**resource.details(name, resource.kind), "causes": [
                        {"reason": reason, "message": message, "field": field}
                        for field, message, reason in causes]})


# --- unknown fields (fieldValidation=Strict) ---------------------------------------------

@cache
def _fields() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = json.loads(
        (Path(__file__).with_name("fields.json")).read_text())
    return loaded


def unknown_fields(resource: Resource, obj: Obj) -> list[str]:
    """Paths of the fields of ``obj`` its kind does not have (``spec.containers[0].foo``)."""
    found: list[str] = []
    _walk(obj, resource.kind, "", found)
    return found


def _walk(value: Any, type_name: str, path: str, found: list[str]) -> None:
    if not type_name:
        return
    if type_name.startswith("[]"):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _walk(item, type_name[2:], f"{path}[{i}]", found)
        return
    if type_name.startswith("{}"):
        if isinstance(value, dict):
            for key, item in value.items():
                _walk(item, type_name[2:], f"{path}[{key}]", found)
        return
    fields = _fields().get(type_name)
    if fields is None or not isinstance(value, dict):
        return
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in fields:
            found.append(where)
        else:
            _walk(item, fields[key], where, found)


# --- options ------------------------------------------------------------------------------

FIELD_VALIDATION = ("", "Ignore", "Strict", "Warn")
OPTIONS_KIND = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions",
                "delete": "DeleteOptions", "deletecollection": "DeleteOptions"}


def check_options(verb: str, dry_run: list[str], field_validation: str | None) -> None:
    """Refuse ``dryRun`` values other than ``All`` and unknown ``fieldValidation`` values
    with the real ``422`` on the verb's options kind."""
    kind = OPTIONS_KIND.get(verb)
    if kind is None:
        return
    causes: list[tuple[str, str]] = []
    if any(value != "All" for value in dry_run):
        causes.append(("dryRun", f"Unsupported value: {json.dumps(dry_run)}: supported "
                                 'values: "All"'))
    if kind != "DeleteOptions" and field_validation is not None and (
            field_validation not in FIELD_VALIDATION):
        supported = ", ".join(f'"{v}"' for v in FIELD_VALIDATION)
        causes.append(("fieldValidation", f"Unsupported value: {_quoted(field_validation)}: "
                                          f"supported values: {supported}"))
    if causes:
        texts = [f"{field}: {message}" for field, message in causes]
        joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
        raise ApiError(422, f'{kind}.meta.k8s.io "" is invalid: {joined}', details={
            "group": "meta.k8s.io", "kind": kind, "causes": [
                {"reason": "FieldValueNotSupported", "message": message, "field": field}
                for field, message in causes]})
