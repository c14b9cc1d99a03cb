"""Train the zstd dictionary that ``controlplane/store/codec.py`` compresses history with.

``python -m bench.train_history_dictionary --postgres postgresql://postgres@127.0.0.1/cp_bench_scale``
reads sample rows — the facts, data, decision inputs and states — from two sources:

- ``tests/golden/todays_rows.sqlite``: every product kind (checkpoint, migration,
  suspend, resume, restore, a cancelled migration, a drain with its children);
- a ``bench.scale`` database (``python -m bench.scale --migrations 1000 --nodes 100``):
  migrations at scale, of which the first ``--machines`` (100) are used;

and writes an 8 KiB dictionary to ``--out`` (required, and never the shipped
``history_v1.zdict``: the codec pins that file by its SHA-256). Dictionary v1 was
trained this way on 2026-11-25 and is fixed: changing the file would make the rows
compressed with it unreadable. A retrained dictionary is a new format (v2) in the
codec, with v1 kept for old rows.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import orjson
import psycopg
import zstandard

from controlplane.store import codec

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "todays_rows.sqlite"
QUERIES = (
    "SELECT machine_id, facts FROM events",
    "SELECT machine_id, data FROM events",
    "SELECT machine_id, input FROM decisions",
    "SELECT id, state FROM machines",
)


def golden_samples() -> list[bytes]:
    conn = sqlite3.connect(GOLDEN)
    try:
        return [orjson.dumps(json.loads(value)) for sql in QUERIES
                for _, value in conn.execute(sql)]
    finally:
        conn.close()


def postgres_samples(url: str, machines: int) -> list[bytes]:
    with psycopg.connect(url) as conn:
        ids = {r[0] for r in conn.execute(
            "SELECT id FROM machines ORDER BY id LIMIT %s", (machines,))}
        return [orjson.dumps(value) for sql in QUERIES
                for machine_id, value in conn.execute(sql) if machine_id in ids]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--postgres", required=True, help="URL of a bench.scale database")
    p.add_argument("--machines", type=int, default=100)
    p.add_argument("--size", type=int, default=8192, help="dictionary bytes (8 KiB: "
                   "larger ones compressed bench.scale's rows worse, not better)")
    p.add_argument("--out", type=Path, required=True,
                   help="where to write the new dictionary (a candidate v2, not v1's file)")
    args = p.parse_args()
    if args.out.resolve() == codec.DICTIONARY_V1.resolve():
        p.error(f"--out {args.out} is dictionary v1, which never changes (rows compressed "
                "with it would become unreadable); write a v2 candidate elsewhere")
    samples: list[bytes | bytearray | memoryview] = [*golden_samples()]
    samples += postgres_samples(args.postgres, args.machines)
    trained = zstandard.train_dictionary(args.size, samples)
    args.out.write_bytes(trained.as_bytes())
    print(f"{args.out}: {len(trained.as_bytes())} bytes from {len(samples)} samples")


if __name__ == "__main__":
    main()
