"""The Kubernetes driver (kubernetes_asyncio): watch caches, observer, action handlers.

Entry point: :class:`~drivers.kube.driver.KubeDriver` (``connect`` -> ``start`` ->
``observer`` / ``handlers()`` / ``requests``). The modules, leaves first: ``errors``
(typed API errors), ``config`` (kubeconfig / in-cluster, settings), ``ratelimit``,
``metrics``, ``client`` (the one door to the API server), ``resources`` (core/v1 calls),
``cache`` (list + watch), ``wakes``, ``views``, ``observer``, ``bodies``, ``handlers``.
"""

from drivers.kube.config import KubeSettings
from drivers.kube.driver import KubeDriver

__all__ = ["KubeDriver", "KubeSettings"]
