"""PostgreSQL fast paths for group commits: constant statements over arrays (``unnest``).

A statement built per batch (``UPDATE ... FROM (VALUES ...)``) is compiled per batch,
and that compilation was the worker's main CPU cost. These statements never change:
SQLAlchemy compiles each once, asyncpg prepares each once, and a batch travels as a
handful of array parameters. Each row keeps its own guard (version, lease token, lease
expiry); the ids whose guard held come back from ``RETURNING``.

Called by ``event_store.commit_many_txn`` and ``leases.release_many_txn`` on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store.database import json_dumps

_UPDATE_LEASED = text("""
UPDATE machines AS m
SET version = v.version, phase = v.phase, state = v.state::jsonb, state_z = v.state_z,
    terminal = v.terminal, updated_at = v.now, pending_actions = v.pending::jsonb
FROM unnest(CAST(:ids AS varchar[]), CAST(:expected AS int[]), CAST(:tokens AS varchar[]),
            CAST(:nows AS timestamptz[]), CAST(:versions AS int[]),
            CAST(:phases AS varchar[]), CAST(:states AS text[]), CAST(:state_zs AS bytea[]),
            CAST(:terminals AS boolean[]), CAST(:pendings AS text[]))
     AS v(id, expected, token, now, version, phase, state, state_z, terminal, pending)
WHERE m.id = v.id AND m.version = v.expected AND m.lease_token = v.token
  AND m.lease_expires_at > v.now
RETURNING m.id
""")

_INSERT_EVENTS = text("""
INSERT INTO events (machine_id, seq, type, data, facts, facts_z, recorded_at, worker_id,
                    cause, input_z)
SELECT machine_id, seq, type, data::json, facts::json, facts_z, recorded_at, worker_id,
       cause, input_z
FROM unnest(CAST(:machine_ids AS varchar[]), CAST(:seqs AS int[]), CAST(:types AS varchar[]),
            CAST(:datas AS text[]), CAST(:factss AS text[]), CAST(:facts_zs AS bytea[]),
            CAST(:recorded AS timestamptz[]), CAST(:workers AS varchar[]),
            CAST(:causes AS varchar[]), CAST(:input_zs AS bytea[]))
     AS e(machine_id, seq, type, data, facts, facts_z, recorded_at, worker_id, cause, input_z)
""")

_RELEASE = text("""
UPDATE machines AS m
SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    pending_actions = '[]'::jsonb,
    next_wake_at = CASE WHEN m.terminal THEN NULL
                        WHEN m.wake_seq <> v.wake_seq THEN v.now
                        ELSE v.wake_at END,
    attempts = CASE WHEN v.reset THEN 0 ELSE m.attempts END
FROM unnest(CAST(:ids AS varchar[]), CAST(:tokens AS varchar[]), CAST(:wake_seqs AS int[]),
            CAST(:nows AS timestamptz[]), CAST(:wake_ats AS timestamptz[]),
            CAST(:resets AS boolean[]))
     AS v(id, token, wake_seq, now, wake_at, reset)
WHERE m.id = v.id AND m.lease_token = v.token
RETURNING m.id
""")


_DELETE_KEYS = text("""
DELETE FROM machine_keys WHERE machine_id = ANY(CAST(:ids AS varchar[]))
""")

_INSERT_KEYS = text("""
INSERT INTO machine_keys (key, machine_id)
SELECT key, machine_id
FROM unnest(CAST(:keys AS varchar[]), CAST(:machine_ids AS varchar[])) AS k(key, machine_id)
""")

# A new machine with its first events (the first carrying its decision record) and its
# wake keys: one round trip instead of three, inside the admission lock (submission was
# 8 statements). The child rows' foreign keys are checked at the end of the statement,
# after the machine.
_CREATE_MACHINE = text("""
WITH new_machine AS (
  INSERT INTO machines (id, kind, phase, version, spec, state, state_z, terminal,
                        pending_actions, wake_seq, attempts, created_at, updated_at,
                        workload, source_node, held, next_wake_at)
  VALUES (:id, :kind, :phase, :version, CAST(:spec AS json), CAST(:state AS jsonb),
          CAST(:state_z AS bytea), :terminal, '[]'::jsonb, 0, 0, CAST(:now AS timestamptz),
          CAST(:now AS timestamptz),
          :workload, :source_node, :held, CAST(:next_wake_at AS timestamptz))
), new_events AS (
  INSERT INTO events (machine_id, seq, type, data, facts, facts_z, recorded_at, worker_id,
                      cause, input_z)
  SELECT :id, seq, type, data::json, facts::json, facts_z, CAST(:now AS timestamptz),
         :worker, cause, input_z
  FROM unnest(CAST(:seqs AS int[]), CAST(:types AS varchar[]), CAST(:datas AS text[]),
              CAST(:factss AS text[]), CAST(:facts_zs AS bytea[]),
              CAST(:causes AS varchar[]), CAST(:input_zs AS bytea[]))
       AS e(seq, type, data, facts, facts_z, cause, input_z)
)
INSERT INTO machine_keys (key, machine_id)
SELECT key, :id FROM unnest(CAST(:keys AS varchar[])) AS k(key)
""")

_json = json_dumps


async def update_leased(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Rows: id, expected, token, now, version, phase, state, terminal, pending."""
    params = {
        "ids": [r["id"] for r in rows], "expected": [r["expected"] for r in rows],
        "tokens": [r["token"] for r in rows], "nows": [r["now"] for r in rows],
        "versions": [r["version"] for r in rows], "phases": [r["phase"] for r in rows],
        "states": [_json(r["state"]) for r in rows],
        "state_zs": [r["state_z"] for r in rows],
        "terminals": [r["terminal"] for r in rows],
        "pendings": [_json(r["pending"]) for r in rows],
    }
    return set((await conn.execute(_UPDATE_LEASED, params)).scalars())


async def insert_events(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Rows as ``event_store.event_rows_of`` builds them."""
    await conn.execute(_INSERT_EVENTS, {
        "machine_ids": [r["machine_id"] for r in rows], "seqs": [r["seq"] for r in rows],
        "types": [r["type"] for r in rows], "datas": [_json(r["data"]) for r in rows],
        "factss": [_json(r["facts"]) for r in rows],
        "facts_zs": [r["facts_z"] for r in rows],
        "recorded": [r["recorded_at"] for r in rows],
        "workers": [r["worker_id"] for r in rows],
        "causes": [r["cause"] for r in rows], "input_zs": [r["input_z"] for r in rows],
    })


async def release(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Rows: id, token, wake_seq, now, wake_at, reset."""
    params = {
        "ids": [r["id"] for r in rows], "tokens": [r["token"] for r in rows],
        "wake_seqs": [r["wake_seq"] for r in rows], "nows": [r["now"] for r in rows],
        "wake_ats": [r["wake_at"] for r in rows], "resets": [r["reset"] for r in rows],
    }
    return set((await conn.execute(_RELEASE, params)).scalars())


async def replace_keys(conn: AsyncConnection, keys: dict[str, frozenset[str]]) -> None:
    """Set each machine's wake keys (machine id -> keys) in two statements for the batch,
    not two per machine (those were 6 of a migration's 13 statements)."""
    if not keys:
        return
    await conn.execute(_DELETE_KEYS, {"ids": list(keys)})
    rows = [(key, machine_id) for machine_id, ks in keys.items() for key in sorted(ks)]
    if rows:
        await conn.execute(_INSERT_KEYS, {"keys": [k for k, _ in rows],
                                          "machine_ids": [i for _, i in rows]})


async def create_machine(conn: AsyncConnection, machine: dict[str, Any],
                         events: Sequence[dict[str, Any]], keys: Sequence[str]) -> None:
    """Machine: id, kind, phase, version, spec, state, state_z, terminal, now, workload,
    source_node, held, next_wake_at, worker. Events (seq 1...) as
    ``event_store.event_rows_of`` builds them. Raises ``IntegrityError`` as the three
    inserts would."""
    await conn.execute(_CREATE_MACHINE, {
        **machine, "spec": _json(machine["spec"]), "state": _json(machine["state"]),
        "seqs": [e["seq"] for e in events], "types": [e["type"] for e in events],
        "datas": [_json(e["data"]) for e in events],
        "factss": [_json(e["facts"]) for e in events],
        "facts_zs": [e["facts_z"] for e in events], "causes": [e["cause"] for e in events],
        "input_zs": [e["input_z"] for e in events], "keys": list(keys),
    })
