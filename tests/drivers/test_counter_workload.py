"""The counter workload (drivers.podman.workload): its command line and, run natively,
that rewriting its memory at a stated rate keeps every page's pattern."""

from __future__ import annotations

import subprocess
from pathlib import Path

from drivers.podman.workload import COUNTER_C, command, parse_ticks


def test_command_names_seed_and_dirty_rate_only_when_asked() -> None:
    assert command(64, 50) == ["/bin/counter", "64", "50"]
    assert command(64, 50, seed=3) == ["/bin/counter", "64", "50", "3"]
    assert command(64, 50, dirty_mib_per_s=4) == ["/bin/counter", "64", "50", "0", "4"]


def test_a_counter_dirtying_its_memory_keeps_every_pattern(tmp_path: Path) -> None:
    source = tmp_path / "counter.c"
    source.write_text(COUNTER_C)
    binary = tmp_path / "counter"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(source)], check=True)
    # 8 MiB rewritten at 200 MiB/s, 10 ms ticks: the whole memory goes round ~12 times.
    argv = [str(binary), *command(8, 10, seed=5, dirty_mib_per_s=200)[1:]]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(60)]
        proc.kill()
    ticks = parse_ticks("".join(lines))
    assert [t.count for t in ticks] == list(range(1, 61))
    assert all(t.ok for t in ticks)
