"""``cpctl``: the operator's command line (the parser in ``main``; one module per group of
verbs: ``reading``, ``control``, ``submit``, ``drain``, ``retention``...)."""
