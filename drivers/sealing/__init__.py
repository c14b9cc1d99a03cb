"""Sealed checkpoints: layers encrypted as ocicrypt does, manifests signed as sigstore does.

:mod:`~drivers.sealing.keys` loads and names keys, :mod:`~drivers.sealing.layers`
encrypts and decrypts one layer (AES-256-CTR + HMAC-SHA256, the key wrapped for each
recipient as JWE), :mod:`~drivers.sealing.signatures` signs and verifies manifests (simple
signing payloads in cosign attachments, as containers/image reads them). Formats and the
threat model: ``docs/security.md``.
"""
