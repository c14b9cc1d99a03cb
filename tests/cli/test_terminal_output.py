"""``cpctl`` output as a person and a script each see it: tables that fit the terminal (or
``$COLUMNS``) with ``--wide`` for whole values, colour only on a terminal without
``NO_COLOR``, ``--wait`` redrawing one line on a terminal and printing a line per change
otherwise, and ``list`` saying when its limit cut the answer (real subprocesses; the
terminal is a pseudo-terminal)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import update

from controlplane.store import schema
from controlplane.store.database import open_database
from controlplane.store.session import write_txn
from tests.support.cpctl import ROOT, cpctl, in_process

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first

LONG_ID = "a-machine-with-an-id-long-enough-to-be-cut-on-a-narrow-term-01"
WAIT_VERBS = ["checkpoint", "migrate", "suspend", "resume", "restore", "drain", "cancel",
              "retarget"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "TERM")}
    return {**env, "TERM": "xterm", **extra}


def _command(db: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli.main", "--db", db, *args]


def _piped(db: str, *args: str, env: Mapping[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(db, *args), cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=dict(env or _env()))


class Terminal:
    """``cpctl`` with its stdout on a pseudo-terminal of ``columns`` columns."""

    def __init__(self, db: str, *args: str, columns: int = 100,
                 env: Mapping[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        self.proc = subprocess.Popen(_command(db, *args), cwd=ROOT, stdout=slave,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=dict(env or _env()))
        os.close(slave)
        self.seen = b""

    def read_until(self, text: str) -> str:
        """Block on the terminal until ``text`` appeared (or the process ended)."""
        while text.encode() not in self.seen:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the process closed the terminal
                chunk = b""
            if not chunk:
                break
            self.seen += chunk
        return self.seen.decode()

    def finish(self) -> tuple[int, str, str]:
        self.read_until("\0never printed\0")
        _, err = self.proc.communicate(timeout=120)  # and closes the stderr pipe
        os.close(self.master)
        return self.proc.returncode, self.seen.decode(), err.decode()


@pytest.fixture
def five_done(db_url: str) -> str:
    """A database holding five finished ``steps`` machines, one with a long id (made in
    process: what these tests read is the output of the verbs they run themselves)."""
    assert in_process(db_url, "db", "upgrade").returncode == 0
    for machine_id in ("job-1", "job-2", "job-3", "job-4", LONG_ID):
        assert in_process(db_url, "submit", "steps", "--spec", '{"steps": 1}',
                          "--id", machine_id).returncode == 0
    ran = in_process(db_url, "worker", "--until-done", "--poll-seconds", "0.05")
    assert ran.returncode == 0, ran.stderr
    return db_url


def test_report_headers_are_short_with_units_and_the_table_fits_110_columns(
        five_done: str) -> None:
    code, out, err = Terminal(five_done, "report", "operations", columns=110,
                              env=_env(NO_COLOR="1")).finish()
    assert code == 0, err
    lines = out.replace("\r", "").splitlines()
    assert lines[0].split() == ["KIND", "N", "OK", "FAIL", "RUN", "OK", "%", "P50", "S",
                                "P95", "S"]
    assert lines[1].split()[:6] == ["steps", "5", "5", "0", "0", "100.0%"]
    assert "…" not in out
    piped = json.loads(_piped(five_done, "report", "operations", "-o", "json").stdout)
    assert piped[0]["success_rate"] == 1.0  # scripts keep the field names and numbers


def test_list_says_on_stderr_how_many_more_match_beyond_its_limit(five_done: str) -> None:
    cut = _piped(five_done, "list", "--limit", "3")
    assert cut.returncode == 0, cut.stderr
    assert len(cut.stdout.strip().splitlines()) == 1 + 3
    assert cut.stderr.strip() == "showing the newest 3 of 5; --limit N shows more"
    whole = _piped(five_done, "list", "--limit", "5")
    assert (whole.returncode, whole.stderr) == (0, "")
    assert len(whole.stdout.strip().splitlines()) == 1 + 5


def test_list_as_json_carries_the_total_and_the_limit(five_done: str) -> None:
    listed = json.loads(_piped(five_done, "list", "--limit", "2", "-o", "json").stdout)
    assert (len(listed["items"]), listed["total"], listed["limit"]) == (2, 5, 2)


def test_list_help_states_its_default_limit() -> None:
    out = _piped("sqlite://", "list", "--help").stdout
    assert "--limit N" in out
    assert "(default 100)" in out


def test_a_table_fits_the_terminal_cutting_with_an_ellipsis_and_wide_keeps_every_value(
        five_done: str) -> None:
    code, narrow, err = Terminal(five_done, "get", "job-1", columns=72,
                                 env=_env(NO_COLOR="1")).finish()
    assert code == 0, err
    assert all(len(line) <= 72 for line in narrow.splitlines()), narrow
    assert "…" in narrow  # the spec and state JSON were cut
    _, wide, _ = Terminal(five_done, "get", "job-1", "--wide", columns=72,
                          env=_env(NO_COLOR="1")).finish()
    assert "…" not in wide
    assert max(len(line) for line in wide.splitlines()) > 72
    piped = _piped(five_done, "get", "job-1", env=_env(COLUMNS="72"))  # a pipe: no fitting
    assert max(len(line) for line in piped.stdout.splitlines()) > 72


def test_list_keeps_ids_whole_to_be_copied_and_wide_adds_columns(five_done: str) -> None:
    _, narrow, _ = Terminal(five_done, "list", columns=72, env=_env(NO_COLOR="1")).finish()
    assert LONG_ID in narrow
    assert narrow.splitlines()[0].split() == ["ID", "KIND", "WORKLOAD", "NODE", "PHASE", "AGE"]
    _, wide, _ = Terminal(five_done, "list", "--wide", env=_env(NO_COLOR="1")).finish()
    assert "LEASE OWNER" in wide.splitlines()[0]


def test_history_puts_what_each_event_said_beneath_it_whole_and_within_the_terminal(
        five_done: str) -> None:
    """As ``kubectl describe`` does: the event and its phase on one line, its words, who
    recorded it and what it observed indented beneath, wrapped to the terminal, never
    cut; through a pipe, not wrapped at all."""
    _, out, _ = Terminal(five_done, "history", "job-1", columns=80, env=_env(NO_COLOR="1")
                         ).finish()
    lines = out.replace("\r", "").splitlines()
    assert lines[0] == "SEQ  TIME                     EVENT  -> PHASE"
    assert all(len(line) < 80 for line in lines), out
    assert "…" not in out  # nothing cut: the facts are the point
    assert any(line.startswith("       by ") for line in lines), out
    piped = _piped(five_done, "history", "job-1").stdout
    said = [line.strip() for line in piped.splitlines() if line.startswith("       ")]
    joined = " ".join(line.strip() for line in lines if line.startswith("       "))
    for text in said:  # every word of the unwrapped lines is on the terminal too
        assert " ".join(text.split()) in " ".join(joined.split()), text


def test_on_a_terminal_headers_are_bold_and_phases_coloured_within_its_width(
        five_done: str) -> None:
    code, out, err = Terminal(five_done, "history", "job-1", columns=120).finish()
    assert code == 0, err
    assert "\x1b[1mSEQ  TIME" in out
    assert "-> \x1b[32mSucceeded\x1b[0m" not in out  # the arrow is part of the cell
    assert "\x1b[32m-> Succeeded\x1b[0m" in out
    plain = out.replace("\x1b[1m", "").replace("\x1b[32m", "").replace("\x1b[0m", "")
    assert all(len(line) <= 120 for line in plain.splitlines()), plain


def test_no_colour_with_no_color_set_or_through_a_pipe(five_done: str) -> None:
    code, out, _ = Terminal(five_done, "history", "job-1", columns=120,
                            env=_env(NO_COLOR="1")).finish()
    assert code == 0
    assert "Succeeded" in out
    assert "\x1b[" not in out
    piped = _piped(five_done, "history", "job-1")
    assert "-> Succeeded" in piped.stdout
    assert "\x1b[" not in piped.stdout


def _submitted(db: str) -> str:
    assert cpctl(db, "db", "upgrade").returncode == 0
    assert cpctl(db, "submit", "steps", "--spec", '{"steps": 50}', "--id", "job").returncode == 0
    return "job"


def test_cancel_wait_redraws_one_progress_line_on_a_terminal_until_it_settles(
        db_url: str) -> None:
    job = _submitted(db_url)
    code, out, err = Terminal(db_url, "cancel", job, "--wait").finish()
    assert code == 0, err
    assert out.startswith(f"cancel recorded for {job}")
    assert f"\r\x1b[Kcancel {job}:   0.0s Cancelled" in out
    assert out.rstrip().endswith(f"{job}: Cancelled")


def test_the_redrawn_line_is_cut_to_the_terminal_so_redraws_never_stack(db_url: str) -> None:
    assert cpctl(db_url, "db", "upgrade").returncode == 0
    assert cpctl(db_url, "submit", "steps", "--spec", '{"steps": 50}', "--id",
                 LONG_ID).returncode == 0
    code, out, err = Terminal(db_url, "cancel", LONG_ID, "--wait", columns=40).finish()
    assert code == 0, err
    drawn = [part.split("\n")[0].rstrip("\r") for part in out.split("\r\x1b[K")[1:]]
    assert drawn, out
    for line in drawn:
        assert len(line) < 40, line  # the last column stays free: no wrap, no stacking
    assert drawn[-1].startswith(f"cancel {LONG_ID[:20]}")
    assert drawn[-1].endswith("…")


def test_cancel_wait_prints_plain_lines_through_a_pipe(db_url: str) -> None:
    job = _submitted(db_url)
    result = _piped(db_url, "cancel", job, "--wait")
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stdout
    assert "\x1b[" not in result.stdout
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"cancel recorded for {job} (version ")
    assert lines[1].startswith(f"cancel {job}: Cancelled at ")
    assert lines[2:] == [f"{job}: Cancelled"]


def test_wait_follows_any_operation_and_exits_1_unless_it_succeeded(db_url: str) -> None:
    job = _submitted(db_url)
    assert _piped(db_url, "cancel", job).returncode == 0
    result = _piped(db_url, "wait", job)
    assert result.returncode == 1  # cancelled: settled, but not what was asked
    assert result.stdout.strip().splitlines()[-1] == f"{job}: Cancelled"
    unknown = _piped(db_url, "wait", "no-such-machine")
    assert unknown.returncode == 2
    assert "no-such-machine" in unknown.stderr


def test_retarget_wait_on_a_kind_without_retarget_is_refused_naming_it(db_url: str) -> None:
    job = _submitted(db_url)
    assert _piped(db_url, "cancel", job).returncode == 0
    result = _piped(db_url, "retarget", job, "--to", "node-2", "--wait")
    assert result.returncode == 2  # a steps machine takes no Retarget
    assert "Retarget" in result.stderr


async def _hold_lease(db_url: str, machine_id: str) -> None:
    """As a worker that claimed ``machine_id`` and never lets go would."""
    db = open_database(db_url)
    try:
        async with write_txn(db) as conn:
            await conn.execute(update(schema.machines).where(schema.machines.c.id == machine_id)
                               .values(lease_owner="stuck-worker",
                                       lease_expires_at=datetime(2100, 1, 1, tzinfo=UTC)))
    finally:
        await db.dispose()


def test_wait_seconds_gives_up_with_exit_1_and_says_the_operation_keeps_running(
        db_url: str) -> None:
    job = _submitted(db_url)
    asyncio.run(_hold_lease(db_url, job))
    result = _piped(db_url, "cancel", job, "--wait", "--wait-seconds", "0.3")
    assert result.returncode == 1
    assert result.stderr.startswith(f"cpctl: error: cancel {job} is still Cancelled after "
                                    "0s, waiting for its worker to let go of it")
    assert "keeps running" in result.stderr


@pytest.mark.parametrize("verb", WAIT_VERBS)
def test_every_verb_that_waits_explains_wait_and_wait_seconds(verb: str) -> None:
    out = _piped("sqlite://", verb, "--help").stdout
    assert "--wait " in out
    assert "--wait-seconds S" in out
    assert "give up after S seconds" in out
    assert "keeps running" in out


def test_checkpoints_fit_110_columns_with_the_verdict_whole_and_wide_adds_the_artifact(
        tmp_path: Path) -> None:
    """Over the demo's history (a checkpoint, a migration, a suspend, all sealed): on a
    110-column terminal no value is cut and the migration's capture says ``no: deleted``;
    ``--wide`` adds the pinned artifact and says why in a sentence."""
    demo = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "demo"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=_env())
    assert demo.returncode == 0, demo.stdout + demo.stderr
    db = f"sqlite:///{tmp_path / 'var' / 'demo' / 'controlplane.db'}"
    code, out, err = Terminal(db, "checkpoints", columns=110, env=_env(NO_COLOR="1")).finish()
    assert (code, err) == (0, ""), err
    lines = out.replace("\r", "").splitlines()
    assert lines[0].split() == ["ID", "WORKLOAD", "NODE", "CLASS", "SIZE", "AGE", "SEALED",
                                "RESTORABLE"]
    assert all(len(line) <= 110 for line in lines), lines
    assert not any("…" in line for line in lines), lines
    verdicts = {line.split()[1]: line.split("  ")[-1].strip() for line in lines[1:]}
    assert verdicts == {"default/app": "no: deleted", "default/web": "yes",
                        "default/sandbox": "yes"}, lines
    code, wide, _ = Terminal(db, "checkpoints", "--wide", columns=110,
                             env=_env(NO_COLOR="1")).finish()
    assert code == 0
    assert wide.splitlines()[0].split()[-1] == "ARTIFACT"
    assert "no: deleted by garbage collection after the migration's verified restore" in wide
