"""The machine kinds: pure deciders (``decide``/``evolve``), no I/O.

``steps`` is the engine's own workload (tests, benchmark, example); the product's kinds
(checkpoint, restore, migration, suspension) are listed by ``catalog.product_kinds``.
"""
