"""Which in-flight migration awaits a StatefulSet's successor pod (``namespace/name``).

Called by the admission webhook (``controlplane.api.webhook``) for every pod a StatefulSet
creates: the answer decides whether the new pod is held by the restore scheduling gate.
"""

from __future__ import annotations

from sqlalchemy import select

from controlplane.machines.migration.state import GATED
from controlplane.machines.migration.state import KIND as MIGRATION
from controlplane.store import schema
from controlplane.store.database import Database
from controlplane.store.session import read_txn

m = schema.machines


async def awaiting_successor(db: Database, namespace: str, name: str) -> str | None:
    """The id of the live migration of ``namespace/name`` that claims its controller's
    successor (``spec.successor == "gated"``), or ``None``.

    The spec is checked here rather than in SQL: JSON paths differ between SQLite and
    PostgreSQL, and the unique live-workload index leaves at most one row to look at.
    """
    stmt = (select(m.c.id, m.c.spec)
            .where(m.c.kind == MIGRATION, m.c.workload == f"{namespace}/{name}",
                   m.c.terminal.is_(False))
            .order_by(m.c.created_at))
    async with read_txn(db) as conn:
        rows = (await conn.execute(stmt)).all()
    for machine_id, spec in rows:
        if isinstance(spec, dict) and spec.get("successor") == GATED:
            return str(machine_id)
    return None
