"""Typed storage errors. A stale writer always gets one of these, never a silent overwrite."""

from __future__ import annotations

from controlplane.errors import ControlPlaneError, UsageError


class StaleWriter(ControlPlaneError):
    """A commit lost a race; the caller must let go and decide again on fresh state."""


class ConcurrencyConflict(StaleWriter):
    """The machine's version moved since it was read (optimistic check failed)."""


class LeaseLost(StaleWriter):
    """The caller's lease expired or was taken over; its commit is fenced off."""


class MachineNotFound(UsageError):
    """No machine with that id."""


class MachineExists(UsageError):
    """A machine with that id already exists."""


class WorkloadBusy(UsageError):
    """Another live operation already acts on this workload."""


class DatabaseUnavailable(ControlPlaneError):
    """The database cannot be reached; retryable for workers, fatal for one-shot commands."""

    exit_code = 3


class SchemaNotReady(ControlPlaneError):
    """The schema is missing or older than this code."""

    exit_code = 3


class HistoryUnreadable(SchemaNotReady):
    """The database records history rows in an encoding this code cannot read: a format
    byte it does not have (written by a newer version) or a dictionary whose digest is not
    the one it has for that format. Refused when the store opens the database, not row by
    row in the middle of a worker's transition."""


class DictionaryChanged(ControlPlaneError):
    """A history dictionary shipped with this code is not the file its digest pins: the
    install is broken, and rows compressed with that dictionary would not decode."""
