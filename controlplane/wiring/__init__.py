"""The composition root: the one package that imports the drivers and builds the product.

- ``product``: the worker over every kind against a cluster and a registry (watch-backed
  observer, kube and registry action handlers, the drain's child submitter).
- ``access``: what a submission reads of the cluster (``app.ports.ClusterAccess``): the
  API server by GET and LIST, no watch cache, no worker.
- ``cluster``: both of those from the command line's cluster and registry options.
- ``embedded``: the embedded default (simulated cluster, node agents, on-disk registry).
- ``engine``: the worker over the engine's own kinds (no cluster).
- ``sim``: the simulator's and the kubelet role's servers for ``cpctl sim``.

The CLI and the API ask this package for what they run; nothing else in ``controlplane``
imports ``drivers`` (import-linter states it in one rule).
"""
