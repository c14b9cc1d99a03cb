"""The OCI registry driver: one port, two backends, the observer and the GC handler.

- :mod:`~drivers.registry.port`: the :class:`Registry` protocol (resolve, get/push
  manifests and blobs, delete by digest) both backends implement;
- :mod:`~drivers.registry.client`: the Distribution API v2 over HTTP (aiohttp), with
  :mod:`~drivers.registry.transport` (timeouts, retries, auth) and
  :mod:`~drivers.registry.auth` (basic, bearer token challenges);
- :mod:`~drivers.registry.layout`: OCI image layouts on disk (the embedded default);
- :mod:`~drivers.registry.observer`: ``Interests.tags`` -> ``TagView`` / ``None`` /
  ``ProbeError``; :mod:`~drivers.registry.handlers`: the ``DeleteManifest`` action;
- :mod:`~drivers.registry.artifact`, :mod:`~drivers.registry.checkpoint_images` (the
  per-container images CRI-O restores) and :mod:`~drivers.registry.checkpoints`: the
  checkpoint artifact format and its push/pull/delete, for the node agent.

Errors: :mod:`~drivers.registry.errors`. See ``docs/protocol.md``.
"""

from drivers.registry.auth import Credentials
from drivers.registry.client import RegistryClient
from drivers.registry.handlers import ManifestActions
from drivers.registry.layout import OciLayout
from drivers.registry.observer import RegistryObserver
from drivers.registry.port import Registry
from drivers.registry.transport import RegistrySettings

__all__ = ["Credentials", "ManifestActions", "OciLayout", "Registry",
           "RegistryClient", "RegistryObserver", "RegistrySettings"]
