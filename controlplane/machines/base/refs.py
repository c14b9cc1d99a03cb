"""Strict parsing of OCI artifact references: ``registry/repo:tag``, ``registry/repo@sha256:..``.

A reference names a registry host (a dotted name, ``host:port`` or ``localhost``), a
repository path of lowercase components, and a tag and/or a sha256 digest. Anything else
is rejected with :class:`~controlplane.engine.decider.InvalidSpec` naming the field and the
expected form. Used by the checkpoint classes, submission validation and the machines
(``repo@digest`` is how an artifact is pinned after verification). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec

_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
_REGISTRY = re.compile(rf"^{_HOST}(?:\.{_HOST})*(?::[0-9]{{1,5}})?$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")

EXAMPLE_TAG_REF = "registry.example.com/checkpoints/app:ckpt-1"
EXAMPLE_DIGEST_REF = "registry.example.com/checkpoints/app@sha256:<64 hex digits>"


@dataclass(frozen=True)
class ArtifactRef:
    """A parsed reference; at least one of ``tag`` and ``digest`` is set."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repo(self) -> str:
        """``registry/repository`` without tag or digest."""
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        """``registry/repository@digest``: the artifact by content, whatever the tag says."""
        return f"{self.repo}@{digest}"

    def __str__(self) -> str:
        text = self.repo
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def is_digest(text: str) -> bool:
    return bool(_DIGEST.match(text))


def is_valid_tag(text: str) -> bool:
    return bool(_TAG.match(text))


def parse_repository(text: object, *, field: str) -> str:
    """Validate ``registry/repository`` (no tag, no digest); return it unchanged."""
    if not isinstance(text, str) or not text:
        raise InvalidSpec(f"{field} must be a repository like 'registry.example.com/team/app'")
    if "@" in text or ":" in text.split("/")[-1]:
        raise InvalidSpec(f"{field} {text!r} must name a repository without tag or digest, "
                          "e.g. 'registry.example.com/team/app'")
    registry, repository = _split_registry(text, field=field)
    return f"{registry}/{repository}"


def parse_artifact_ref(text: object, *, field: str) -> ArtifactRef:
    """Parse ``registry/repo:tag``, ``registry/repo@sha256:<64 hex>`` or both."""
    if not isinstance(text, str) or not text:
        raise InvalidSpec(f"{field} must be an artifact reference like {EXAMPLE_TAG_REF!r} "
                          f"or {EXAMPLE_DIGEST_REF!r}")
    name, digest = text, None
    if "@" in text:
        name, digest = text.split("@", 1)
        if not _DIGEST.match(digest):
            raise InvalidSpec(f"{field} {text!r} has an invalid digest {digest!r}: expected "
                              "'sha256:' followed by 64 lowercase hex digits")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        if not _TAG.match(tag):
            raise InvalidSpec(f"{field} {text!r} has an invalid tag {tag!r}: use letters, digits, "
                              "'_', '.', '-' (max 128, not starting with '.' or '-')")
    if tag is None and digest is None:
        raise InvalidSpec(f"{field} {text!r} needs a tag or a digest, e.g. {EXAMPLE_TAG_REF!r}")
    registry, repository = _split_registry(name, field=field)
    return ArtifactRef(registry, repository, tag, digest)


def parse_tag_ref(text: object, *, field: str) -> ArtifactRef:
    """A reference that must carry a tag (where a checkpoint is pushed to)."""
    ref = parse_artifact_ref(text, field=field)
    if ref.tag is None or ref.digest is not None:
        raise InvalidSpec(f"{field} {text!r} must be a tag reference like {EXAMPLE_TAG_REF!r} "
                          "(a checkpoint is pushed to a tag and pinned by digest afterwards)")
    return ref


def parse_digest_ref(text: object, *, field: str) -> ArtifactRef:
    """A reference that must carry a digest (what a restore reads)."""
    ref = parse_artifact_ref(text, field=field)
    if ref.digest is None:
        raise InvalidSpec(f"{field} {text!r} must pin the artifact by digest, like "
                          f"{EXAMPLE_DIGEST_REF!r}; a tag can move")
    return ref


def _split_registry(name: str, *, field: str) -> tuple[str, str]:
    if "/" not in name:
        raise InvalidSpec(f"{field} {name!r} needs a registry host and a repository, "
                          "e.g. 'registry.example.com/team/app'")
    registry, repository = name.split("/", 1)
    looks_like_host = "." in registry or ":" in registry or registry == "localhost"
    if not looks_like_host or not _REGISTRY.match(registry):
        raise InvalidSpec(f"{field} {name!r} must start with a registry host "
                          "(e.g. 'registry.example.com', 'localhost:5000')")
    parts = repository.split("/")
    for part in parts:
        if not _COMPONENT.match(part):
            raise InvalidSpec(f"{field} {name!r} has an invalid repository component {part!r}: "
                              "use lowercase letters, digits and single separators '.', '_', '-'")
    if len(repository) > 255:
        raise InvalidSpec(f"{field} repository is longer than 255 characters")
    return registry, repository
