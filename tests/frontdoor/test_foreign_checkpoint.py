"""A Restore brings back only its own namespace's checkpoints: the front door acts with
its own rights, so a Restore in one namespace naming another's checkpoint by
``spec.operationID`` would restore that pod (its memory, its identity) for whoever may
create Restores anywhere."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.errors import UsageError
from controlplane.frontdoor.requests import refuse_foreign_checkpoint
from controlplane.machines.base.requests import Checkpoint


def checkpoint(namespace: str) -> Checkpoint:
    return Checkpoint(operation_id="op-1", kind="checkpoint", phase="Succeeded",
                      namespace=namespace, name="db", source_uid="u-1",
                      artifact="r.io/c@sha256:" + "0" * 64,
                      verified_at=datetime(2026, 11, 26, tzinfo=UTC), template=None,
                      klass=None)


def restore(namespace: str) -> dict[str, object]:
    return {"kind": "Restore", "metadata": {"namespace": namespace, "name": "copy"},
            "spec": {"operationID": "op-1", "nodeName": "node-2"}}


def test_a_restore_of_another_namespaces_checkpoint_is_refused_naming_both() -> None:
    with pytest.raises(UsageError, match=r"checkpoint is of a pod in namespace payments, "
                                         r"not tenant-a") as err:
        refuse_foreign_checkpoint(restore("tenant-a"), checkpoint("payments"))
    assert "its own namespace" in err.value.hint


def test_a_restore_of_its_own_namespaces_checkpoint_goes_on() -> None:
    refuse_foreign_checkpoint(restore("payments"), checkpoint("payments"))
