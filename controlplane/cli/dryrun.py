"""``--dry-run`` for ``migrate``, ``suspend`` and ``restore``: print the plan
(``app.plan``), change nothing, and exit as the real verb would (2: refused)."""

from __future__ import annotations

from controlplane.app.plan import plan_operation
from controlplane.cli import render
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.submission import Limits
from controlplane.store.database import Database
from controlplane.worker.ports import Observer


async def dry_run(db: Database, observer: Observer, *, kind: str, spec: JsonObject,
                  limits: Limits, output: str) -> int:
    """Validate and print the plan; 0 when it would be accepted, 2 when refused."""
    doc = await plan_operation(db, observer, kind=kind, spec=spec, limits=limits)
    _print(doc, output)
    return 2 if doc.get("refused") else 0


def _print(doc: JsonObject, output: str) -> None:
    if output in ("json", "yaml"):
        render.structured(doc, output)
        return
    print(f"DRY RUN: nothing is changed. {doc['operation']}:")
    if doc.get("refused"):
        print(f"  refused: {doc['refused']}")
        return
    for key in ("pod", "uid", "source_node", "target_node", "why", "restore_path",
                "admission"):
        if doc.get(key) is not None:
            print(f"  {key.replace('_', ' ')}: {doc[key]}")
    for key in ("artifacts_read", "artifacts_written", "artifacts_deleted", "would"):
        values = doc.get(key)
        if isinstance(values, list) and values:
            print(f"  {key.replace('_', ' ')}:")
            for value in values:
                print(f"    - {value}")
