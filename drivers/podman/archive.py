"""Make a podman checkpoint archive restorable on another node of the same host.

podman 4.3 writes the checkpointed container's ``conmonPidFile`` and ``pid_file`` into
the archive's ``config.dump`` as absolute paths under *its* run root, and ``podman
container restore --import`` keeps them: on another node (another run root), or once
the source container is removed, conmon cannot write its pid file and the restore fails
("Failed to write conmon pidfile ... No such file or directory"). With both empty, podman
chooses them under the restoring node's run root, as for any new container.

:func:`make_portable` clears them in place: the rewritten JSON is padded with spaces to
the member's exact size (whitespace is valid JSON), so the archive, possibly hundreds of
MiB of memory pages, is not copied. Called by :meth:`PodmanNode.checkpoint
<drivers.podman.podman.PodmanNode.checkpoint>`.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

CONFIG = "config.dump"
NODE_PATHS = ("conmonPidFile", "pid_file")


class ArchiveUnusable(ValueError):
    """The archive has no readable ``config.dump``."""


def make_portable(archive: Path) -> bool:
    """Clear the node-specific paths of ``archive``'s ``config.dump``; whether it changed."""
    with tarfile.open(archive, "r:") as tar:
        member = next((m for m in tar if m.isfile() and m.name.lstrip("./") == CONFIG), None)
        if member is None:
            raise ArchiveUnusable(f"{archive} holds no {CONFIG}")
        offset, size = member.offset_data, member.size
        extracted = tar.extractfile(member)
        assert extracted is not None
        raw = extracted.read()
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise ArchiveUnusable(f"{archive}: {CONFIG} is not JSON: {exc}") from exc
    if not any(config.get(key) for key in NODE_PATHS):
        return False
    for key in NODE_PATHS:
        if key in config:
            config[key] = ""
    rewritten = json.dumps(config).encode()
    if len(rewritten) > size:  # cannot happen: only strings were shortened
        raise ArchiveUnusable(f"{archive}: the rewritten {CONFIG} does not fit")
    with archive.open("r+b") as out:
        out.seek(offset)
        out.write(rewritten.ljust(size, b" "))
    return True
