"""``cpctl``: the operator's command line (parser in ``main``, verbs in ``commands``)."""
