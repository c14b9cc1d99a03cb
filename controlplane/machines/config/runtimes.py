"""Which restore path a node takes, decided from the runtime it reports. Pure.

A node reports its container runtime in ``status.nodeInfo.containerRuntimeVersion``
(``cri-o://1.36.3``, ``containerd://2.1.0``, ``sim://1``...). The control plane restores
in one of two ways:

- :attr:`RestorePath.RUNTIME` (``cri-o``): the kubelet's checkpoint API captures each
  container, and CRI-O itself restores a container whose image is a checkpoint image
  of it. The restore pod names the per-container checkpoint images
  (:data:`~controlplane.machines.contract.protocol.MANIFEST_CONTAINER_IMAGES`) as its
  containers' images; the node agent only reports when CRI-O has restored them.
- :attr:`RestorePath.AGENT` (``agent``): the node agent captures and restores with its
  own dumper (the podman/CRIU agent, the simulator's marker); the restore pod keeps its
  template's images and the agent restores into it.

A runtime that can checkpoint but not restore (containerd: the CRI has no restore and
containerd does not restore from an image) or that we do not know is refused, before
anything is frozen, with a reason naming the runtime (:func:`restore_path` returns it as
a string). A checkpoint class may say otherwise per runtime name (``runtimes:
{"my-crio": "cri-o"}``): the class setting wins over what the name implies. A node that
reports nothing is taken as an agent node (the simulator's nodes without ``nodeInfo``,
nodes some tests register by hand).

Used by the submission checks (``controlplane.machines.submission``), the restore step
(``controlplane.machines.stages.restore``) and the dry run.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class RestorePath(StrEnum):
    RUNTIME = "cri-o"
    AGENT = "agent"


#: Runtimes the node agent restores on (``<scheme>://`` of containerRuntimeVersion).
AGENT_RUNTIMES = frozenset({"sim", "podman"})
#: Runtimes that restore a checkpoint image themselves.
RESTORING_RUNTIMES = frozenset({"cri-o"})


def runtime_name(version: str) -> str:
    """``cri-o`` of ``cri-o://1.36.3``; ``""`` when the node reports nothing."""
    return version.partition("://")[0].strip().lower() if version else ""


def restore_path(version: str,
                 overrides: Mapping[str, str] | None = None) -> RestorePath | str:
    """The path a node reporting ``version`` takes, or why it cannot restore at all.
    ``overrides`` (a checkpoint class's ``runtimes``) maps a runtime name to a path: a
    CRI-O build that names itself otherwise, or the agent on a node an operator runs it on."""
    name = runtime_name(version)
    chosen = (overrides or {}).get(name)
    if chosen is not None:
        return RestorePath(chosen)
    if not name or name in AGENT_RUNTIMES:
        return RestorePath.AGENT
    if name in RESTORING_RUNTIMES:
        return RestorePath.RUNTIME
    if name == "containerd":
        return (f"its runtime {version} cannot restore a checkpoint (containerd checkpoints "
                "through the kubelet but has no restore from a checkpoint image; only CRI-O "
                "does): pick a node running CRI-O")
    return (f"its runtime {version} is not one the control plane restores on (CRI-O, or "
            "the node agent's podman/simulated runtimes)")


def paths_agree(source: RestorePath, target: RestorePath) -> bool:
    """A checkpoint taken on ``source`` can be restored on ``target``: CRI-O restores only
    archives CRI-O wrote; the agent's archives need the agent."""
    return source is target
