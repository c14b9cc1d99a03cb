"""Every overlay renders with ``kubectl kustomize``, every object is valid against the
Kubernetes schemas (offline, ``kubernetes-validate``), and the pieces fit together: the
Deployment runs 2+ replicas with probes, requests and a drain period, the PDB and the
metrics Service select its pods, references resolve, checkpoint classes parse, the custom
resources' definitions and roles are in every overlay (on a real server:
test_crds_real.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from controlplane.machines.config.classes import parse_class
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    Obj,
    all_of,
    container,
    find,
    pod_spec,
    render,
)

#: The oldest Kubernetes minor these manifests support, and the newest the validator knows.
VERSIONS = ("1.30", kubernetes_validate.latest_version())


def test_there_is_more_than_one_overlay() -> None:
    assert {"dev", "production"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(
        overlay: str, version: str) -> None:
    """Strict: an unknown field is an error, as `kubectl apply --validate=strict` says."""
    objects = render(overlay)
    assert len(objects) >= 12
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {obj['kind']} {obj['metadata']['name']} is invalid for "
                        f"Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_the_validator_refuses_a_broken_object() -> None:
    """The schema check is live: a misspelt field and a wrong type are both refused."""
    deployment = find(render("production"), "Deployment", "controlplane")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replica"] = 3
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_control_plane_runs_several_replicas_with_probes_requests_and_a_drain(
        overlay: str) -> None:
    objects = render(overlay)
    deployment = find(objects, "Deployment", "controlplane")
    assert deployment["spec"]["replicas"] >= 2
    spec = pod_spec(deployment)
    assert spec["terminationGracePeriodSeconds"] >= 30  # the worker drains on SIGTERM
    for c in [*spec["containers"], *spec["initContainers"]]:
        assert c["resources"]["requests"]["cpu"]
        assert c["resources"]["requests"]["memory"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    api = container(deployment, "api")
    for probe in ("readinessProbe", "livenessProbe"):
        assert api[probe]["httpGet"]["path"] == "/healthz"
    worker = container(deployment, "worker")
    assert worker["args"][worker["args"].index("worker") + 1] == "--in-cluster"
    # The worker's liveness is its own claim loop (cpctl worker --metrics-listen).
    [port] = [p for p in worker["ports"] if p["name"] == worker["livenessProbe"]["httpGet"]["port"]]
    assert f"--metrics-listen=0.0.0.0:{port['containerPort']}" in worker["args"]
    assert worker["livenessProbe"]["httpGet"]["path"] == "/healthz"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = find(objects, "PodDisruptionBudget", "controlplane")
    service = find(objects, "Service", "controlplane-metrics")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migration_job_and_the_init_container_gate_the_schema(overlay: str) -> None:
    objects = render(overlay)
    job = find(objects, "Job", "controlplane-db-upgrade")
    [c] = pod_spec(job)["containers"]
    assert c["command"] + c["args"][-2:] == ["cpctl", "db", "upgrade"]
    assert pod_spec(job)["automountServiceAccountToken"] is False
    wait = container(find(objects, "Deployment", "controlplane"), "wait-for-schema", init=True)
    assert wait["command"] + wait["args"] == ["cpctl", "db", "current"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agent_runs_on_every_node_with_only_what_a_capture_needs_from_the_host(
        overlay: str) -> None:
    """The kubelet's checkpoint directory (read-write), the node's cgroups (read-only) and
    its PID namespace, to stop a quiesced container right after its dump; no host network,
    and of root's capabilities only DAC_OVERRIDE (the archives) and KILL (the stop)."""
    daemonset = find(render(overlay), "DaemonSet", "checkpoint-agent")
    spec = pod_spec(daemonset)
    assert {"operator": "Exists"} in spec["tolerations"]
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == ["/var/lib/kubelet/checkpoints", "/sys/fs/cgroup"]
    assert not spec.get("hostNetwork")
    assert spec.get("hostPID") is True
    agent = container(daemonset, "agent")
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                        "add": ["DAC_OVERRIDE", "KILL"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert mounts["/host/sys/fs/cgroup"]["readOnly"] is True
    assert "--cgroup-root=/host/sys/fs/cgroup" in agent["args"]
    # Sealed checkpoints: the keys read-only and the agent's alone; every push signed.
    for path in ("/etc/controlplane/signing", "/etc/controlplane/secrets/checkpoint-keys"):
        assert mounts[path]["readOnly"] is True
    modes = {v["secret"]["secretName"]: v["secret"]["defaultMode"] for v in spec["volumes"]
             if "secret" in v}
    assert modes == {"checkpoint-signing": 0o400, "checkpoint-keys": 0o400,
                     "checkpoint-handoff": 0o400}
    assert mounts["/etc/controlplane/handoff"]["readOnly"] is True
    assert "--handoff-key=/etc/controlplane/handoff/handoff.key" in agent["args"]
    assert "--signing-key=/etc/controlplane/signing/signing.pem" in agent["args"]
    assert "--trusted-key=/etc/controlplane/signing/signing.pub" in agent["args"]


def test_the_workers_verify_signatures_with_only_the_public_half_of_the_key() -> None:
    """The workers pin only what the agents signed, and never hold the signing key."""
    deployment = find(render("production"), "Deployment", "controlplane")
    worker = container(deployment, "worker")
    assert "--trusted-key=/etc/controlplane/trusted/signing.pub" in worker["args"]
    [trusted] = [v for v in pod_spec(deployment)["volumes"] if v["name"] == "trusted"]
    assert trusted["secret"] == {"secretName": "checkpoint-signing",
                                 "items": [{"key": "signing.pub", "path": "signing.pub"}]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_object_is_rendered_or_created_out_of_band(overlay: str) -> None:
    """ConfigMaps, ServiceAccounts and Secrets a pod names exist in the render, except the
    two Secrets production creates by hand and the key Secrets (docs/install.md)."""
    objects = render(overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    # The keys of sealed checkpoints and the webhook's TLS: never rendered (a key in git is
    # a key for everyone); docs/install.md and docs/webhook.md say how they are made.
    keys = {("Secret", "checkpoint-signing"), ("Secret", "checkpoint-keys"),
            ("Secret", "checkpoint-handoff"), ("Secret", "controlplane-webhook-tls")}
    out_of_band = {("Secret", "controlplane-database"), ("Secret", "controlplane-api")}
    if overlay == "dev":
        out_of_band = set()
    out_of_band |= keys  # never rendered: a key in git is a key for everyone
    for workload in [*all_of(objects, "Deployment"), *all_of(objects, "DaemonSet"),
                     *all_of(objects, "Job")]:
        spec = pod_spec(workload)
        wanted = {("ServiceAccount", spec["serviceAccountName"])}
        for c in [*spec["containers"], *(spec.get("initContainers") or [])]:
            for source in c.get("envFrom") or []:
                wanted.add(("ConfigMap", source["configMapRef"]["name"]))
            for item in c.get("env") or []:
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    wanted.add(("Secret", ref["name"]))
        for volume in spec.get("volumes") or []:
            if "configMap" in volume:
                wanted.add(("ConfigMap", volume["configMap"]["name"]))
            if "secret" in volume:
                wanted.add(("Secret", volume["secret"]["secretName"]))
        assert wanted - out_of_band <= names, f"{workload['metadata']['name']}: " \
            f"missing {sorted(wanted - out_of_band - names)}"
    assert all(o["metadata"].get("namespace") == "checkpoint-system" for o in objects
               if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding",
                                    "CustomResourceDefinition"))


def test_checkpoint_classes_are_valid_product_configuration() -> None:
    cm = find(render("production"), "ConfigMap", "checkpoint-classes")
    classes = yaml.safe_load(cm["data"]["classes.yaml"])["classes"]
    parsed = [parse_class(c, field=f"classes[{i}]") for i, c in enumerate(classes)]
    assert [c.name for c in parsed] == sorted({c.name for c in parsed}, key=[
        c.name for c in parsed].index)  # names are unique
    assert "default" in [c.name for c in parsed]


@pytest.mark.parametrize(("overlay", "image"), [
    ("dev", "localhost:5001/checkpoint-controlplane:dev"),
    ("production", "registry.example.com/checkpoint-controlplane:0.1.0")])
def test_every_container_runs_the_overlays_image(overlay: str, image: str) -> None:
    objects = render(overlay)
    for workload in [*all_of(objects, "Deployment"), *all_of(objects, "DaemonSet"),
                     *all_of(objects, "Job")]:
        spec = pod_spec(workload)
        for c in [*spec["containers"], *(spec.get("initContainers") or [])]:
            assert c["image"] == image, (workload["metadata"]["name"], c["name"])


def test_the_base_holds_no_credentials() -> None:
    """Secrets come from an overlay (dev, throwaway) or from the operator (production)."""
    for path in (DEPLOY / "base").rglob("*"):
        if path.is_file():
            assert "secretGenerator" not in path.read_text(), path
    assert not all_of(render("production"), "Secret")



#: The custom resources' kinds (docs/resources.md): plural, short name, scope, an operation (status
#: subresource, category ``checkpointing``) or not.
CUSTOM_KINDS = {"Checkpoint": ("checkpoints", "ckpt", "Namespaced", True),
                "Restore": ("restores", "rst", "Namespaced", True),
                "Migration": ("migrations", "mig", "Namespaced", True),
                "Suspension": ("suspensions", "susp", "Namespaced", True),
                "Drain": ("drains", "drn", "Cluster", True),
                "CheckpointClass": ("checkpointclasses", "ckclass", "Cluster", False)}
GROUP = "checkpoint.controlplane.dev"


def _schema(crd: Obj) -> Obj:
    [version] = crd["spec"]["versions"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_installs_the_six_kinds_with_status_short_names_and_columns(
        overlay: str) -> None:
    crds = {o["spec"]["names"]["kind"]: o for o in all_of(render(overlay),
                                                         "CustomResourceDefinition")}
    assert set(crds) == set(CUSTOM_KINDS)
    for kind, (plural, short, scope, operation) in CUSTOM_KINDS.items():
        crd = crds[kind]
        assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
        assert "namespace" not in crd["metadata"]
        assert (crd["spec"]["group"], crd["spec"]["scope"]) == (GROUP, scope)
        assert crd["spec"]["names"]["shortNames"] == [short]
        assert crd["spec"]["names"].get("categories") == (
            ["checkpointing"] if operation else None)
        [version] = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == (
            "v1alpha1", True, True)
        assert (version.get("subresources") == {"status": {}}) is operation, kind
        columns = [c["name"] for c in version["additionalPrinterColumns"]]
        assert columns[-1] == "Age", kind
        assert ("Phase" in columns) is operation, kind
        assert _schema(crd)["required"] == ["spec"]


def test_every_operation_kind_mirrors_conditions_as_a_map_keyed_by_type() -> None:
    for crd in all_of(render("production"), "CustomResourceDefinition"):
        if not CUSTOM_KINDS[crd["spec"]["names"]["kind"]][3]:
            continue
        status = _schema(crd)["properties"]["status"]["properties"]
        conditions = status["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert set(conditions["items"]["required"]) == {
            "type", "status", "lastTransitionTime", "reason", "message"}
        assert {"observedGeneration", "operationID", "phase", "startTime",
                "completionTime"} <= set(status)
        spec = _schema(crd)["properties"]["spec"]["properties"]
        assert spec["cancel"]["x-kubernetes-validations"][0]["rule"] == "!oldSelf || self"


def test_every_cel_string_and_list_is_bounded() -> None:
    """A string or list a rule reads needs maxLength/maxItems, or the server refuses the
    definition for its estimated cost; checked here for every string, offline."""
    def walk(schema: Obj, path: str) -> Iterator[str]:
        if schema.get("type") == "string" and "enum" not in schema \
                and "maxLength" not in schema and schema.get("format") != "date-time":
            yield path
        if schema.get("type") == "array" and "maxItems" not in schema:
            yield path
        for name, child in (schema.get("properties") or {}).items():
            yield from walk(child, f"{path}.{name}")
        if isinstance(schema.get("items"), dict):
            yield from walk(schema["items"], f"{path}[]")

    for crd in all_of(render("production"), "CustomResourceDefinition"):
        schema = _schema(crd)
        unbounded = [p for name, child in schema["properties"].items()
                     if name in ("spec", "status") for p in walk(child, name)]
        assert not unbounded, (crd["metadata"]["name"], unbounded)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_aggregated_roles_extend_view_and_edit_but_not_to_classes(overlay: str) -> None:
    objects = render(overlay)
    view = find(objects, "ClusterRole", "checkpoint-controlplane-view")
    edit = find(objects, "ClusterRole", "checkpoint-controlplane-edit")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if v == "true"} == {
        aggregate + "view"}
    assert {k for k, v in edit["metadata"]["labels"].items() if v == "true"} == {
        aggregate + "edit", aggregate + "admin"}
    [read] = view["rules"]
    assert set(read["resources"]) == {plural for plural, *_ in CUSTOM_KINDS.values()}
    assert read["verbs"] == ["get", "list", "watch"]
    [write] = edit["rules"]
    assert "checkpointclasses" not in write["resources"]
    assert not [r for r in write["resources"] if "/" in r]  # status: the workers' alone
