"""The handoff's flags of ``python -m drivers.agent`` and the kubelet role's hold.

Pins: a ``--handoff-key`` file that is unreadable or shorter than 32 bytes stops the
agent at start (exit 2) with one line naming the flag and the fix; the listen address
defaults to every interface on a fixed port, and the advertised host to ``$POD_IP``;
listening on every interface with nothing to advertise is refused; without the flag the
agent has no handoff. The kubelet role never starts a ``restore-handoff`` pod cold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.agent.__main__ import DEFAULT_HANDOFF_LISTEN, handoff_from, main, parse_args
from drivers.kubelet.podman_nodes import awaits_restore


@pytest.mark.parametrize(("content", "why"), [(b"short", "5 bytes"), (None, "cannot read")],
                         ids=["short", "unreadable"])
def test_an_unusable_handoff_key_stops_the_agent_naming_the_flag_and_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None,
        why: str) -> None:
    key = tmp_path / "handoff.key"
    if content is not None:
        key.write_bytes(content)
    code = main(["--node", "node-1", "--handoff-key", str(key), "--handoff-listen",
                 "127.0.0.1:0", "--workdir", str(tmp_path / "work")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"error: --handoff-key {key}: " in err
    assert why in err
    assert "at least 32 random bytes" in err
    assert not (tmp_path / "work").exists()  # refused before anything else


def test_the_listen_address_defaults_to_every_interface_and_the_advertised_host_to_the_pod_ip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "handoff.key"
    key.write_bytes(bytes(32))
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    settings = handoff_from(parse_args(["--node", "n", "--handoff-key", str(key)]))
    assert DEFAULT_HANDOFF_LISTEN == "0.0.0.0:9447"
    assert settings is not None
    assert (settings.host, settings.port, settings.advertise) == ("0.0.0.0", 9447, "10.1.2.3")
    assert settings.key == bytes(32)
    tests = handoff_from(parse_args(["--node", "n", "--handoff-key", str(key),
                                     "--handoff-listen", "127.0.0.1:0"]))
    assert tests is not None
    assert (tests.host, tests.port) == ("127.0.0.1", 0)


def test_every_interface_with_nothing_to_advertise_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "handoff.key"
    key.write_bytes(bytes(32))
    monkeypatch.delenv("POD_IP", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--node", "n", "--handoff-key", str(key)])
    assert "--handoff-advertise" in capsys.readouterr().err


def test_a_malformed_listen_address_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--node", "n", "--handoff-listen", "nowhere"])
    assert "--handoff-listen 'nowhere': not HOST:PORT" in capsys.readouterr().err


def test_without_the_key_flag_the_agent_has_no_handoff() -> None:
    assert handoff_from(parse_args(["--node", "n"])) is None


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "annotations": annotations}}


def test_the_kubelet_role_holds_restore_handoff_pods_for_the_agent() -> None:
    handoff = protocol.restore_handoff_request(checkpoint_id="ck", source="default/app",
                                               source_uid="u", restore_key="m/1", loader=None)
    assert awaits_restore(pod(handoff))
    assert awaits_restore(pod({protocol.RESTORE_ARTIFACT: "r/x@sha256:" + "0" * 64}))
    assert not awaits_restore(pod({protocol.RESTORE_KEY: "m/1"}))  # a cold boot
