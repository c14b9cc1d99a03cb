"""deploy/'s webhook: the server in every overlay, its registration in each overlay's
``webhook/`` kustomization, and the pieces agreeing — the registration's Service, port
and policy (fail open in 2 s, CREATE pods only), the Service onto the serve port, and in
production cert-manager's Certificate for the Secret the Deployment mounts and the CA the
registration is injected from."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    KUBECTL,
    OVERLAYS,
    Obj,
    container,
    find,
    pod_spec,
    render,
)

NAMESPACE = "checkpoint-system"
VERSIONS = ("1.30", kubernetes_validate.latest_version())  # matchConditions: GA in 1.30


def registration(overlay: str) -> list[Obj]:
    """``deploy/overlays/<overlay>/webhook``, rendered."""
    done = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / "overlays" / overlay / "webhook")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def hook(overlay: str) -> dict[str, Any]:
    [only] = find(registration(overlay), "MutatingWebhookConfiguration",
                  "controlplane-successor-gate")["webhooks"]
    return dict(only)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_registration_is_valid_kubernetes(overlay: str, version: str) -> None:
    for obj in registration(overlay):
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # a CRD: no schema offline (checked below for what we rely on)
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_webhook_fails_open_within_two_seconds_and_sees_only_pod_creation(
    overlay: str,
) -> None:
    h = hook(overlay)
    assert (h["failurePolicy"], h["timeoutSeconds"], h["sideEffects"]) == ("Ignore", 2, "None")
    assert (h["admissionReviewVersions"], h["reinvocationPolicy"]) == (["v1"], "Never")
    assert h["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}]
    [condition] = h["matchConditions"]
    assert "StatefulSet" in condition["expression"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_registration_reaches_the_servers_port_through_the_service(overlay: str) -> None:
    objects = render(overlay)
    service = find(objects, "Service", "controlplane-webhook")
    deployment = find(objects, "Deployment", "controlplane-webhook")
    ref = hook(overlay)["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref["path"]) == (
        "controlplane-webhook", NAMESPACE, "/mutate/pods")
    [port] = service["spec"]["ports"]
    assert port["port"] == ref["port"] == 443
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    webhook = container(deployment, "webhook")
    [serving] = [p for p in webhook["ports"] if p["name"] == port["targetPort"]]
    assert f"--port={serving['containerPort']}" in webhook["args"]
    assert webhook["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert deployment["spec"]["replicas"] >= 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_has_no_kubernetes_token_and_mounts_only_its_tls_secret(
    overlay: str,
) -> None:
    objects = render(overlay)
    spec = pod_spec(find(objects, "Deployment", "controlplane-webhook"))
    assert spec["automountServiceAccountToken"] is False
    assert find(objects, "ServiceAccount", spec["serviceAccountName"])[
        "automountServiceAccountToken"] is False
    assert [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v] == [
        "controlplane-webhook-tls"]


def test_production_gets_its_certificate_and_ca_bundle_from_cert_manager() -> None:
    objects = registration("production")
    config = find(objects, "MutatingWebhookConfiguration", "controlplane-successor-gate")
    certificate = find(objects, "Certificate", "controlplane-webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    spec = certificate["spec"]
    assert spec["secretName"] == "controlplane-webhook-tls"
    assert spec["dnsNames"] == [f"controlplane-webhook.{NAMESPACE}.svc",
                                f"controlplane-webhook.{NAMESPACE}.svc.cluster.local"]
    issuer = find(objects, spec["issuerRef"]["kind"], spec["issuerRef"]["name"])
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"] == NAMESPACE


def test_dev_registers_without_cert_manager() -> None:
    """The dev cluster's caBundle comes from `cpctl webhook certs` (docs/install.md)."""
    objects = registration("dev")
    assert [o["kind"] for o in objects] == ["MutatingWebhookConfiguration"]
    assert "annotations" not in objects[0]["metadata"]
