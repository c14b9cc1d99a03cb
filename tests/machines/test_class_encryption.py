"""A sealed class: its ``encryption`` block parsed (errors name the field), carried by the
capture request to the agent, and by the restore request as the unsealing key's place."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.engine.decider import InvalidSpec
from controlplane.machines.config.classes import class_to_json, parse_class
from controlplane.machines.contract import protocol
from tests.machines.machines_gwt import NS, POD, T0, observe, pod
from tests.machines.test_checkpoint_machine import given

PEM = "-----BEGIN PUBLIC KEY-----\nMFkw...\n-----END PUBLIC KEY-----\n"


def sealed(**encryption: Any) -> dict[str, Any]:
    return {"repository": "registry.example.com/ckpt",
            "encryption": {"recipients": [PEM, "file:/etc/keys/b.pub"], **encryption}}


def test_a_sealed_class_round_trips_through_its_normalised_json() -> None:
    cls = parse_class(sealed(keySecretRef={"name": "checkpoint-keys", "key": "private.pem"}))
    assert cls.encryption is not None
    assert cls.encryption.required
    assert cls.encryption.key == "secret:checkpoint-keys/private.pem"
    assert parse_class(class_to_json(cls)) == cls
    assert class_to_json(cls)["encryption"]["keySecretRef"] == {  # type: ignore[index]
        "name": "checkpoint-keys", "key": "private.pem"}


def test_a_key_file_is_where_the_embedded_default_keeps_its_key() -> None:
    cls = parse_class(sealed(keyFile="/var/lib/controlplane/keys/private.pem"))
    assert cls.unseal_annotation() == "file:/var/lib/controlplane/keys/private.pem"
    assert parse_class(class_to_json(cls)) == cls


def test_a_plain_class_seals_nothing() -> None:
    cls = parse_class({"repository": "registry.example.com/ckpt"})
    assert cls.encryption is None
    assert cls.seal_annotation() == ""
    assert cls.unseal_annotation() == ""
    assert "encryption" not in class_to_json(cls)


@pytest.mark.parametrize(("encryption", "names"), [
    ({"recipients": []}, "class.encryption.recipients must list at least one public key"),
    ({}, "class.encryption.recipients must list at least one public key"),
    ({"recipients": ["ssh-rsa AAAA"]}, "class.encryption.recipients[0] must be"),
    ({"recipients": [PEM], "keyFile": "relative.pem"}, "class.encryption.keyFile must be an "
                                                       "absolute path"),
    ({"recipients": [PEM], "keyFile": "/k", "keySecretRef": {"name": "a", "key": "b"}},
     "give keySecretRef or keyFile, not both"),
    ({"recipients": [PEM], "keySecretRef": {"name": "a"}}, "class.encryption.keySecretRef "
                                                           "must be {name: SECRET, key: KEY}"),
    ({"recipients": [PEM], "required": "yes"}, "class.encryption.required must be true or"),
    ({"recipients": [PEM], "cipher": "des"}, "class.encryption has unknown key(s) cipher"),
])
def test_a_bad_encryption_block_names_the_field_and_the_fix(encryption: dict[str, Any],
                                                            names: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        parse_class({"encryption": encryption})
    assert names in str(raised.value)


def test_the_capture_request_carries_the_recipients_bound_to_its_checkpoint() -> None:
    then = given(**{"class": sealed()}).when(observe({f"{NS}/{POD}": pod()}), T0)
    annotations = then.action("AnnotatePod").params["annotations"]
    assert isinstance(annotations, dict)
    seal = json.loads(str(annotations[protocol.CAPTURE_SEAL]))
    assert seal == {"checkpoint": "ckpt-1", "recipients": [PEM.strip(), "file:/etc/keys/b.pub"],
                    "required": True}


def test_a_plain_capture_request_has_no_seal() -> None:
    then = given().when(observe({f"{NS}/{POD}": pod()}), T0)
    annotations = then.action("AnnotatePod").params["annotations"]
    assert isinstance(annotations, dict)
    assert protocol.CAPTURE_SEAL not in annotations


def test_the_restore_request_names_where_the_unsealing_key_is() -> None:
    ann = protocol.restore_request(artifact="r/c@sha256:" + "a" * 64, restore_key="k",
                                   checkpoint_id="c", loader="{}", unseal="secret:keys/p.pem")
    assert ann[protocol.RESTORE_UNSEAL] == "secret:keys/p.pem"
    plain = protocol.restore_request(artifact="r/c@sha256:" + "a" * 64, restore_key="k",
                                     checkpoint_id="c", loader="{}")
    assert protocol.RESTORE_UNSEAL not in plain
