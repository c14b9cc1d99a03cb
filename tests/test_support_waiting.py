"""``eventually``, the tests' one poll: it returns the check's first truthy result, and a
wait that runs out fails saying what it waited for and what it saw last."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.waiting import WaitTimedOut, eventually, wait_for

LIMIT, EVERY = 0.2, 0.005  # seconds: a wait meant to run out, run out quickly


@dataclass(frozen=True)
class Pod:
    """A check's result whose truthiness is the condition: the pod is Running."""

    phase: str

    def __bool__(self) -> bool:
        return self.phase == "Running"


def phases(*seen: str) -> Iterator[Pod]:
    """``seen`` in order, then the last one for ever."""
    yield from (Pod(p) for p in seen)
    while True:
        yield Pod(seen[-1])


async def test_a_check_that_comes_true_returns_its_truthy_result() -> None:
    seen = phases("Pending", "ContainerCreating", "Running")
    assert await eventually(lambda: next(seen), what="web Running") == Pod("Running")


async def test_an_async_check_is_awaited() -> None:
    seen = phases("Pending", "Running")

    async def check() -> Pod:
        return next(seen)

    assert await eventually(check, limit_seconds=LIMIT, every=EVERY) == Pod("Running")


async def test_a_check_never_true_fails_naming_what_it_waited_for_and_the_last_result() -> None:
    seen = phases("Pending", "ContainerCreating")
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: next(seen), what="web Running", limit_seconds=LIMIT, every=EVERY)
    message = str(caught.value)
    assert message.startswith("timed out after 0.2 s waiting for web Running; last saw: ")
    assert message.endswith("Pod(phase='ContainerCreating')")  # the last, not the first


async def test_describe_says_what_was_seen_when_the_result_is_a_bare_bool() -> None:
    pod = {"phase": "Pending", "node": "node-1"}
    with pytest.raises(AssertionError, match=r"last saw: \{'phase': 'Pending', 'node': "
                                             r"'node-1'\}$"):
        await eventually(lambda: pod["phase"] == "Running", what="web Running",
                         describe=lambda: pod, limit_seconds=LIMIT, every=EVERY)


async def test_a_retried_exception_is_what_was_last_seen() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("connect to 127.0.0.1:5000")

    with pytest.raises(AssertionError, match=r"waiting for the registry; last saw: "
                                             r"ConnectionRefusedError\('connect to"):
        await eventually(refused, what="the registry", retry_on=(ConnectionError,),
                         limit_seconds=LIMIT, every=EVERY)


async def test_any_other_exception_from_the_check_ends_the_wait_at_once() -> None:
    calls = []

    def gone() -> bool:
        calls.append(1)
        raise LookupError("the worker stopped before the condition held")

    with pytest.raises(LookupError):
        await eventually(gone, limit_seconds=30)
    assert len(calls) == 1


async def test_the_checks_own_timeout_is_not_taken_for_the_waits() -> None:
    def slow() -> bool:
        raise TimeoutError("the check's own request timed out")

    with pytest.raises(TimeoutError, match="own request") as caught:
        await eventually(slow, limit_seconds=30)
    assert not isinstance(caught.value, AssertionError)


async def test_a_check_that_never_returns_is_reported_as_such() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()  # nobody sets it
        return True

    with pytest.raises(AssertionError, match="last saw: nothing"):
        await eventually(hangs, limit_seconds=LIMIT, every=EVERY)


async def test_the_failure_is_still_a_timeout_for_callers_that_catch_one() -> None:
    """Callers written when ``eventually`` raised a bare ``TimeoutError`` catch it to add
    their own context; they still can."""
    with pytest.raises(TimeoutError):
        await eventually(lambda: False, limit_seconds=LIMIT, every=EVERY)
    assert issubclass(WaitTimedOut, AssertionError)


def test_the_blocking_wait_names_the_last_result_too() -> None:
    seen = phases("Pending")
    with pytest.raises(AssertionError, match=r"waiting for web; last saw: Pod\(phase='Pending'"):
        wait_for(lambda: next(seen), "web", limit=0.1)
