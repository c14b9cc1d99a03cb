"""Bad input gets a typed error whose one-line message names what to fix.

Invariants pinned:

- a kubeconfig whose server cannot be reached: ``start()`` fails at once (not after
  ``sync_timeout``) with :class:`ApiUnreachable`, naming the server's address and saying
  to check that it is reachable;
- RBAC refusals (403): :class:`ApiForbidden` naming the verb, the resource and the
  namespace (or the cluster scope), with the missing rule as the fix — at start (the
  first list) and from a handler (a terminal action error carrying the same words);
- creating in a namespace that does not exist: :class:`ApiNamespaceNotFound` saying the
  namespace does not exist (the real API server's 404 is about the namespace, not the
  object: pinned on a real cluster when one is configured).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from controlplane.engine.decider import Action
from controlplane.worker.errors import TerminalActionError
from drivers.kube import errors
from drivers.kube.config import KubeSettings
from drivers.kube.driver import KubeDriver
from drivers.kube.resources import PODS
from tests.drivers.harness import Harness

#: A real API server's answer to a patch that RBAC refuses (kube-apiserver 1.30, verbatim
#: but for the names): the format the driver's messages are built around.
REAL_FORBIDDEN = {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'pods "web-0" is forbidden: User "system:serviceaccount:cp:controlplane" '
               'cannot patch resource "pods" in API group "" in the namespace "shop"',
    "reason": "Forbidden", "details": {"name": "web-0", "kind": "pods"}, "code": 403}

#: A real API server's answer to creating a pod in a namespace that does not exist.
REAL_NAMESPACE_NOT_FOUND = {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'namespaces "nowhere" not found', "reason": "NotFound",
    "details": {"name": "nowhere", "kind": "namespaces"}, "code": 404}


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_server_fails_start_at_once_naming_its_address(
        tmp_path: Path) -> None:
    port = _closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    kube = await KubeDriver.connect(kubeconfig=str(kubeconfig),
                                    settings=KubeSettings(sync_timeout=60.0))

    async def start() -> None:
        async with kube:
            pass

    with pytest.raises(errors.ApiUnreachable) as caught:
        await asyncio.wait_for(start(), 10)  # far below sync_timeout: it gave up at once
    text = _one_line(caught.value)
    assert f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}" in text
    assert "reachable" in caught.value.hint
    assert "kubeconfig" in caught.value.hint


def test_a_real_forbidden_status_names_verb_resource_namespace_and_the_missing_rule(
        ) -> None:
    error = errors.from_status(403, REAL_FORBIDDEN, verb="patch",
                               path="/api/v1/namespaces/shop/pods/web-0", resource="pods",
                               namespace="shop")
    assert type(error) is errors.ApiForbidden
    text = _one_line(error)
    assert text.startswith('forbidden: cannot patch pods in namespace "shop": ')
    assert 'User "system:serviceaccount:cp:controlplane" cannot patch' in text
    assert error.hint == ('the RBAC rule missing is apiGroups [""], resources ["pods"], '
                          'verbs ["patch"]: grant it with a Role (and RoleBinding) in '
                          'namespace "shop"')


def test_a_cluster_wide_refusal_asks_for_a_cluster_role() -> None:
    error = errors.from_status(403, {"kind": "Status", "code": 403, "reason": "Forbidden",
                                     "message": 'nodes is forbidden: User "u" cannot list '
                                                'resource "nodes" in API group "" at the '
                                                "cluster scope"},
                               verb="list", path="/api/v1/nodes", resource="nodes")
    assert "cannot list nodes:" in _one_line(error)
    assert 'verbs ["list"]' in error.hint
    assert "ClusterRole" in error.hint


def test_a_forbidden_that_is_not_rbac_names_no_rule() -> None:
    """Quota, PodSecurity or a terminating namespace are 403s too: no RBAC rule is the fix."""
    quota = {"kind": "Status", "code": 403, "reason": "Forbidden",
             "message": 'pods "web-1" is forbidden: exceeded quota: compute, requested: '
                        "pods=1, used: pods=10, limited: pods=10"}
    error = errors.from_status(403, quota, verb="create", path="/p", resource="pods",
                               namespace="shop")
    assert type(error) is errors.ApiForbidden
    assert 'cannot create pods in namespace "shop": pods "web-1" is forbidden: exceeded ' \
        "quota" in _one_line(error)
    assert error.hint == ""


def test_a_real_namespace_not_found_says_the_namespace_does_not_exist() -> None:
    error = errors.from_status(404, REAL_NAMESPACE_NOT_FOUND, verb="create",
                               path="/api/v1/namespaces/nowhere/pods", resource="pods",
                               namespace="nowhere")
    assert type(error) is errors.ApiNamespaceNotFound
    assert isinstance(error, errors.ApiNotFound)
    assert _one_line(error).startswith('namespace "nowhere" does not exist: cannot create pods')
    assert 'create namespace "nowhere"' in error.hint


def test_a_missing_object_is_not_mistaken_for_a_missing_namespace() -> None:
    error = errors.from_status(404, {"kind": "Status", "code": 404, "reason": "NotFound",
                                     "message": 'pods "x" not found',
                                     "details": {"name": "x", "kind": "pods"}},
                               verb="get", path="/p", resource="pods", namespace="a")
    assert type(error) is errors.ApiNotFound


async def test_a_forbidden_first_list_fails_start_with_the_missing_rule(
        harness: Harness) -> None:
    h = harness
    h.faults.forbid("list", "pods", namespace=h.namespace)
    with pytest.raises(errors.ApiForbidden) as caught:
        async with asyncio.timeout(10), h.driver(sync_timeout=60.0):
            pass
    text = _one_line(caught.value)
    assert f'cannot list pods in namespace "{h.namespace}"' in text
    assert 'cannot list resource "pods"' in text  # the server's own words are kept
    assert 'resources ["pods"], verbs ["list"]' in caught.value.hint
    assert f'Role (and RoleBinding) in namespace "{h.namespace}"' in caught.value.hint


async def test_a_forbidden_patch_is_a_terminal_action_error_naming_the_rule(
        harness: Harness) -> None:
    h = harness
    name = h.name("guarded")
    uid = (await h.make_pod(name))["metadata"]["uid"]
    h.faults.forbid("patch", "pods")
    async with h.driver() as kube:
        with pytest.raises(TerminalActionError) as caught:
            await kube.handlers()["AnnotatePod"](Action("AnnotatePod", "r/1", {
                "namespace": h.namespace, "name": name, "uid": uid, "annotations": {"a": "b"}}))
    assert caught.value.error_class == "Forbidden"
    text = _one_line(caught.value)
    assert f'cannot patch pods in namespace "{h.namespace}"' in text
    assert 'the RBAC rule missing is apiGroups [""], resources ["pods"], verbs ["patch"]' in text
    assert isinstance(caught.value.__cause__, errors.ApiForbidden)


async def test_creating_in_a_namespace_that_does_not_exist_says_so(harness: Harness) -> None:
    """Pins (real API server): POST into a missing namespace is 404 NotFound whose
    details name the NAMESPACE (kind ``namespaces``), not the object."""
    h = harness
    missing = h.name("no-such-namespace")
    with pytest.raises(errors.ApiNamespaceNotFound) as caught:
        await h.admin.create(PODS, h.pod_body("p"), namespace=missing)
    assert _one_line(caught.value).startswith(
        f'namespace "{missing}" does not exist: cannot create pods in it')
    async with h.driver() as kube:
        with pytest.raises(TerminalActionError) as terminal:
            await kube.handlers()["CreatePod"](Action("CreatePod", "ns/1", {
                "namespace": missing, "name": "p", "node": None, "annotations": {},
                "labels": {}, "template": {"spec": h.pod_body("p")["spec"]}}))
    assert terminal.value.error_class == "NotFound"
    assert f'namespace "{missing}" does not exist' in _one_line(terminal.value)
    assert isinstance(terminal.value.__cause__, errors.ApiNamespaceNotFound)
