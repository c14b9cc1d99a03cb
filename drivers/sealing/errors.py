"""Why a sealed layer could not be opened: each names what failed and what to check."""

from __future__ import annotations


class SealError(Exception):
    """A sealed layer could not be unsealed."""


class NotForUs(SealError):
    """No key given unwraps the layer's key: it is sealed for other recipients."""


class Tampered(SealError):
    """The ciphertext's HMAC or the plain layer's digest does not match: changed at rest."""


class BadSealedLayer(SealError):
    """The layer's encryption annotations are missing or malformed."""
