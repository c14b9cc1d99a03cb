"""Running the tools we did not write (skopeo, openssl) from the sealing tests."""

from __future__ import annotations

import asyncio

TIMEOUT = 60  # seconds for one subprocess; a copy here takes a fraction of one


async def run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """The exit code and output (stdout and stderr) of ``args``, within ``TIMEOUT``
    (killed and waited for after it)."""
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(TIMEOUT):
            said, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, said.decode("utf-8", "replace")
