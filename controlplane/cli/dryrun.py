"""``--dry-run`` for the operation verbs: print the plan (``app.plan``), change nothing,
and exit as the real verb would (2: refused)."""

from __future__ import annotations

from controlplane.cli import render
from controlplane.engine.jsonvalue import JsonObject, JsonValue


def print_plan(doc: JsonObject, output: str) -> int:
    """Print the plan; 0 when it would be accepted, 2 when refused."""
    if output in ("json", "yaml"):
        render.structured(doc, output)
    else:
        _print(doc)
    return 2 if doc.get("refused") else 0


def _print(doc: JsonObject) -> None:
    print(f"DRY RUN: nothing is changed. {doc['operation']}:")
    if doc.get("refused"):
        print(f"  refused: {doc['refused']}")
        return
    for key in ("pod", "uid", "node", "source_node", "target_node", "restore_path",
                "admission"):
        if doc.get(key) is not None:
            print(f"  {key.replace('_', ' ')}: {doc[key]}")
    if isinstance(doc.get("effective_parallel"), int):
        capped = doc.get("capped_by")
        print(f"  at most {doc['effective_parallel']} at a time"
              + (f" ({capped} caps --max-parallel {doc.get('max_parallel')})" if capped
                 else ""))
    for warning in doc.get("warnings") or []:  # type: ignore[union-attr]
        print(f"  warning: {warning}")
    for key in ("would", "records", "artifacts_read", "artifacts_written"):
        values = doc.get(key)
        if isinstance(values, list) and values:
            print(f"  {key.replace('_', ' ')}:")
            for value in values:
                print(f"    - {value}")
    moves = _rows(doc.get("moves"))
    if moves:
        print("moves:")
        render.table(["pod", "target", "how", "why"],
                     [(m.get("pod"), m.get("target"), m.get("how", "-"), m.get("why"))
                      for m in moves], max_width=100)
    left = _rows(doc.get("left"))
    if left:
        print("left alone (refused):")
        render.table(["pod", "reason"], [(x.get("pod"), x.get("reason")) for x in left],
                     max_width=100)


def _rows(value: JsonValue) -> list[dict[str, JsonValue]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
