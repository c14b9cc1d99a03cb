"""CPython's cyclic garbage collector, set for the control plane's allocation pattern.

The worker and the rebuild allocate a great many short-lived, acyclic objects (decoded
JSON, frozen dataclass states, events); reference counting frees them, but every 700
container allocations CPython's cyclic collector runs, and its older-generation passes
walk every live object (a worker's watch cache and states, a rebuild's batch) to
collect nothing. Measured (``docs/performance.md``): a rebuild of 1M events in one
process ran at 35k events/s with the collector and 53k without, same peak memory; a
2,000-migration scale run's control plane used 23.3 s of CPU with the default
thresholds and 20.1 s with :func:`tune_for_service`'s.

- :func:`tune_for_service`: long-running processes (``cpctl worker``, ``cpctl serve``)
  keep the collector, with a young generation of 50,000 allocations instead of 700.
- :func:`collector_paused`: a bounded bulk job (rebuild, verify) runs without it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Young-generation size of a service: cycles (asyncio tracebacks, futures) are still
#: collected, about 70 times less often.
SERVICE_THRESHOLDS = (50_000, 20, 20)


def tune_for_service() -> None:
    """Set the collector's thresholds for a long-running control-plane process."""
    gc.set_threshold(*SERVICE_THRESHOLDS)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run a bounded bulk fold without the cyclic collector; restored as it was on exit.

    For work that creates no reference cycles (a rebuild's reads and folds: 0 collected,
    same peak RSS), so pausing loses nothing and saves the collector's passes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
