"""The machine kinds: pure deciders (``decide``/``evolve``), no I/O.

- ``catalog``: every kind this build registers (``default_kinds``, ``product_kinds``).
- ``checkpoint/``, ``restore/``, ``migration/``, ``suspend/``, ``resume/``, ``drain/``:
  one folder per product kind (``machine.py`` is its decider; ``state.py`` and
  ``phases.py`` where the kind is big enough to split).
- ``selftest/``: the ``steps`` kind, the engine's own test and benchmark workload.
- ``steps/``: the steps several kinds share (capture, source operations, restore,
  garbage collection), each with its events, state and ``decide``.
- ``base/``: what every kind builds on (state codec, copies, phases, time, facts, parsing).
- ``contract/``: the node agent's annotation protocol and the action types drivers perform.
- ``config/``: checkpoint classes and the saver/loader containers.
- ``submission``: the pure checks a request passes before a machine is created.
"""
