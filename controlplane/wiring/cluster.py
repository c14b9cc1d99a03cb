"""The product and the cluster access from the command line's cluster and registry
options (``--kubeconfig``/``--in-cluster``, ``--kube-qps``/``--kube-burst``,
``--registry-*``; checked when parsed): what ``cpctl worker --kubeconfig``, the operator
verbs and ``cpctl serve`` run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from controlplane.app.unrecorded import ListingRegistry
from controlplane.clock import Clock
from controlplane.engine.jsonvalue import JsonObject
from controlplane.frontdoor.class_lookup import ResourceClasses
from controlplane.frontdoor.door import DoorSettings, FrontDoor
from controlplane.frontdoor.ports import NO_FAULTS, Faults
from controlplane.store.database import Database
from controlplane.wiring.access import KubeClusterAccess, cluster_access
from controlplane.wiring.product import product
from controlplane.worker.loop import Worker, WorkerConfig
from drivers.kube import KubeSettings
from drivers.kube.custom import CustomResources
from drivers.registry.client import RegistryClient
from drivers.registry.layout import OciLayout
from drivers.registry.options import registry_from_options
from drivers.registry.port import Registry


def registry_from_args(args: argparse.Namespace) -> Registry:
    return registry_from_options(layout=args.registry_layout,
                                 plain_http=args.registry_plain_http,
                                 credentials=args.registry_credentials)


def listing_registry_from_args(args: argparse.Namespace) -> ListingRegistry:
    """The registry the flags name, as one whose repositories' tags can be listed."""
    registry = registry_from_args(args)
    assert isinstance(registry, (RegistryClient, OciLayout)), registry
    return registry


def connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """``product()``'s cluster arguments from the command line (checked when parsed)."""
    # context: `kubectl checkpoint --context NAME` (cli/plugin.py); cpctl has no such flag.
    return {"kubeconfig": args.kubeconfig, "context": getattr(args, "context", None),
            "in_cluster": True if args.in_cluster else None,
            "kube": KubeSettings(qps=args.kube_qps, burst=args.kube_burst)}


def access_from_args(db: Database, args: argparse.Namespace
                     ) -> contextlib.AbstractAsyncContextManager[KubeClusterAccess]:
    """``cluster_access`` for the cluster and registry the command line names."""
    return cluster_access(db, registry=registry_from_args(args), **connect_options(args))


async def run_product_worker(db: Database, args: argparse.Namespace, config: WorkerConfig,
                             drive: Callable[[Worker], Awaitable[None]], clock: Clock, *,
                             classes: Mapping[str, JsonObject] | None = None,
                             faults: Faults = NO_FAULTS) -> None:
    """``cpctl worker --kubeconfig ...``: drive every kind against the cluster, and (unless
    ``--no-front-door``) open the front door: the custom resources of docs/resources.md,
    with ``classes`` (the classes file's) behind the ``CheckpointClass`` resources, over
    the driver's watch cache (relisting as often as the door's resync). ``faults``: only
    a crash test passes any (:mod:`controlplane.wiring.faults`)."""
    settings = DoorSettings()
    trusted = [await asyncio.to_thread(Path(path).read_bytes) for path in args.trusted_key]
    async with product(db, clock, registry=registry_from_args(args), config=config,
                       run_worker=False, trusted_keys=trusted,
                       **connect_options(args)) as running:
        api = CustomResources(running.kube.api.client, settings=dataclasses.replace(
            running.kube.settings, resync_seconds=settings.resync_seconds))
        door = None if args.no_front_door else FrontDoor(
            db, running.worker.kinds, KubeClusterAccess(running.kube, running.registry, db),
            api, ResourceClasses(api, classes or {}), clock, limits=config.limits,
            settings=settings, faults=faults)
        task = asyncio.create_task(door.run()) if door is not None else None
        try:
            await drive(running.worker)
        finally:
            if door is not None and task is not None:
                door.stop()
                await task
