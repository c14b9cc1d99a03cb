"""A handoff server in a process of its own, for the test that kills it mid-stream.

``python -m tests.agent.handoff_source KEY_FILE ARCHIVE CHECKPOINT TARGET_NODE`` offers the
one archive to the target node and prints ``ADDRESS host:port`` once it listens, then
serves until killed. Used by ``tests/agent/test_handoff_killed_source.py``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from drivers.agent.handoff import HandoffServer
from drivers.registry.checkpoints import Archive

ADDRESS = "ADDRESS "


async def serve(key: bytes, archive: str, checkpoint_id: str, target_node: str) -> None:
    async with HandoffServer(key) as server:
        server.offer(checkpoint_id, [Archive("app", Path(archive))], source_uid="uid-source",
                     target_node=target_node)
        print(ADDRESS + server.address, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    key_file, archive, checkpoint_id, target_node = sys.argv[1:5]
    asyncio.run(serve(Path(key_file).read_bytes(), archive, checkpoint_id, target_node))
