"""How long ``evolve`` takes per recorded event: every history of a database, folded in
memory, best of several rounds.

``python -m bench.fold [--db PATH] [--rounds N] [--repeat N]`` (default: the golden
``tests/golden/todays_rows.sqlite``, every product kind). Only the fold is timed: the rows
are read and their JSON parsed once, before. Compare two trees with the same database,
``PYTHONPATH=<tree> python -m bench.fold``, alternately. Measured when events became
typed: 4.6 us an event before, 6.6 after (decoding each event into its class).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path

from controlplane.engine.decider import Event
from controlplane.machines.catalog import default_kinds

GOLDEN = Path(__file__).parent.parent / "tests" / "golden" / "todays_rows.sqlite"


def histories(path: Path) -> dict[str, tuple[str, list[Event]]]:
    """Machine id -> (kind, events in seq order), read once."""
    # immutable: a read that leaves no -wal/-shm beside a checked-in database
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        out: dict[str, tuple[str, list[Event]]] = {}
        for machine_id, kind in conn.execute("SELECT id, kind FROM machines"):
            rows = conn.execute("SELECT type, data FROM events WHERE machine_id = ? "
                                "ORDER BY seq", (machine_id,)).fetchall()
            out[machine_id] = (kind, [Event(t, json.loads(d)) for t, d in rows])
        return out
    finally:
        conn.close()


def fold_seconds(machines: dict[str, tuple[str, list[Event]]], repeat: int) -> float:
    kinds = default_kinds()
    started = time.perf_counter()
    for _ in range(repeat):
        for machine_id, (kind, events) in machines.items():
            decider = kinds.get(kind)
            spec = events[0].data["spec"]
            assert isinstance(spec, dict)
            state = decider.initial_state(machine_id, spec)
            for event in events[1:]:
                state = decider.evolve(state, event)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=GOLDEN, help="a SQLite database")
    parser.add_argument("--rounds", type=int, default=5, help="keep the best of N")
    parser.add_argument("--repeat", type=int, default=400, help="folds per round")
    args = parser.parse_args()
    machines = histories(args.db)
    events = sum(len(e) - 1 for _, e in machines.values())
    best = min(fold_seconds(machines, args.repeat) for _ in range(args.rounds))
    print(f"{best / (args.repeat * events) * 1e6:.2f} us per event "
          f"({len(machines)} machines, {events} events, x{args.repeat}, best of {args.rounds})")


if __name__ == "__main__":
    main()
