"""Persistence: the only package that speaks SQL (SQLAlchemy Core, async).

``schema`` defines the tables (Alembic migrations mirror it), ``database`` opens the
SQLite or PostgreSQL backend, ``event_store`` appends events and updates projections in
one transaction, ``leases`` claims due machines for workers.
"""
