"""``cpctl`` entry point: the parser, and the one place errors become exit codes.

Exit codes: 0 ok; 1 operation failed; 2 bad input (flags, ids, specs — the message
names the field); 3 database unreachable or schema not ready; 4 ``db current``: schema
behind; 5 replay found mismatches; 70 internal error (a bug: set CONTROLPLANE_DEBUG=1
for the traceback); 130 interrupted.

Parsing imports no verb: each verb's handler is named in :data:`HANDLERS` and imported
when that verb runs, so ``cpctl --help`` and ``cpctl VERB --help`` load none of the
store, driver or HTTP stacks (tests/cli/test_startup_imports.py pins which
modules stay out, ``python -m bench.cli_startup`` times it). The modules the parser does
import (``options``, ``classes``, ``checkpoints``, ``history``, ``sim``, ``webhook``,
``plugin``, ``completion``) import their heavy dependencies inside the functions that use
them. Run as ``kubectl-checkpoint`` (kubectl's plugin), it takes kubectl's flags and says
``kubectl checkpoint`` (``cli/plugin.py``); ``cpctl __complete WORDS`` answers the shells'
completion (``cli/completion.py``).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from controlplane.cli import checkpoints as checkpoints_module
from controlplane.cli import completion, plugin
from controlplane.cli import retention as retention_verbs
from controlplane.cli import sim as sim_module
from controlplane.cli.classes import add_class_options
from controlplane.cli.options import (
    add_cluster_options,
    default_url,
    instant_flag,
    positive_float,
    positive_int,
)
from controlplane.cli.webhook import add_webhook_parser
from controlplane.errors import ControlPlaneError, UsageError

Handler = Callable[[argparse.Namespace], Awaitable[int]]

#: ``controlplane.machines.config.modes.MigrationMode``, spelled here so that parsing
#: imports no verb (tests/machines/test_modes.py keeps the two equal).
MIGRATION_MODES = ("stop-and-copy", "precopy", "lazy")
_CLUSTER_VERBS = "controlplane.cli.cluster"
#: The function that runs each verb, as ``module:function``; imported when the verb runs.
HANDLERS = {
    "db upgrade": "controlplane.cli.database:db_upgrade",
    "db current": "controlplane.cli.database:db_current",
    "submit": "controlplane.cli.submit:submit_cmd",
    "get": "controlplane.cli.reading:get_cmd",
    "history": "controlplane.cli.reading:history_cmd",
    "list": "controlplane.cli.reading:list_cmd",
    "cancel": "controlplane.cli.control:cancel_cmd",
    "retarget": "controlplane.cli.control:retarget_cmd",
    "wait": "controlplane.cli.reading:wait_cmd",
    "wake": "controlplane.cli.control:wake_cmd",
    "report": "controlplane.cli.reports:report_cmd",
    "replay": "controlplane.cli.replay:replay_cmd",
    "worker": "controlplane.cli.worker:worker_cmd",
    "serve": "controlplane.cli.serve:serve_cmd",  # aiohttp
    **dict.fromkeys(("checkpoint", "migrate", "suspend", "resume", "restore", "drain"),
                    f"{_CLUSTER_VERBS}:operation_cmd"),  # the drivers
    "checkpoints": "controlplane.cli.checkpoints:checkpoints_cmd",
}


@dataclass(frozen=True)
class Lazy:
    """A verb's handler named by ``module:function``, imported when it is called."""

    target: str

    def resolve(self) -> Handler:
        module, _, name = self.target.partition(":")
        handler: Handler = getattr(importlib.import_module(module), name)
        return handler

    def __call__(self, args: argparse.Namespace) -> Awaitable[int]:
        return self.resolve()(args)


EPILOG = """\
exit codes: 0 ok, 1 failed, 2 bad input, 3 database unreachable or schema not ready,
4 schema behind (db current), 5 replay mismatches, 70 internal error, 130 interrupted.
The database is --db, else $CONTROLPLANE_DATABASE_URL, else sqlite:///var/controlplane.db.
"""


#: The flags of the README's walkthrough ("Using cpctl"), so an example runs as it reads.
_CLUSTER = "--kubeconfig var/kube.yaml --registry-layout var/oci"
#: What ``cpctl VERB --help`` shows after the options: the verb in use.
EXAMPLES = {
    "checkpoint": f"""examples:
  cpctl checkpoint default/web --repository localhost:5000/ckpt --wait {_CLUSTER}
  cpctl checkpoint default/db --quiesce --repository localhost:5000/ckpt  # stays stopped
""",
    "migrate": f"""examples:
  cpctl migrate default/web --to node-2 --repository localhost:5000/ckpt --wait {_CLUSTER}
  cpctl migrate default/web --to node-2 --repository localhost:5000/ckpt --dry-run
  cpctl history ID        # what happened, phase by phase, with the facts behind each step
exit: 0 when it succeeded (with --wait), 1 when it ended otherwise, 2 on bad input.
""",
    "suspend": """examples:
  cpctl suspend default/sandbox --repository localhost:5000/ckpt --wait
  cpctl resume default/sandbox --wait      # from where the suspend put its checkpoint
""",
    "resume": """examples:
  cpctl resume default/sandbox --wait                # the suspension's own class
  cpctl resume default/sandbox --node node-3 --class fast --classes-file classes.yaml
""",
    "drain": """examples:
  cpctl drain node-1 --repository localhost:5000/ckpt --dry-run     # the plan, nothing done
  cpctl drain node-1 --to node-2 --max-parallel 4 --max-per-node 4 --repository r.io/c
  # 4 at once needs --max-per-node 4 here and on the workers (default 2 caps it)
  cpctl drain node-1 --selector app=web,tier!=db --repository localhost:5000/ckpt
  cpctl cancel ID      # no new children; running ones finish; the node is uncordoned
""",
    "restore": """examples:
  cpctl restore CHECKPOINT_OPERATION_ID --node node-2 --name web-copy --wait
  cpctl restore CHECKPOINT_OPERATION_ID --node node-2 --dry-run
""",
    "list": """examples:
  cpctl list --active                      # everything still in flight
  cpctl list --kind migration --node node-1 --since 2026-11-22T00:00:00Z
  cpctl list --namespace payments -o json
""",
    "history": """examples:
  cpctl history ID             # time, phase change, event, reason, worker, facts (why)
  cpctl history ID --wide      # the same, nothing cut to fit the terminal
  cpctl history ID -o json     # the same, one object per event, with "phase"
  cpctl history prune --keep-days 90 --archive /backup/history   # see its --help
  cpctl history import /backup/history   # put archived (pruned) operations back
""",
    "report": """examples:
  cpctl report migrations --by node        # p50 of each phase, bytes moved, success rate
  cpctl report checkpoints --by class -o csv > checkpoints.csv
  cpctl report operations --by day --since 2026-11-01T00:00:00Z
  cpctl report drains                      # each drain: children moved, failed, why
The views behind it are plain SQL: docs/reporting.md.
""",
    "replay": """examples:
  cpctl replay --verify        # projections and every recorded decision must reproduce
  cpctl replay --rebuild       # rewrite projections from the events (events win)
  cpctl replay --jobs 4        # check with 4 processes (a large history, spare cores)
""",
    "worker": """examples:
  cpctl worker --kubeconfig ~/.kube/config --registry-plain-http localhost:5000
  cpctl worker --in-cluster --metrics-listen 0.0.0.0:9090     # as deploy/ runs it
Run as many as you like against one PostgreSQL: they share work through leases.
""",
    "cancel": """examples:
  cpctl cancel ID     # a migration whose source is gone is restored where it was
""",
    "wait": """examples:
  id=$(cpctl checkpoint default/web --repository localhost:5000/ckpt) && cpctl wait "$id"
""",
    "retarget": """examples:
  cpctl retarget ID --to node-3
""",
}


#: ``cpctl --help`` lists these first, in this order (what people reach for first), the
#: plumbing after them.
FIRST_VERBS = ("migrate", "checkpoint", "suspend", "resume", "restore", "drain", "history",
               "list", "get", "wait", "cancel", "retarget", "checkpoints", "report", "demo")


class _Parser(argparse.ArgumentParser):
    #: How help and errors name the program: ``cpctl``, or ``kubectl checkpoint`` when run
    #: as kubectl's plugin (set on every parser by :func:`build_parser`).
    shown_as = plugin.CPCTL
    routes_history = False  # the top parser: `history prune|import` are verbs of their own

    def error(self, message: str) -> NoReturn:  # one line, exit 2, plus where to look
        sys.stderr.write(plugin.say(f"cpctl: error: {_unknown_verb(self, message) or message} "
                                    f"(see `{self.prog} --help`)\n", self.shown_as))
        raise SystemExit(2)

    def format_help(self) -> str:
        return plugin.say(super().format_help(), self.shown_as)

    def format_usage(self) -> str:
        return plugin.say(super().format_usage(), self.shown_as)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.routes_history:  # `history prune|import`: their own verbs (cli/retention.py)
            args = retention_verbs.route(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)


def _visible_verbs(parser: argparse.ArgumentParser) -> list[str]:
    """The verbs ``--help`` lists, in its order (not the internal ``history-*`` ones)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return [choice.dest for choice in action._choices_actions]
    return []


def _unknown_verb(parser: argparse.ArgumentParser, message: str) -> str | None:
    """argparse's "invalid choice" for the verb, said as a person would: the nearest
    verb, never the internal ones (``None``: another error)."""
    found = re.match(r"argument VERB: invalid choice: '(.*)' \(choose from", message)
    if found is None:
        return None
    asked, verbs = found.group(1), _visible_verbs(parser)
    near = difflib.get_close_matches(asked, verbs, n=1, cutoff=0.6)
    return (f"unknown verb {asked!r}" + (f": did you mean {near[0]!r}?" if near else
                                         f"; the verbs are {', '.join(verbs)}"))


def _first_verbs_first(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            rank = {name: i for i, name in enumerate(FIRST_VERBS)}
            action._choices_actions.sort(key=lambda c: rank.get(c.dest, len(rank)))


def _version() -> str:
    """The installed release (pyproject's ``version``), or where it could not be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("controlplane")
    except PackageNotFoundError:
        return "(not installed: run `make .venv/.installed`)"


def _shown_as(parser: argparse.ArgumentParser, name: str) -> None:
    """Name the program ``name`` in the help and errors of ``parser`` and its verbs."""
    if isinstance(parser, _Parser):
        parser.shown_as = name
    parser.prog = plugin.say(parser.prog, name)  # `cpctl history prune`'s own prog too
    sub = completion.subparsers(parser)
    for verb_parser in (sub.choices.values() if sub is not None else ()):
        _shown_as(verb_parser, name)


def build_parser(program: str = plugin.CPCTL) -> argparse.ArgumentParser:
    """The parser of ``cpctl`` (``program``: how help and errors call it)."""
    p = _Parser(prog=program, description="Checkpoint, restore and migrate Kubernetes "
                "workloads, with every operation kept as a durable, replayable history.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=default_url(), metavar="URL",
                   help="sqlite:///file.db or postgresql://user@host:5432/db")
    p.add_argument("--version", action="version", version=f"cpctl {_version()}",
                   help="print cpctl's release (CHANGELOG.md says what each changed) and exit")
    p.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                   default="warning")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser, metavar="VERB")

    def verb(name: str, text: str, handler: Handler | None = None) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=text, description=text, epilog=EXAMPLES.get(name),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(handler=handler or Lazy(HANDLERS[name]))
        return sp

    db = sub.add_parser("db", help="apply or check the database schema (Alembic)")
    dbsub = db.add_subparsers(dest="db_verb", required=True, parser_class=_Parser,
                              metavar="VERB")
    dbsub.add_parser("upgrade", help="apply every pending migration (safe to run twice, "
                     "safe to run from several replicas at once)").set_defaults(
        handler=Lazy(HANDLERS["db upgrade"]))
    dbsub.add_parser("current", help="print the schema revision; exit 4 if behind").set_defaults(
        handler=Lazy(HANDLERS["db current"]))

    s = verb("submit", "create an operation of KIND from a JSON spec; prints its id")
    s.add_argument("kind", help="operation kind, e.g. migration, checkpoint (steps: a self-test)")
    s.add_argument("--spec", default="{}", help="JSON object, or @file.json")
    s.add_argument("--id", help="operation id (default: a new UUID)")

    for name, text in [
        ("get", "show one operation's current state"),
        ("history", "show an operation's event timeline: time, event, the observed facts that "
         "caused it, and who recorded it"),
    ]:
        g = verb(name, text)
        g.add_argument("id", help="operation id, a unique prefix of it (4 characters or "
                       "more), or its end after … as the dashboard shows a drain's child")
        g.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
        _wide_option(g, "the reason is cut at 32 characters, and " if name == "history"
                     else "")

    ls = verb("list", "list operations, newest first")
    ls.add_argument("--kind", help="only operations of this kind: checkpoint, restore, "
                    "migration, suspend, resume, drain (or steps, the engine's self-test)")
    ls.add_argument("--phase", help="only operations in this phase, any case "
                    "(succeeded, Failed, RolledBack...; an unknown one lists them all)")
    ls.add_argument("--active", action="store_true",
                    help="only operations not yet settled (not terminal, or still "
                    "performing their last actions)")
    ls.add_argument("--node", help="only operations moving load off NODE or putting a "
                    "workload on it")
    ls.add_argument("--namespace", help="only operations on workloads in NAMESPACE")
    ls.add_argument("--since", type=instant_flag, help="created at or after this ISO time")
    ls.add_argument("--limit", type=positive_int, default=100, metavar="N",
                    help="show the newest N (default 100); the table says when more match, "
                    "and -o json|yaml carry {items, total, limit}")
    ls.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                    help="json/yaml: {\"items\": [...], \"total\": N, \"limit\": N}")
    ls.add_argument("--wide", action="store_true",
                    help="also the version, next wake, lease owner and creation time, every "
                    "value whole; by default the table fits the terminal's width, a cut "
                    "value ending in …")

    c = verb("cancel", "ask an operation to stop (recorded as an event): a migration whose "
             "source is already gone is restored where it was")
    c.add_argument("id")
    _wait_options(c, "follow the operation until it has stopped; exit 0 once it settles, "
                  "whatever its final phase (printed)", 600.0)
    rt = verb("retarget", "change a migration's target node: before the source is deleted "
              "it re-plans (back to the source node: wakes it in place); after, the restore "
              "goes to the new node")
    rt.add_argument("id")
    rt.add_argument("--to", required=True, metavar="NODE")
    _wait_options(rt, "follow the migration until it settles; exit 1 unless it succeeded",
                  600.0)

    wt = verb("wait", "follow an operation until it settles, as --wait does; exit 0 when "
              "it did what was asked, 1 otherwise")
    wt.add_argument("id", help="operation id (the first line a verb printed)")
    wt.add_argument("--wait-seconds", type=positive_float, default=600.0, metavar="S",
                    help="give up after S seconds (default 600) and exit 1: the operation "
                    "itself keeps running")

    w = verb("wake", "make operations due now, by operation id or by key (e.g. a pod UID), as "
             "a pod watch event does")
    group = w.add_mutually_exclusive_group(required=True)
    group.add_argument("--id")
    group.add_argument("--key")

    retention_verbs.add_parsers(sub)  # `cpctl history prune|import` (routed in main)

    rp = verb("report", "summarise operations, checkpoints or migrations from the "
              "reporting views: counts, success rate, p50/p95 seconds, bytes; migrations "
              "also the p50 of each phase (SQL: docs/reporting.md)")
    rp.add_argument("report", choices=["operations", "checkpoints", "migrations", "drains"],
                    help="drains: one row per drain (children moved, failed, in flight, "
                    "failures by reason; --by does not apply)")
    rp.add_argument("--by", choices=["kind", "node", "day", "class", "requester"],
                    default="kind", help="group by operation kind, source node, day, "
                    "checkpoint class, or who asked (user@host, token:NAME, drain:ID)")
    rp.add_argument("--since", type=instant_flag,
                    help="only those at or after this ISO time")
    rp.add_argument("-o", "--output", choices=["table", "json", "yaml", "csv"], default="table")
    _wide_option(rp)

    sv = verb("serve", "serve the HTTP API (OpenAPI at /api/v1/openapi.json), the "
              "dashboard at / and Prometheus metrics at /metrics; the token comes from "
              "--token-file or $CONTROLPLANE_API_TOKEN")
    sv.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                    help="where to listen (default 127.0.0.1:8080); an address other than "
                    "loopback needs --tls-cert/--tls-key or --insecure")
    sv.add_argument("--token-file", help="file holding the API token, or several as "
                    "'NAME: TOKEN' lines (history records the name of the one used)")
    sv.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate "
                    "(chain) ...")
    sv.add_argument("--tls-key", metavar="PEM", help="... and this private key")
    sv.add_argument("--insecure", action="store_true",
                    help="serve plain HTTP on a non-loopback address (e.g. behind a TLS "
                    "proxy): tokens would otherwise cross the network in clear text")
    sv.add_argument("--metrics-public", action="store_true",
                    help="serve /metrics without the token (for a Prometheus scraper)")
    add_cluster_options(sv)  # POST /api/v1/operations submits to this cluster, when given

    r = verb("replay", "check projections against events (default), rebuild them "
             "(--rebuild), and/or re-run every decision to prove determinism (--verify); "
             "exit 5 on any mismatch")
    r.add_argument("--rebuild", action="store_true", help="rewrite projections from events")
    r.add_argument("--verify", action="store_true", help="re-run decide on recorded inputs")
    r.add_argument("--jobs", type=positive_int, default=None,
                   help="rebuild (and verify) in this many processes, each over its own "
                   "range of operations (default: one per CPU, at most 8, for a history of "
                   "20,000 operations or more, else 1); progress goes to stderr on long runs")

    wk = verb("worker", "run a worker: claim due operations, decide, commit, act; SIGTERM "
              "drains in-flight work")
    wk.add_argument("--concurrency", type=positive_int, default=32)
    wk.add_argument("--lease-seconds", type=positive_float, default=30.0)
    wk.add_argument("--poll-seconds", type=positive_float, default=0.5)
    wk.add_argument("--worker-id")
    wk.add_argument("--status-seconds", type=float, default=60.0, metavar="S",
                    help="print what it did every S seconds while there is work (one 'idle' "
                    "line when there is none; 0: never); a last line as it stops")
    wk.add_argument("--upgrade-schema", action="store_true",
                    help="apply pending migrations first (guarded by a lock)")
    wk.add_argument("--until-done", action="store_true",
                    help="exit once every operation is settled (terminal, its actions "
                    "performed, its lease released)")
    wk.add_argument("--metrics-listen", metavar="HOST:PORT",
                    default=os.environ.get("CONTROLPLANE_WORKER_METRICS_LISTEN"),
                    help="serve this worker's own /metrics (lease losses, conflicts, "
                    "transitions, action failures) and /healthz for a liveness probe "
                    "($CONTROLPLANE_WORKER_METRICS_LISTEN)")
    wk.add_argument("--history-keep-days", action="append", default=[], metavar="[KIND=]N",
                    help="prune the history of operations settled more than N days ago "
                    "(KIND=N for one kind; repeat), hourly and at start, as `cpctl history "
                    "prune --keep-days` does (and then a class's history_keep_days too). "
                    "Default: never prune")
    wk.add_argument("--no-front-door", action="store_true",
                    help="do not watch the custom resources (Checkpoint, Migration, Drain... "
                    "of checkpoint.controlplane.dev: docs/resources.md); by default a worker "
                    "with a cluster opens the front door once the CRDs are installed")
    wk.add_argument("--classes-file", default=os.environ.get("CONTROLPLANE_CLASSES_FILE"),
                    metavar="FILE",
                    help="classes the resources' spec.className may name when no "
                    "CheckpointClass of that name exists ($CONTROLPLANE_CLASSES_FILE)")
    add_cluster_options(wk)

    for name, kind, text in [
        ("checkpoint", "checkpoint", "checkpoint a pod into an OCI artifact (the workload "
         "keeps running unless --quiesce)"),
        ("migrate", "migration", "move a pod to another node: checkpoint, delete the "
         "source, restore on the target, verify, collect the artifact (a ReplicaSet's pod "
         "is restored beside its source and adopted by the ReplicaSet; a StatefulSet's is "
         "restored into the successor its controller recreates, held by the webhook's "
         "scheduling gate: docs/owners.md)"),
        ("suspend", "suspend", "checkpoint a pod and delete it, keeping its spec and checkpoint"),
        ("resume", "resume", "restore a suspended pod from its latest checkpoint"),
    ]:
        op = verb(name, text + "; prints the operation id")
        op.set_defaults(kind=kind)  # the operation kind the verb asks for
        op.add_argument("workload", metavar="NAMESPACE/POD")
        add_class_options(op)
        if name == "migrate":
            op.add_argument("--to", required=True, metavar="NODE", help="target node")
            op.add_argument("--name", default=None, metavar="POD",
                            help="name of the restored bare pod (default: the source's own "
                                 "name, taken once the source is gone; a controller's pod "
                                 "is named by its controller)")
            op.add_argument("--keep-checkpoint", action="store_true",
                            help="keep the checkpoint in the registry after the verified "
                                 "restore (default: the class's retention decides)")
            op.add_argument("--mode", default=None, choices=MIGRATION_MODES,
                            help="how memory moves: 'stop-and-copy' freezes the pod, dumps "
                                 "it whole and restores it; 'precopy' copies memory while it "
                                 "runs, then a short last dump (needs the source kernel's "
                                 "dirty-page tracking: refused before anything is frozen "
                                 "where it is off); 'lazy' dumps all but memory, runs the "
                                 "pod on the target at once and fetches its pages after "
                                 "(agent nodes with the handoff key, unsealed classes; a "
                                 "lost transfer loses the workload: docs/runtime.md). "
                                 "Default: the class's migration_mode, "
                                 "else stop-and-copy")
        if name == "checkpoint":
            op.add_argument("--quiesce", action="store_true",
                            help="leave the workload stopped after the capture")
        if name == "resume":
            op.add_argument("--node", help="node to resume on (default: where it fits)")
        _wait_options(op, "follow the operation until it settles; exit 1 unless it "
                      "succeeded", 600.0)
        if name in ("migrate", "suspend"):
            _dry_run_options(op)
        add_cluster_options(op)

    ck = verb("checkpoints", "list the checkpoints there are to restore "
              "from (cpctl restore ID, cpctl resume), newest first")
    checkpoints_module.add_arguments(ck)

    rs = verb("restore", "restore a checkpoint's artifact onto a node as a new "
              "pod (CHECKPOINT: a checkpoint or suspend operation id); prints the operation "
              "id")
    rs.set_defaults(kind="restore")
    rs.add_argument("checkpoint", metavar="CHECKPOINT")
    rs.add_argument("--node", required=True, metavar="NODE", help="node to restore on")
    rs.add_argument("--name", help="name of the new pod (default: POD-restored-ID)")
    _wait_options(rs, "follow the restore until it settles; exit 1 unless it succeeded",
                  600.0)
    _dry_run_options(rs)
    add_cluster_options(rs)

    dr = verb("drain", "empty a node: cordon it, plan a target for each pod it can "
              "move, and migrate them, at most --max-parallel at a time, as one durable "
              "operation; prints its id")
    dr.set_defaults(kind="drain")
    dr.add_argument("node", metavar="NODE")
    dr.add_argument("--to", action="append", metavar="NODE",
                    help="target node (repeat for several; default: every node that fits)")
    dr.add_argument("--selector", metavar="LABELS",
                    help="only pods with these labels (k=v,k!=v,k)")
    dr.add_argument("--max-parallel", type=positive_int, default=None,
                    help="child migrations in flight at once (default 4), but never more "
                    "than --max-per-node (default 2) or --max-operations allow: the plan "
                    "says which caps it, and warns")
    add_class_options(dr)
    _wait_options(dr, "follow the drain until every child settles; exit 1 unless all "
                  "moved", 1800.0)
    _dry_run_options(dr)
    add_cluster_options(dr)

    sim = sub.add_parser("sim", help="run a simulated Kubernetes cluster on loopback")
    simsub = sim.add_subparsers(dest="sim_verb", required=True, parser_class=_Parser,
                                metavar="VERB")
    sim_module.add_up_parser(simsub)
    sim_module.add_nodes_parser(simsub)
    add_webhook_parser(sub, _Parser)

    d = verb("demo", "run the product end to end on the embedded default (SQLite + "
             "simulated cluster + node agents + OCI layout on disk): checkpoint, migrate "
             "with a marker, suspend and resume; print history and a report", _demo)
    d.add_argument("--workdir", default="var/demo",
                   help="where the demo keeps its database and registry (recreated)")
    d.add_argument("--runtime", choices=("sim", "criu"), default="sim",
                   help="sim (default): the simulated cluster, workload state a marker; "
                        "criu: real containers (podman + runc) on emulated nodes, a real "
                        "process migrated and suspended/resumed with CRIU, its memory "
                        "proven by its own counter (needs scripts/ensure-criu and "
                        "scripts/ensure-registry; about a minute)")
    cm = verb("completion", "print a shell completion script for cpctl and "
              "kubectl-checkpoint (docs/kubectl.md): source <(cpctl completion bash)",
              completion.completion_cmd)
    cm.add_argument("shell", choices=completion.SHELLS)
    _first_verbs_first(p)
    p.routes_history = True
    if program != plugin.CPCTL:
        _shown_as(p, program)
    return p


async def _demo(args: argparse.Namespace) -> int:
    if args.runtime == "criu":
        from controlplane.cli.demo_criu import criu_demo  # podman and CRIU: only when asked
        return await criu_demo(args)
    from controlplane.cli.demo import demo_cmd

    return await demo_cmd(args)


def _wait_options(p: argparse.ArgumentParser, what: str, seconds: float) -> None:
    p.add_argument("--wait", action="store_true",
                   help=what + " (on a terminal one progress line is redrawn; otherwise a "
                   "line per change)")
    p.add_argument("--wait-seconds", type=positive_float, default=seconds, metavar="S",
                   help=f"with --wait, give up after S seconds (default {seconds:.0f}) and "
                   "exit 1: the operation itself keeps running")


def _wide_option(p: argparse.ArgumentParser, cut: str = "") -> None:
    p.add_argument("--wide", action="store_true",
                   help=f"print every value whole; by default {cut}the table fits the "
                   "terminal's width, a cut value ending in …")


def _dry_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (pods, targets and why, artifacts written and "
                   "deleted, what would be refused) and change nothing")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                   help="how --dry-run prints the plan")


def main(argv: Sequence[str] | None = None) -> int:
    """``cpctl``, and ``kubectl-checkpoint`` (the same program run by kubectl: kubectl's
    flags are taken off the line, :mod:`controlplane.cli.plugin`)."""
    name = plugin.shown_name(sys.argv[0])
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == [completion.HIDDEN_VERB]:  # the shell scripts' TAB
        return completion.answer(build_parser(name), words[1:], kubectl=plugin.is_kubectl(name))
    try:
        flags = None
        if plugin.is_kubectl(name):
            words, flags = plugin.take_flags(words)
        args = build_parser(name).parse_args(words)
        if flags is not None:
            plugin.apply(args, flags)
    except UsageError as exc:
        sys.stderr.write(plugin.say(f"cpctl: error: {exc}\n", name))
        return exc.exit_code
    import asyncio  # after parsing: --help and bad input exit before needing either

    from controlplane import logs

    logs.configure(args.log_format, args.log_level)
    try:
        code: int = asyncio.run(args.handler(args))
        return code
    except ControlPlaneError as exc:
        sys.stderr.write(plugin.say(f"cpctl: error: {exc}\n", name))
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(plugin.say("cpctl: interrupted\n", name))
        return 130
    except Exception as exc:
        if os.environ.get("CONTROLPLANE_DEBUG"):
            raise
        sys.stderr.write(plugin.say(
            f"cpctl: internal error: {type(exc).__name__}: {exc} (this is a bug; rerun with "
            "CONTROLPLANE_DEBUG=1 for the traceback)\n", name))
        return 70


def kubectl_complete() -> int:
    """``kubectl_complete-checkpoint WORDS...``: what kubectl (1.26+) runs for
    ``kubectl checkpoint <TAB>`` (:mod:`controlplane.cli.completion`)."""
    return completion.answer(build_parser(plugin.shown_name(plugin.EXECUTABLE)),
                             sys.argv[1:], kubectl=True)


if __name__ == "__main__":
    raise SystemExit(main())
