"""Where the cluster is and how to talk to it: kubeconfig / in-cluster, and the knobs.

:func:`load_configuration` builds a ``kubernetes_asyncio`` ``Configuration`` from, in
order: an explicit kubeconfig path (and optional context); in-cluster service-account
config when asked or when ``KUBERNETES_SERVICE_HOST`` is set and no kubeconfig was
named; otherwise ``$KUBECONFIG`` / ``~/.kube/config``. It returns the kubeconfig loader
too, so exec-plugin and GCP tokens can be refreshed in the background. A kubeconfig that
does not exist, or cannot be read, is a :class:`KubeConfigError` naming the file, where
its name came from, and what to pass instead.

:class:`KubeSettings` holds the driver's knobs (rate limit, timeouts, watch and resync
periods, scope, delete grace period). Called by :mod:`drivers.kube.driver` and tests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
)
from kubernetes_asyncio.config.kube_config import KubeConfigLoader

from controlplane.errors import ControlPlaneError


class KubeConfigError(ControlPlaneError):
    """No usable cluster configuration (missing kubeconfig, bad context, not in a pod)."""


@dataclass(frozen=True)
class KubeSettings:
    """The Kubernetes driver's knobs; defaults suit a control plane of a few replicas."""

    qps: float = 50.0  # client-side rate limit (token bucket); <= 0 disables it
    burst: int = 100
    request_timeout: float = 15.0  # every non-watch request
    connect_timeout: float = 5.0
    watch_timeout: float = 290.0  # server-side timeoutSeconds of one watch request
    resync_seconds: float = 600.0  # relist and diff this often (0: never)
    list_page_size: int = 500
    backoff_initial: float = 0.2  # watch/list retry backoff after an error
    backoff_max: float = 30.0
    namespace: str | None = None  # watch scope for pods; None: all namespaces
    pod_label_selector: str | None = None
    delete_grace_seconds: int | None = None  # DeletePod; None: the pod's own
    event_component: str = "checkpoint-controlplane"
    sync_timeout: float = 60.0  # how long start() waits for the caches' first list


@dataclass(frozen=True)
class Loaded:
    configuration: Configuration
    loader: KubeConfigLoader | None  # None for in-cluster config
    source: str  # for logs: "kubeconfig /path (context x)" or "in-cluster"


async def load_configuration(*, kubeconfig: str | None = None, context: str | None = None,
                             in_cluster: bool | None = None,
                             environ: Mapping[str, str] | None = None,
                             token_path: str = SERVICE_TOKEN_FILENAME,
                             ca_path: str = SERVICE_CERT_FILENAME) -> Loaded:
    """Load a client ``Configuration``; :class:`KubeConfigError` says what was missing."""
    env = os.environ if environ is None else environ
    use_cluster = in_cluster if in_cluster is not None else (
        kubeconfig is None and "KUBERNETES_SERVICE_HOST" in env)
    configuration = Configuration()
    if use_cluster:
        try:
            load_incluster_config(  # type: ignore[no-untyped-call]  # untyped upstream
                client_configuration=configuration, token_filename=token_path,
                cert_filename=ca_path, environ=dict(env))
        except ConfigException as exc:
            raise KubeConfigError(f"in-cluster configuration failed: {exc}",
                                  hint="run inside a pod with a service account, or pass "
                                       "--kubeconfig") from exc
        return Loaded(configuration, None, "in-cluster")
    path, origin = _kubeconfig_path(kubeconfig, env)
    if not _exists(path):
        raise KubeConfigError(f"kubeconfig {path} ({origin}) does not exist",
                              hint="pass --kubeconfig PATH (and --context) or set KUBECONFIG "
                                   "to an existing file")
    try:
        loader = await load_kube_config(config_file=path, context=context,
                                        client_configuration=configuration,
                                        persist_config=False)
    except (ConfigException, OSError) as exc:
        raise KubeConfigError(f"cannot load kubeconfig {path}: {exc}",
                              hint="pass --kubeconfig PATH (and --context) or set "
                                   "KUBECONFIG") from exc
    where = f"kubeconfig {path}" + (f" (context {context})" if context else "")
    return Loaded(configuration, loader, where)


def _exists(path: str) -> bool:
    """Whether any file of a ``KUBECONFIG``-style list exists (a stat each: the loader
    then reads the file synchronously anyway)."""
    return any(os.path.exists(os.path.expanduser(p)) for p in path.split(os.pathsep) if p)


def _kubeconfig_path(explicit: str | None, env: Mapping[str, str]) -> tuple[str, str]:
    """The kubeconfig to read and where its name came from (for the error message)."""
    if explicit:
        return explicit, "as given"
    if env.get("KUBECONFIG"):
        return env["KUBECONFIG"], "from $KUBECONFIG"
    return os.path.expanduser("~/.kube/config"), "the default"
