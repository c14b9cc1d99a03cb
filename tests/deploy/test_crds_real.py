"""deploy/base/crds on a real kube-apiserver: the definitions install, docs/resources.md's
examples apply and print as the page shows, the schema and CEL rules refuse invalid specs
and forbidden updates with the messages the page quotes, ``/status`` is a subresource,
and the aggregated roles reach the built-in ``view`` and ``edit`` roles.

One envtest for the module, with ``--authorization-mode=RBAC`` and the real
kube-controller-manager running only the clusterrole-aggregation controller (it folds
``checkpoint-controlplane-view``/``-edit`` into ``view``/``edit``/``admin``). Two token
users: ``viewer`` bound to the built-in ``view`` in ``default``, ``editor`` to ``edit``
cluster-wide. No worker runs: every ``status`` here is written by the test, as the
workers would (tests/frontdoor/test_front_door_real.py runs the workers).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import KUBECTL, ROOT, Obj, find, render
from tests.support.envtest import (
    ADMIN,
    ASSETS,
    KUBECONFIG,
    Envtest,
    Identity,
    find_real_cluster,
    running_envtest,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOC = ROOT / "docs" / "resources.md"
GROUP = "checkpoint.controlplane.dev"
API = f"/apis/{GROUP}/v1alpha1"
NS = "default"
VIEWER = Identity("viewer", "viewer-token", ("system:authenticated",))
EDITOR = Identity("editor", "editor-token", ("system:authenticated",))
WORKER = "system:serviceaccount:checkpoint-system:controlplane"
OPERATIONS = ("checkpoints", "restores", "migrations", "suspensions", "drains")
#: kind -> (plural, short name, scope, has status and the category)
KINDS = {"Checkpoint": ("checkpoints", "ckpt", "Namespaced", True),
         "Restore": ("restores", "rst", "Namespaced", True),
         "Migration": ("migrations", "mig", "Namespaced", True),
         "Suspension": ("suspensions", "susp", "Namespaced", True),
         "Drain": ("drains", "drn", "Cluster", True),
         "CheckpointClass": ("checkpointclasses", "ckclass", "Cluster", False)}


def doc_examples() -> list[Obj]:
    """Every ```yaml block of docs/resources.md, one object each."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return [yaml.safe_load(b) for b in blocks]


def doc_output(command: str) -> list[str]:
    """The lines docs/resources.md shows under ``$ <command>`` (its first occurrence)."""
    lines = DOC.read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines))
               if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


def without_age(lines: list[str]) -> list[str]:
    """Table lines minus their last column (AGE: the only one that changes run to run)."""
    return [re.sub(r"\s*\S+$", "", line).rstrip() for line in lines if line.strip()]


@dataclass
class Server:
    env: Envtest
    kubeconfigs: dict[str, Path]

    def kubectl(self, *args: str, user: str = ADMIN.user,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", str(self.kubeconfigs[user]), *args],
                              input=stdin, capture_output=True, text=True, timeout=60,
                              check=False, cwd=ROOT)

    def apply(self, obj: Obj, user: str = ADMIN.user) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", "-f", "-", user=user, stdin=json.dumps(obj))

    def get(self, short: str, name: str) -> Obj:
        done = self.kubectl("get", short, name, "-o", "json")
        assert done.returncode == 0, done.stderr
        found: Obj = json.loads(done.stdout)
        return found

    def request(self, method: str, path: str, body: Obj,
                content_type: str = "application/json") -> Any:
        """One request as admin, with exactly this content type."""
        req = urllib.request.Request(f"{self.env.server}{path}", method=method,
                                     data=json.dumps(body).encode(), headers={
                                         "Authorization": f"Bearer {ADMIN.token}",
                                         "Content-Type": content_type})
        context = ssl.create_default_context(cafile=str(self.env.ca_file))
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            return json.loads(resp.read())

    def allowed(self, user: str, verb: str, resource: str, namespace: str = "") -> bool:
        """The server's own answer (a SubjectAccessReview) for ``resource[/subresource]``."""
        plural, _, sub = resource.partition("/")
        review = self.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": {
                "group": GROUP, "resource": plural, "subresource": sub, "verb": verb,
                "namespace": namespace}}})
        return bool(review["status"].get("allowed"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    kind, where = find_real_cluster()
    if kind == "none":
        pytest.skip(where)
    if kind == "kubeconfig":
        where = os.environ.get(ASSETS, "")
        if not where:
            pytest.skip(f"needs an envtest of its own with RBAC, token users and the "
                        f"aggregation controller ({ASSETS}); an existing cluster "
                        f"({KUBECONFIG}) cannot be given those")
    workdir = tmp_path_factory.mktemp("crds-envtest")
    with running_envtest(Path(where), workdir / "server", authorization="RBAC",
                         identities=[VIEWER, EDITOR]) as env:
        env.start_controllers(("clusterrole-aggregation",))
        yield Server(env, {i.user: env.write_kubeconfig(workdir / f"{i.user}.kubeconfig", i,
                                                         namespace=NS)
                           for i in (ADMIN, VIEWER, EDITOR)})


@dataclass
class Installed:
    crds: subprocess.CompletedProcess[str]
    established: subprocess.CompletedProcess[str]
    examples: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def installed(server: Server) -> Installed:
    """``kubectl apply -k deploy/base/crds``, wait until the kinds are served, then the
    docs page's examples in one ``kubectl apply``."""
    crds = server.kubectl("apply", "-k", "deploy/base/crds")
    established = server.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                                 *[f"crd/{plural}.{GROUP}" for plural, *_ in KINDS.values()])
    examples = "\n---\n".join(yaml.safe_dump(o) for o in doc_examples())
    return Installed(crds, established,
                     server.kubectl("apply", "-f", "-", stdin=examples))


@pytest.fixture
def ready(installed: Installed) -> Installed:
    assert installed.crds.returncode == 0, installed.crds.stderr
    assert installed.established.returncode == 0, installed.established.stderr
    return installed


# --- the definitions ------------------------------------------------------------------

def test_every_definition_is_applied_and_established(installed: Installed) -> None:
    assert installed.crds.returncode == 0, installed.crds.stderr
    assert installed.established.returncode == 0, installed.established.stderr
    assert installed.crds.stdout.count("customresourcedefinition") == len(KINDS)


def test_every_kind_has_the_agreed_names_scope_and_subresource(
        server: Server, ready: Installed) -> None:
    for kind, (plural, short, scope, operation) in KINDS.items():
        crd = server.get("crd", f"{plural}.{GROUP}")
        names = crd["spec"]["names"]
        assert (names["kind"], names["plural"], names["shortNames"], crd["spec"]["scope"]) \
            == (kind, plural, [short], scope)
        assert names.get("categories") == (["checkpointing"] if operation else None), kind
        [version] = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == (
            "v1alpha1", True, True)
        assert ("status" in (version.get("subresources") or {})) is operation, kind


def test_every_example_of_the_docs_page_is_accepted(server: Server, ready: Installed) -> None:
    assert ready.examples.returncode == 0, ready.examples.stderr
    examples = doc_examples()
    assert {o["kind"] for o in examples} == set(KINDS)
    for obj in examples:
        plural = KINDS[obj["kind"]][0]
        assert f"{obj['kind'].lower()}.{GROUP}/{obj['metadata']['name']} " \
            in ready.examples.stdout, plural


@pytest.mark.parametrize("short", [short for _, short, _, _ in KINDS.values()])
def test_kubectl_get_by_short_name_prints_the_columns_the_docs_show(
        server: Server, ready: Installed, short: str) -> None:
    """The page's output is the server's, but for the AGE values."""
    shown = doc_output(f"kubectl get {short}")
    done = server.kubectl("get", short, *[line.split()[0] for line in shown[1:]])
    assert done.returncode == 0, done.stderr
    assert without_age(done.stdout.splitlines()) == without_age(shown)


def test_the_checkpointing_category_lists_every_operation_kind(
        server: Server, ready: Installed) -> None:
    done = server.kubectl("get", "checkpointing", "-o", "name")
    assert done.returncode == 0, done.stderr
    kinds = {line.split("/")[0].split(".")[0] for line in done.stdout.split()}
    assert kinds == {k.lower() for k, (*_, operation) in KINDS.items() if operation}


# --- validation: the server's own messages --------------------------------------------

def _obj(kind: str, name: str, spec: Obj) -> Obj:
    metadata: Obj = {"name": name}
    if KINDS[kind][2] == "Namespaced":
        metadata["namespace"] = NS
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": kind, "metadata": metadata,
            "spec": spec}


INVALID = {
    "missing podName": (_obj("Migration", "no-pod", {"targetNodeName": "node-2"}),
                        "spec.podName: Required value"),
    "maxParallel 0": (_obj("Drain", "zero", {"nodeName": "node-2", "maxParallel": 0}),
                      "spec.maxParallel: Invalid value: 0: spec.maxParallel in body should "
                      "be greater than or equal to 1"),
    "tagScheme without {checkpoint_id}": (
        _obj("CheckpointClass", "no-id", {"repository": "registry.example.com/x",
                                          "tagScheme": "{pod}"}),
        "spec.tagScheme: Invalid value: \"{pod}\": spec.tagScheme must contain "
        "'{checkpoint_id}' so that no two checkpoints share a tag, e.g. "
        "'{namespace}.{pod}.{checkpoint_id}'"),
    "Restore from both a name and an id": (
        _obj("Restore", "both", {"nodeName": "node-2", "checkpointName": "web",
                                 "operationID": "0b6c0a52-5d7e-4a7e-9d0e-3c1f4e0b8a11"}),
        "spec: Invalid value: exactly one of spec.checkpointName and spec.operationID must "
        "be set: name the Checkpoint (or Suspension) to restore, or give the operation's id"),
    "pod name not DNS-1123": (
        _obj("Migration", "underscore", {"podName": "Web_0", "targetNodeName": "node-2"}),
        "spec.podName in body should match "
        r"'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'"),
}


@pytest.mark.parametrize("case", INVALID)
def test_an_invalid_spec_is_refused_with_the_message_the_docs_quote(
        server: Server, ready: Installed, case: str) -> None:
    obj, message = INVALID[case]
    done = server.apply(obj)
    assert done.returncode != 0, done.stdout
    assert message in done.stderr
    assert f"`{message}`" in DOC.read_text()


def _created(server: Server, kind: str, name: str, spec: Obj) -> Obj:
    done = server.apply(_obj(kind, name, spec))
    assert done.returncode == 0, done.stderr
    return server.get(KINDS[kind][1], name)


def _patch(server: Server, kind: str, name: str, patch: Obj) -> subprocess.CompletedProcess[str]:
    return server.kubectl("patch", KINDS[kind][1], name, "--type=merge", "-p", json.dumps(patch))


REFUSED = {
    "podName changed": (
        "Migration", {"podName": "web-0", "targetNodeName": "node-2"},
        [{"spec": {"podName": "other"}}],
        'spec.podName: Invalid value: "other": spec.podName is immutable: create a new '
        "Migration to move another pod"),
    "cancel withdrawn": (
        "Migration", {"podName": "web-0", "targetNodeName": "node-2", "cancel": True},
        [{"spec": {"cancel": False}}],
        "spec.cancel: Invalid value: false: spec.cancel cannot go back to false: a cancelled "
        "operation stays cancelled; create a new Migration to run it again"),
    "Running back to Suspended": (
        "Suspension", {"podName": "notebook-7"},
        [{"spec": {"operatingMode": "Running"}}, {"spec": {"operatingMode": "Suspended"}}],
        'spec.operatingMode: Invalid value: "Suspended": spec.operatingMode cannot go from '
        "Running back to Suspended: create a new Suspension to suspend the pod again"),
    "resumeNodeName once Running": (
        "Suspension", {"podName": "notebook-7"},
        [{"spec": {"operatingMode": "Running", "resumeNodeName": "node-1"}},
         {"spec": {"resumeNodeName": "node-2"}}],
        "spec.resumeNodeName: Invalid value: spec.resumeNodeName is immutable once "
        "spec.operatingMode is Running: set it in the same update that sets Running"),
    "a Restore's source changed": (
        "Restore", {"checkpointName": "web", "nodeName": "node-2"},
        [{"spec": {"checkpointName": "other"}}],
        "spec.checkpointName is immutable: create a new Restore to restore another "
        "checkpoint"),
    "a Drain's targets changed": (
        "Drain", {"nodeName": "node-3", "targets": ["node-1"]},
        [{"spec": {"targets": ["node-2"]}}],
        "spec.targets is immutable: create a new Drain with other targets"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_forbidden_update_is_refused_with_the_cel_message(
        server: Server, ready: Installed, case: str) -> None:
    kind, spec, patches, message = REFUSED[case]
    name = re.sub(r"[^a-z0-9]+", "-", f"refused {case}".lower()).strip("-")
    before = _created(server, kind, name, spec)
    *allowed, refused = patches
    for patch in allowed:
        done = _patch(server, kind, name, patch)
        assert done.returncode == 0, done.stderr
    done = _patch(server, kind, name, refused)
    assert done.returncode != 0, done.stdout
    assert message in done.stderr
    after = server.get(KINDS[kind][1], name)
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + len(allowed)


def test_a_retarget_and_a_resume_are_accepted(server: Server, ready: Installed) -> None:
    """The mutable fields: Migration.targetNodeName, Suspension.operatingMode one way (with
    resumeNodeName set while Suspended), cancel false -> true; a class is mutable."""
    _created(server, "Migration", "retarget", {"podName": "web-0", "targetNodeName": "node-2"})
    for patch in ({"spec": {"targetNodeName": "node-3"}}, {"spec": {"cancel": True}}):
        done = _patch(server, "Migration", "retarget", patch)
        assert done.returncode == 0, done.stderr
    moved = server.get("mig", "retarget")
    assert (moved["spec"]["targetNodeName"], moved["spec"]["cancel"]) == ("node-3", True)
    assert moved["metadata"]["generation"] == 3
    _created(server, "Suspension", "resume", {"podName": "notebook-7"})
    for patch in ({"spec": {"resumeNodeName": "node-1"}},
                  {"spec": {"resumeNodeName": "node-2"}},
                  {"spec": {"operatingMode": "Running"}}):
        done = _patch(server, "Suspension", "resume", patch)
        assert done.returncode == 0, done.stderr
    resumed = server.get("susp", "resume")["spec"]
    assert (resumed["operatingMode"], resumed["resumeNodeName"]) == ("Running", "node-2")
    _created(server, "CheckpointClass", "mutable", {"repository": "registry.example.com/a"})
    done = _patch(server, "CheckpointClass", "mutable",
                  {"spec": {"repository": "registry.example.com/b", "onFailure": "Kill"}})
    assert done.returncode == 0, done.stderr


def test_defaults_are_filled_in_by_the_server(server: Server, ready: Installed) -> None:
    spec = _created(server, "Drain", "defaults", {"nodeName": "node-1"})["spec"]
    assert (spec["className"], spec["maxParallel"], spec["cancel"]) == ("default", 4, False)
    spec = _created(server, "Suspension", "defaults", {"podName": "p"})["spec"]
    assert (spec["operatingMode"], spec["className"]) == ("Suspended", "default")


# --- the status subresource -----------------------------------------------------------

def test_a_merge_patch_to_status_sets_it_without_a_new_generation(
        server: Server, ready: Installed) -> None:
    """What the workers send (application/merge-patch+json to /status): status changes,
    spec and generation do not; a spec change does bump the generation and cannot set
    status."""
    created = _created(server, "Migration", "mirrored",
                       {"podName": "web-0", "targetNodeName": "node-2"})
    uid = created["metadata"]["uid"]
    status = {"observedGeneration": 1, "operationID": uid, "phase": "Capturing",
              "startTime": "2026-11-26T03:40:00Z",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                              "message": "the operation was created", "observedGeneration": 1,
                              "lastTransitionTime": "2026-11-26T03:40:00Z"}]}
    path = f"{API}/namespaces/{NS}/migrations/mirrored"
    written = server.request("PATCH", f"{path}/status",
                             {"status": status, "spec": {"targetNodeName": "node-9"}},
                             "application/merge-patch+json")
    assert written["status"] == status
    assert written["spec"]["targetNodeName"] == "node-2"
    assert written["metadata"]["generation"] == 1
    retargeted = server.request("PATCH", path, {"spec": {"targetNodeName": "node-3"},
                                                "status": {"phase": "Succeeded"}},
                                "application/merge-patch+json")
    assert retargeted["metadata"]["generation"] == 2
    assert retargeted["status"] == status
    done = server.kubectl("get", "mig", "mirrored", "--no-headers")
    assert done.stdout.split()[:4] == ["mirrored", "web-0", "node-3", "Capturing"]
    wide = server.kubectl("get", "mig", "mirrored", "-o", "wide")
    assert wide.stdout.splitlines()[0].split() == doc_output(
        "kubectl get mig -o wide")[0].split()


def test_a_condition_without_its_required_fields_is_refused(
        server: Server, ready: Installed) -> None:
    _created(server, "Checkpoint", "bad-condition", {"podName": "web-0"})
    done = server.kubectl("patch", "ckpt", "bad-condition", "--subresource=status",
                          "--type=merge", "-p", json.dumps(
                              {"status": {"conditions": [{"type": "Accepted",
                                                          "status": "Maybe"}]}}))
    assert done.returncode != 0
    for wanted in ("status.conditions[0].status: Unsupported value: \"Maybe\"",
                   "status.conditions[0].reason: Required value",
                   "status.conditions[0].lastTransitionTime: Required value"):
        assert wanted in done.stderr


# --- RBAC -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bound(server: Server, installed: Installed) -> Server:
    """viewer -> view in ``default`` (a RoleBinding), editor -> edit cluster-wide (a
    ClusterRoleBinding: so the one thing keeping it from classes is the role itself); the
    workers' ClusterRole and binding as deploy/ renders them; then wait until the
    aggregation controller has folded the new roles in."""
    assert installed.crds.returncode == 0, installed.crds.stderr
    for identity, role, binding in ((VIEWER, "view", "RoleBinding"),
                                    (EDITOR, "edit", "ClusterRoleBinding")):
        metadata = {"name": f"{identity.user}-{role}"}
        if binding == "RoleBinding":
            metadata["namespace"] = NS
        done = server.apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding,
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": identity.user}]})
        assert done.returncode == 0, done.stderr
    objects = render("dev")
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        done = server.apply(find(objects, kind, "checkpoint-controlplane"))
        assert done.returncode == 0, done.stderr
    wait_for(lambda: server.allowed(VIEWER.user, "list", "migrations", NS)
             and server.allowed(EDITOR.user, "create", "migrations", NS),
             "the clusterrole-aggregation controller to extend view and edit")
    return server


def test_a_viewer_lists_migrations_but_cannot_create_one(bound: Server) -> None:
    listed = bound.kubectl("get", "mig", user=VIEWER.user)
    assert listed.returncode == 0, listed.stderr
    assert "move-web" in listed.stdout
    created = bound.apply(_obj("Migration", "by-viewer",
                               {"podName": "web-0", "targetNodeName": "node-2"}), VIEWER.user)
    assert created.returncode != 0
    assert 'User "viewer" cannot create resource "migrations" in API group ' \
        f'"{GROUP}" in the namespace "{NS}"' in created.stderr


def test_an_editor_creates_operations_but_not_a_class_nor_a_status(bound: Server) -> None:
    """edit reaches the five operation kinds (Drain too, bound cluster-wide) and reads
    classes through view; writing a class or a status is refused."""
    for obj in (_obj("Migration", "by-editor", {"podName": "web-0", "targetNodeName": "node-2"}),
                _obj("Drain", "by-editor", {"nodeName": "node-1"})):
        created = bound.kubectl("create", "-f", "-", user=EDITOR.user, stdin=json.dumps(obj))
        assert created.returncode == 0, created.stderr
    cancelled = bound.kubectl("patch", "mig", "by-editor", "--type=merge", "-p",
                              '{"spec": {"cancel": true}}', user=EDITOR.user)
    assert cancelled.returncode == 0, cancelled.stderr
    classes = bound.kubectl("get", "ckclass", "-o", "name", user=EDITOR.user)
    assert classes.returncode == 0, classes.stderr
    assert "checkpointclass.checkpoint.controlplane.dev/sandbox" in classes.stdout.split()
    refused = bound.kubectl("create", "-f", "-", user=EDITOR.user, stdin=json.dumps(
        _obj("CheckpointClass", "by-editor", {"repository": "registry.example.com/x"})))
    assert refused.returncode != 0
    assert 'User "editor" cannot create resource "checkpointclasses" in API group ' \
        f'"{GROUP}" at the cluster scope' in refused.stderr
    assert not bound.allowed(EDITOR.user, "patch", "migrations/status", NS)
    assert not bound.allowed(EDITOR.user, "update", "checkpointclasses")


def test_the_workers_rules_are_exactly_the_front_doors_calls(bound: Server) -> None:
    """list/watch/patch (the finalizer) of the operations, patch of their status, get
    of a class by name: nothing else of the group, in any namespace."""
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete",
             "deletecollection")
    resources = [*OPERATIONS, "checkpointclasses", *[f"{r}/status" for r in OPERATIONS]]
    allowed = {(r, v) for r in resources for v in verbs
               if bound.allowed(WORKER, v, r, "" if r.startswith(("drains", "checkpointclasses"))
                               else "apps")}
    expected = {(r, v) for r in OPERATIONS for v in ("list", "watch", "patch")} | {
        (f"{r}/status", "patch") for r in OPERATIONS} | {
        ("checkpointclasses", "get")}
    assert allowed == expected
