"""Custom resources in the simulator: what a ``CustomResourceDefinition`` makes it serve.

Creating a CRD (``kubectl apply -f deploy/base/crds/``, or ``cpctl sim up --crds DIR``)
serves its kind at once, as a real server does once the CRD is ``Established``:

- :func:`resources`: the CRD's served versions as :class:`~drivers.sim.objects.Resource`
  (plural, kind, scope, the status subresource, short names, categories, printer
  columns); :func:`accepted_status`: the ``NamesAccepted`` and ``Established`` conditions
  and ``acceptedNames`` the server writes;
- :func:`prepare_create`, :func:`prepare_update`: a custom object's ``generation`` (1,
  then one more at each change of anything but ``metadata`` and ``status``), its
  ``status`` dropped on create when the status subresource is on;
- :func:`cells`: a row of ``kubectl get``'s table from the ``additionalPrinterColumns``
  (simple ``jsonPath``\\ s: ``.spec.podName``, ``.status.conditions[0].reason``);
- :func:`openapi_root`, :func:`openapi_group`: the OpenAPI v3 discovery kubectl reads
  before ``apply``: one document per group version whose PATCH operations take
  ``fieldValidation`` (so kubectl validates on the server, which checks nothing of a
  custom object's schema here) and no strategic merge patch (so kubectl sends a JSON
  merge patch to a custom resource, as against a real server).

Called by :mod:`drivers.sim.store` and :mod:`drivers.sim.server`. Pure.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from drivers.sim.objects import ApiError, Obj, Resource, meta, timestamp

_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")


def resources(crd: Obj) -> list[Resource]:
    """The resources a CRD serves, one per served version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        columns = tuple(
            (str(c.get("name", "")), str(c.get("type", "string")), str(c.get("format", "")),
             int(c.get("priority", 0)), str(c.get("jsonPath", "")),
             str(c.get("description", "")))
            for c in version.get("additionalPrinterColumns") or []) or (AGE,)
        out.append(Resource(
            str(names.get("plural", "")), str(names.get("kind", "")),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            has_status="status" in (version.get("subresources") or {}),
            group=str(spec.get("group", "")), version=str(version.get("name", "")),
            custom=True, short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()), columns=columns))
    return out


def check_crd(crd: Obj) -> None:
    """What a real server would refuse outright in a CRD (422), briefly."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    if not spec.get("group") or not names.get("plural") or not names.get("kind"):
        raise ApiError(422, "CustomResourceDefinition is invalid: spec.group, "
                       "spec.names.plural and spec.names.kind are required")
    if meta(crd).get("name") != f"{names['plural']}.{spec['group']}":
        raise ApiError(422, f'CustomResourceDefinition.apiextensions.k8s.io '
                       f'"{meta(crd).get("name")}" is invalid: metadata.name: Invalid value: '
                       f'must be spec.names.plural+"."+spec.group')


def accepted_status(crd: Obj) -> Obj:
    """The status a real server writes on a CRD it serves."""
    now = timestamp()
    names = dict((crd.get("spec") or {}).get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    return {"acceptedNames": names, "storedVersions": [
                v.get("name") for v in (crd.get("spec") or {}).get("versions") or []
                if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted",
                 "lastTransitionTime": now}]}


def prepare_create(resource: Resource, obj: Obj) -> None:
    meta(obj)["generation"] = 1
    if resource.has_status:
        obj.pop("status", None)


def prepare_update(old: Obj, out: Obj) -> None:
    """Bump ``generation`` when anything but ``metadata`` and ``status`` changed."""
    def body(obj: Obj) -> Obj:
        return {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    generation = meta(old).get("generation")
    generation = generation if isinstance(generation, int) else 1
    meta(out)["generation"] = generation + 1 if body(out) != body(old) else generation


def lookup(obj: Any, path: str) -> Any:
    """A simple JSONPath (``.a.b[0].c``) into ``obj``; ``None`` where it leads nowhere."""
    for field, index in _STEP.findall(path.strip().lstrip("$")):
        if field:
            obj = obj.get(field) if isinstance(obj, dict) else None
        else:
            obj = obj[int(index)] if isinstance(obj, list) and int(index) < len(obj) else None
        if obj is None:
            return None
    return obj


def cells(resource: Resource, obj: Obj, age: Callable[[object], str]) -> list[Any]:
    """``kubectl get``'s cells for a custom object, as the real server's table convertor
    makes them: its name, then each printer column (``string`` as its JSONPath prints,
    ``date`` as an age, ``integer``/``number``/``boolean`` as values; absent: null)."""
    out: list[Any] = [meta(obj).get("name")]
    for _, type_, _, _, path, _ in resource.columns:
        value = lookup(obj, path)
        if value is None:
            out.append(None)
        elif type_ == "string":
            out.append(value if isinstance(value, str) else
                       str(value).lower() if isinstance(value, bool) else json.dumps(value))
        elif type_ == "date":
            out.append(age(value) if isinstance(value, str) else None)
        elif type_ == "integer":
            out.append(int(value) if isinstance(value, int | float) and
                       not isinstance(value, bool) else None)
        elif type_ == "number":
            out.append(value if isinstance(value, int | float) and
                       not isinstance(value, bool) else None)
        else:
            out.append(value if isinstance(value, bool) else None)
    return out


#: The column a CRD without printer columns gets.
AGE = ("Age", "date", "", 0, ".metadata.creationTimestamp", "")


def column_definitions(resource: Resource) -> list[Obj]:
    definitions = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                    "description": "Name must be unique within a namespace."}]
    definitions += [{"name": name, "type": type_, "format": fmt, "priority": priority,
                     "description": description}
                    for name, type_, fmt, priority, _, description in resource.columns]
    return definitions


# --- OpenAPI v3 discovery (what kubectl apply reads) -----------------------------------

def _path_for(resource: Resource) -> str:
    prefix = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
    where = "/namespaces/{namespace}" if resource.namespaced else ""
    return f"{prefix}{where}/{resource.plural}/{{name}}"


def _gv_path(group_version: str) -> str:
    return f"api/{group_version}" if "/" not in group_version else f"apis/{group_version}"


def openapi_group(served: Iterable[Resource]) -> Obj:
    """The OpenAPI v3 document of one group version: for each kind, its object path with
    a PATCH taking ``fieldValidation`` and the patch types the simulator takes (strategic
    merge only for the built-in kinds, as a real server)."""
    paths: Obj = {}
    for r in served:
        patch_types = ["application/json-patch+json", "application/merge-patch+json"]
        if not r.custom:
            patch_types.append("application/strategic-merge-patch+json")
        gvk = [{"group": r.group, "version": r.version, "kind": r.kind}]
        operation = {
            "x-kubernetes-group-version-kind": gvk[0],
            "parameters": [{"name": n, "in": "query", "schema": {"type": "string"}}
                           for n in ("dryRun", "fieldManager", "fieldValidation")],
            "requestBody": {"content": {t: {"schema": {"type": "object"}}
                                        for t in patch_types}},
            "responses": {"200": {"description": "OK"}}}
        paths[_path_for(r)] = {"patch": operation, "get": {
            "x-kubernetes-group-version-kind": gvk[0],
            "responses": {"200": {"description": "OK"}}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (simulated)",
                                         "version": "v1.31.0-sim"}, "paths": paths,
            "components": {"schemas": {}}}


def openapi_root(group_versions: Iterable[str], docs: dict[str, Obj]) -> Obj:
    """``/openapi/v3``: where each group version's document is (with its hash, as the
    real server's relative URLs carry one)."""
    paths: Obj = {}
    for gv in group_versions:
        digest = hashlib.sha256(json.dumps(docs[gv], sort_keys=True).encode()).hexdigest()
        paths[_gv_path(gv)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(gv)}"
                                                    f"?hash={digest[:32].upper()}"}
    return {"paths": paths}
