"""``cpctl submit``: create a machine of any kind from a JSON spec (the engine's own
``steps`` workload; the product kinds have their verbs: ``cpctl checkpoint``, ``migrate``...)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from controlplane.cli.context import clock, opened, requester
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.engine.jsonvalue import JsonObject


def parse_spec(text: str) -> JsonObject:
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read spec file {text[1:]!r}: {exc.strerror}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--spec is not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}", hint='e.g. --spec \'{"steps": 6}\'') from None
    if not isinstance(spec, dict):
        raise UsageError("--spec must be a JSON object", hint='e.g. --spec \'{"steps": 6}\'')
    return spec


#: Kinds ``submit`` takes as raw specs. The product kinds go through their own verbs,
#: which read the pod from the cluster and validate against it.
RAW_KINDS = ("steps",)


PRODUCT_VERBS = {"checkpoint": "checkpoint", "migration": "migrate", "suspend": "suspend",
                 "resume": "resume", "restore": "resume"}


async def submit_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.operations import submit
    from controlplane.clock import new_id
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import migrate

    if args.kind in default_kinds() and args.kind not in RAW_KINDS:
        raise UsageError(f"{args.kind} operations are submitted with their own verb, which "
                         "reads the pod from the cluster and validates the request",
                         hint=f"use `cpctl {PRODUCT_VERBS.get(args.kind, args.kind)} "
                         "NAMESPACE/POD ...` (see its --help)")
    spec = parse_spec(args.spec)
    async with opened(args) as db:
        await migrate.require_current(db)
        machine_id = await submit(db, default_kinds(), kind=args.kind, spec=spec,
                                  machine_id=args.id or new_id(), now=clock.now(),
                                  requester=requester(args))
    print(machine_id)
    return 0
