"""The state codec, for the machines: it lives in :mod:`controlplane.engine.codec`, since
the engine's typed events and commands are encoded with it too."""

from controlplane.engine.codec import (
    OMIT_DEFAULT,
    RawJson,
    decode,
    encode,
    encode_object,
    field_decoders,
)

__all__ = ["OMIT_DEFAULT", "RawJson", "decode", "encode", "encode_object", "field_decoders"]
