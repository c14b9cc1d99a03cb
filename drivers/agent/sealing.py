"""The node agent's side of sealed checkpoints: its keys, sealing, signing, verifying.

What a node holds (``python -m drivers.agent --signing-key/--trusted-key/--secrets-dir``;
in a cluster, Secrets mounted into the agent's pod):

- a **signing key**: every checkpoint manifest this agent pushes is signed with it
  (sigstore simple signing, stored as containers/image reads it:
  :mod:`drivers.sealing.signatures`) before its tag names it;
- **trusted keys**: a restore verifies the manifest it names is signed by one of them
  before it pulls a layer, and refuses it otherwise (unsigned, signed by another key,
  or a signature of another manifest), naming what did not verify;
- a **secrets directory**: ``secret:NAME/KEY`` in a class (a recipient, or the key that
  unseals) is the file ``<secrets-dir>/NAME/KEY``, the Secret ``NAME`` mounted there.

A capture request of a sealed class (``capture-seal``) names its recipients: they are
resolved before anything is frozen, and a required seal that cannot be resolved refuses
the capture — it never falls back to plain text. Each archive is encrypted
(:func:`drivers.sealing.layers.encrypt_layer`) and its plain copy removed before the
push. A restore of a sealed checkpoint unseals each layer with the key the request names
(``restore-unseal``) and the node's own decryption keys. Key material is never logged.
Used by :mod:`drivers.agent.agent`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.machines.contract import protocol
from drivers.agent.errors import RequestRefused, RestoreFailed
from drivers.registry.artifact import SEALED_SUFFIX, Layer
from drivers.registry.checkpoints import Archive
from drivers.registry.port import Registry
from drivers.sealing import keys, layers, signatures
from drivers.sealing.errors import SealError

PEM_PUBLIC = "-----BEGIN PUBLIC KEY-----"


@dataclass(frozen=True)
class SealingSettings:
    """Where this node's keys are (files; ``None``/empty: not configured)."""

    signing_key: Path | None = None
    trusted_keys: tuple[Path, ...] = ()
    secrets_dir: Path | None = None
    decryption_keys: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Seal:
    """A capture request's seal: the recipients, bound to its checkpoint."""

    recipients: tuple[str, ...]
    required: bool


def read_seal(annotations: Mapping[str, str], checkpoint_id: str) -> Seal | None:
    """The seal of this checkpoint's request, or ``None`` (plain); one naming another
    checkpoint (left by an earlier request) does not apply. Malformed: refused."""
    raw = annotations.get(protocol.CAPTURE_SEAL, "")
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
        named, recipients = data["checkpoint"], data["recipients"]
        required = bool(data.get("required", True))
    except (ValueError, KeyError, TypeError) as exc:
        raise RequestRefused(f"{protocol.CAPTURE_SEAL} is not a seal this agent reads "
                             f"({exc}); nothing was captured") from exc
    if named != checkpoint_id:
        return None
    if not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients):
        raise RequestRefused(f"{protocol.CAPTURE_SEAL}: recipients must be a list of key "
                             "sources; nothing was captured")
    return Seal(tuple(recipients), required)


@dataclass
class Sealing:
    """One node's keys, loaded once at start (files only; no key material in logs)."""

    settings: SealingSettings = field(default_factory=SealingSettings)
    signer: signatures.Signer | None = None
    verifier: signatures.Verifier | None = None

    @classmethod
    def load(cls, settings: SealingSettings) -> Sealing:
        signer = verifier = None
        if settings.signing_key is not None:
            signer = signatures.Signer.from_pem(settings.signing_key.read_bytes())
        if settings.trusted_keys:
            verifier = signatures.Verifier.from_pems(
                [path.read_bytes() for path in settings.trusted_keys])
        return cls(settings, signer, verifier)

    # --- key sources ---------------------------------------------------------------------

    def _source(self, source: str, *, what: str) -> bytes:
        """The PEM bytes of an inline key, ``file:/path`` or ``secret:NAME/KEY``."""
        if source.startswith(PEM_PUBLIC):
            return source.encode()
        if source.startswith("file:"):
            path = Path(source.removeprefix("file:"))
        elif source.startswith("secret:"):
            if self.settings.secrets_dir is None:
                raise FileNotFoundError(f"{what} {source} names a Secret, but this agent has "
                                        "no --secrets-dir where Secrets are mounted")
            name, _, key = source.removeprefix("secret:").partition("/")
            if not name or not key or "/" in key or name in (".", "..") or key in (".", ".."):
                raise FileNotFoundError(f"{what} {source} is not secret:NAME/KEY")
            path = self.settings.secrets_dir / name / key
        else:
            raise FileNotFoundError(f"{what} {source[:40]!r} is not an inline PEM, file: or "
                                    "secret: source")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise FileNotFoundError(f"{what} {source} cannot be read on this node: "
                                    f"{exc.strerror or exc}") from exc

    def recipients(self, seal: Seal) -> list[Any]:
        """The recipients' public keys; ``RequestRefused`` if one cannot be had."""
        found = []
        for number, source in enumerate(seal.recipients):
            try:
                found.append(keys.load_public_key(self._source(
                    source, what=f"recipient {number}")))
            except (FileNotFoundError, ValueError) as exc:
                raise RequestRefused(
                    f"the class requires sealed checkpoints but {exc}; nothing was captured "
                    "and nothing is pushed in plain text (mount the key, or fix the class's "
                    "encryption.recipients)") from exc
        if not found:
            raise RequestRefused("the class requires sealed checkpoints but names no "
                                 "recipient; nothing was captured")
        return found

    def unsealing_keys(self, unseal: str) -> list[Any]:
        """The private keys to try: the one the request names, then the node's own."""
        found = []
        sources = ([unseal] if unseal else []) + [
            f"file:{path}" for path in self.settings.decryption_keys]
        problems = []
        for source in sources:
            try:
                found.append(keys.load_private_key(self._source(source, what="the key")))
            except (FileNotFoundError, ValueError) as exc:
                problems.append(str(exc))
        if not found:
            raise RestoreFailed(
                "Unsealable: the checkpoint is sealed and this node has no key to unseal it"
                + (f" ({'; '.join(problems)})" if problems else
                   " (the class names no keySecretRef/keyFile and the agent has no "
                   "--decryption-key)"))
        return found

    # --- capture ---------------------------------------------------------------------------

    async def seal_archives(self, archives: Sequence[Archive], recipients: Sequence[Any],
                            *, keep_plain: bool = False) -> list[Archive]:
        """Each archive encrypted beside it; the plain file removed at once, unless
        ``keep_plain``: a handed-off capture streams the plain archives to the target (the
        job removes its private work directory when the offer ends)."""
        sealed = []
        for archive in archives:
            target = archive.path.with_name(archive.path.name + ".sealed")
            try:
                made = await asyncio.to_thread(layers.encrypt_layer, archive.path, target,
                                               list(recipients))
            finally:
                if not keep_plain:
                    await asyncio.to_thread(archive.path.unlink, True)
            sealed.append(Archive(archive.container, target, archive.image,
                                  media_type=archive.media_type + SEALED_SUFFIX,
                                  annotations=made.annotations, diff_id=made.plain_digest,
                                  digest=made.digest))
        return sealed

    @staticmethod
    def key_ids(recipients: Sequence[Any]) -> list[str]:
        return [keys.key_id(key) for key in recipients]

    async def sign(self, registry: Registry, repository: str, digest: str) -> None:
        assert self.signer is not None
        await signatures.sign_manifest(registry, repository, digest, self.signer)

    # --- restore ---------------------------------------------------------------------------

    async def verify(self, registry: Registry, repository: str, digest: str) -> None:
        """``RestoreFailed`` naming what did not verify, unless ``digest`` is signed by a
        trusted key (a node with no trusted key verifies nothing: see docs/security.md)."""
        if self.verifier is None:
            return
        try:
            await signatures.verify_manifest(registry, repository, digest, self.verifier)
        except signatures.SignatureRefused as exc:
            raise RestoreFailed(f"Unverified: {type(exc).__name__}: {exc}; nothing was "
                                "pulled or restored") from exc

    def unsealer(self, unseal: str) -> Any:
        """``unseal(sealed, plain, layer)`` for :func:`~drivers.registry.checkpoints.
        pull_checkpoint`, with the keys resolved on first use."""
        loaded: list[Any] = []

        def run(sealed: Path, plain: Path, layer: Layer) -> None:
            if not loaded:
                loaded.extend(self.unsealing_keys(unseal))
            try:
                layers.decrypt_layer(sealed, plain, layer.descriptor.annotations, loaded)
            except SealError as exc:
                raise RestoreFailed(f"Unsealable: layer of container {layer.container}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        return run
