"""Strict parsing of artifact references: ``registry/repo:tag`` and ``registry/repo@sha256:..``."""

from __future__ import annotations

import pytest

from controlplane.engine.decider import InvalidSpec
from controlplane.machines.base.refs import (
    ArtifactRef,
    parse_artifact_ref,
    parse_digest_ref,
    parse_repository,
    parse_tag_ref,
)

HEX = "a" * 64


@pytest.mark.parametrize(("text", "parsed"), [
    ("registry.example.com/ckpt:v1", ArtifactRef("registry.example.com", "ckpt", "v1")),
    ("localhost:5000/team/app:ckpt.1-x_y", ArtifactRef("localhost:5000", "team/app",
                                                       "ckpt.1-x_y")),
    (f"registry.example.com/ckpt@sha256:{HEX}",
     ArtifactRef("registry.example.com", "ckpt", None, f"sha256:{HEX}")),
    (f"localhost/a/b:tag@sha256:{HEX}", ArtifactRef("localhost", "a/b", "tag",
                                                    f"sha256:{HEX}")),
])
def test_valid_references_parse_and_print_back(text: str, parsed: ArtifactRef) -> None:
    """A valid reference parses into its parts and prints as given."""
    ref = parse_artifact_ref(text, field="artifact")
    assert ref == parsed
    assert str(ref) == text


@pytest.mark.parametrize(("text", "why"), [
    ("", "must be an artifact reference"),
    ("ckpt:v1", "registry host"),
    ("ckpt/app:v1", "registry host"),
    ("registry.example.com/Ckpt:v1", "invalid repository component"),
    ("registry.example.com/ckpt", "needs a tag or a digest"),
    ("registry.example.com/ckpt:", "invalid tag"),
    ("registry.example.com/ckpt:-v1", "invalid tag"),
    ("registry.example.com/ckpt:" + "t" * 129, "invalid tag"),
    ("registry.example.com/ckpt@sha256:abc", "invalid digest"),
    (f"registry.example.com/ckpt@sha256:{'A' * 64}", "invalid digest"),
    (f"registry.example.com/ckpt@sha512:{HEX}", "invalid digest"),
    ("registry.example.com//ckpt:v1", "invalid repository component"),
    ("regi$try.com/ckpt:v1", "registry host"),
    ("registry.example.com/ckpt--:v1", "invalid repository component"),
])
def test_invalid_references_are_rejected_with_the_reason(text: str, why: str) -> None:
    """Each malformed reference is refused, naming the field and what is wrong."""
    with pytest.raises(InvalidSpec, match=why) as err:
        parse_artifact_ref(text, field="spec.artifact")
    assert "spec.artifact" in str(err.value)


def test_non_string_reference_is_rejected() -> None:
    """A reference must be a string."""
    with pytest.raises(InvalidSpec, match=r"spec\.artifact"):
        parse_artifact_ref(42, field="spec.artifact")


def test_tag_reference_must_not_pin_a_digest() -> None:
    """Where a checkpoint is pushed is a tag, not a digest."""
    with pytest.raises(InvalidSpec, match="tag reference"):
        parse_tag_ref(f"registry.example.com/ckpt@sha256:{HEX}", field="artifact")


def test_digest_reference_must_pin_a_digest() -> None:
    """What a restore reads is pinned by digest: a tag can move."""
    with pytest.raises(InvalidSpec, match="pin the artifact by digest"):
        parse_digest_ref("registry.example.com/ckpt:v1", field="artifact")


def test_pinned_drops_the_tag() -> None:
    """ref.pinned(digest) names the artifact by content only."""
    ref = parse_tag_ref("registry.example.com/ckpt:v1", field="artifact")
    assert ref.pinned(f"sha256:{HEX}") == f"registry.example.com/ckpt@sha256:{HEX}"


@pytest.mark.parametrize("text", ["registry.example.com/ckpt:v1", "ckpt",
                                  f"registry.example.com/ckpt@sha256:{HEX}"])
def test_repository_must_not_carry_tag_or_digest(text: str) -> None:
    """A class repository is registry/repo only."""
    with pytest.raises(InvalidSpec, match=r"class\.repository"):
        parse_repository(text, field="class.repository")
