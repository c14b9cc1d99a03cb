"""Why a sealed layer could not be opened: each error names what failed and what to check.

All are terminal (retrying the same bytes with the same keys fails the same way). Raised
by :mod:`drivers.sealing.layers`; the node agent turns them into a refused restore.
"""

from __future__ import annotations


class SealError(Exception):
    """A sealed layer could not be unsealed."""


class NotForUs(SealError):
    """No key given unwraps the layer's key: it is sealed for other recipients.

    ``sealed_for`` holds the key ids the layer names (empty when its JWE names none, as
    skopeo's do not)."""

    def __init__(self, message: str, *, sealed_for: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.sealed_for = sealed_for


class Tampered(SealError):
    """The ciphertext's HMAC or the plain layer's digest does not match: changed at rest."""


class BadSealedLayer(SealError):
    """The layer's encryption annotations are missing or malformed."""
