"""Label and field selectors, parsed like the API server parses ``?labelSelector=``.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``,
``!k``, joined by commas (AND). Field selectors: ``field=v``, ``field==v``, ``field!=v``
over ``metadata.name``, ``metadata.namespace``, ``spec.nodeName``, ``status.phase``,
``spec.unschedulable`` and, for events, ``involvedObject.*``, ``reason``, ``type``. An
unknown field or malformed selector raises :class:`SelectorError` (a 400).

Called by the simulator's store (LIST) and watch filters. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_LABEL_SET = re.compile(r"^\s*(?P<key>[^\s!=,()]+)\s+(?P<op>in|notin)\s+\((?P<vals>[^)]*)\)\s*")
_LABEL_CMP = re.compile(r"^\s*(?P<key>[^\s!=,()]+)\s*(?P<op>==|=|!=)\s*(?P<val>[^\s,()]*)\s*")
_LABEL_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=,()]+)\s*")

FIELDS: dict[str, tuple[str, ...]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.unschedulable": ("spec", "unschedulable"),
    "status.phase": ("status", "phase"),
    "involvedObject.kind": ("involvedObject", "kind"),
    "involvedObject.name": ("involvedObject", "name"),
    "involvedObject.namespace": ("involvedObject", "namespace"),
    "involvedObject.uid": ("involvedObject", "uid"),
    "reason": ("reason",),
    "type": ("type",),
}


class SelectorError(ValueError):
    """A selector the server cannot parse (answered with 400 BadRequest)."""


Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Selector:
    """A parsed label + field selector; ``matches(obj)`` over a Kubernetes object."""

    label_terms: tuple[Predicate, ...] = ()
    field_terms: tuple[Predicate, ...] = ()
    #: The node an equality term ``spec.nodeName=X`` requires (a node agent's watch),
    #: so the watch fan-out offers such a watch only the changes of pods on its node.
    node_name: str | None = None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in self.label_terms) and all(t(obj) for t in self.field_terms)


EVERYTHING = Selector()


def parse(label_selector: str | None, field_selector: str | None) -> Selector:
    return Selector(parse_labels(label_selector or ""), parse_fields(field_selector or ""),
                    required_node(field_selector or ""))


def required_node(text: str) -> str | None:
    """X when the field selector has an equality term ``spec.nodeName=X`` (else None).

    ``spec.nodeName=`` (the unscheduled pods, a scheduler's selector) names no node:
    None, so such a watch is offered every pod change, not only those of some node."""
    for raw in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"spec\.nodeName\s*(==|=)\s*(?P<val>.*)", raw)
        if match:
            return match["val"] or None
    return None


def parse_labels(text: str) -> tuple[Predicate, ...]:
    terms: list[Predicate] = []
    rest = text.strip()
    while rest:
        match = _LABEL_SET.match(rest)
        if match:
            key, op = match["key"], match["op"]
            values = frozenset(v.strip() for v in match["vals"].split(",") if v.strip())
            terms.append(_set_term(key, values, negate=op == "notin"))
        else:
            match = _LABEL_CMP.match(rest)
            if match:
                terms.append(_cmp_term(match["key"], match["val"], negate=match["op"] == "!="))
            else:
                match = _LABEL_EXISTS.match(rest)
                if not match:
                    raise SelectorError(f"unable to parse label selector {text!r}")
                terms.append(_exists_term(match["key"], negate=bool(match["neg"])))
        rest = rest[match.end():]
        if rest.startswith(","):
            rest = rest[1:].strip()
        elif rest:
            raise SelectorError(f"unable to parse label selector {text!r} at {rest!r}")
    return tuple(terms)


def _set_term(key: str, values: frozenset[str], *, negate: bool) -> Predicate:
    if negate:
        return lambda labels: labels.get(key) not in values
    return lambda labels: labels.get(key) in values


def _cmp_term(key: str, value: str, *, negate: bool) -> Predicate:
    if negate:
        return lambda labels: labels.get(key) != value
    return lambda labels: labels.get(key) == value


def _exists_term(key: str, *, negate: bool) -> Predicate:
    if negate:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def field_value(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    """A field as the API server compares it: text; a missing field is ``""``."""
    node: Any = obj
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None:
        return "false" if path == ("spec", "unschedulable") else ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_fields(text: str) -> tuple[Predicate, ...]:
    terms: list[Predicate] = []
    for raw in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(?P<field>[^!=]+?)\s*(?P<op>==|=|!=)\s*(?P<val>.*)", raw)
        if not match:
            raise SelectorError(f"invalid field selector {raw!r}")
        name = match["field"]
        path = FIELDS.get(name)
        if path is None:
            raise SelectorError(f'field label not supported: "{name}"')
        terms.append(_field_term(path, match["val"], negate=match["op"] == "!="))
    return tuple(terms)


def _field_term(path: tuple[str, ...], value: str, *, negate: bool) -> Predicate:
    if negate:
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value


def label_selector_matches(selector: Mapping[str, Any] | None,
                           labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` (``matchLabels`` + ``matchExpressions``) over ``labels``,
    as ``LabelSelectorAsSelector`` reads it: ``None`` matches nothing, ``{}`` everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for term in selector.get("matchExpressions") or []:
        key, op = term.get("key"), term.get("operator")
        values = term.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True
