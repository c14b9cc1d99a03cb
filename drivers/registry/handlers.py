"""The ``DeleteManifest`` action handler: garbage-collect an artifact by digest.

The manifest goes with the per-container checkpoint images it lists
(:func:`~drivers.registry.checkpoints.delete_checkpoint`), so deleting a checkpoint
leaves none of its parts behind. Params (see :mod:`controlplane.machines.contract.actions`):
``repository`` (``registry/repo``) and ``digest`` (``sha256:...``). Outcomes:

- deleted, or ``404`` (already gone): done — deleting is idempotent;
- ``403``/``401`` (not allowed) and ``405`` (deletes disabled on the registry): a
  ``TerminalActionError`` whose ``error_class`` is the reason, so the machine records an
  ``ActionFailed`` and shows the failed garbage collection (safety gate 7) instead of
  retrying something that cannot succeed;
- ``429``, ``5xx``, timeouts, refused connections: ``RetryableActionError``;
- malformed params: ``TerminalActionError``.

Registered by the composition root next to the Kubernetes handlers.
"""

from __future__ import annotations

from controlplane.engine.decider import Action
from controlplane.logs import get_logger
from controlplane.machines.contract.actions import ActionType
from controlplane.worker.errors import TerminalActionError
from controlplane.worker.ports import ActionHandler
from drivers.registry.checkpoints import delete_checkpoint
from drivers.registry.client import is_digest
from drivers.registry.errors import RegistryError, RegistryNotFound, action_error
from drivers.registry.port import Registry

log = get_logger("drivers.registry.handlers")



class ManifestActions:
    """The registry's action handlers over one backend."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def handlers(self) -> dict[str, ActionHandler]:
        return {ActionType.DELETE_MANIFEST: self.delete_manifest}

    async def delete_manifest(self, action: Action, /) -> None:
        repository = action.params.get("repository")
        digest = action.params.get("digest")
        if not isinstance(repository, str) or not repository or \
                not isinstance(digest, str) or not is_digest(digest):
            raise TerminalActionError(f"DeleteManifest {action.key}: params 'repository' "
                                      f"(registry/repo) and 'digest' (sha256:...) are "
                                      f"required, got {repository!r}, {digest!r}")
        what = f"DeleteManifest {repository}@{digest}"
        try:
            await delete_checkpoint(self.registry, repository, digest)
        except RegistryNotFound:
            log.info("manifest already gone", repository=repository, digest=digest)
        except RegistryError as exc:
            raise action_error(exc, what) from exc
