"""``--help`` teaches with examples, and every example is a command the parser accepts."""

from __future__ import annotations

import re
import shlex

import pytest

from controlplane.cli.main import EXAMPLES, build_parser


def example_lines() -> list[str]:
    return [line.strip() for text in EXAMPLES.values() for line in text.splitlines()
            if line.strip().startswith("cpctl ")]


@pytest.mark.parametrize("line", example_lines())
def test_every_help_example_parses(line: str) -> None:
    command = re.split(r"\s+(#|>)\s*", line)[0]
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert args.handler is not None


def test_every_verb_with_examples_shows_them_in_its_help(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    for verb, text in EXAMPLES.items():
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([verb, "--help"])
        assert exited.value.code == 0
        assert text.splitlines()[1].strip() in capsys.readouterr().out


def test_the_verbs_people_use_first_come_first_in_help(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    listed = re.findall(r"^    ([a-z][a-z-]*)\s", capsys.readouterr().out, flags=re.M)
    assert listed[:6] == ["migrate", "checkpoint", "suspend", "resume", "restore", "drain"]
    assert listed.index("history") < listed.index("db") < listed.index("submit")
    assert listed.index("worker") > listed.index("report")


@pytest.mark.parametrize(("typed", "said"), [
    ("migrat", "unknown verb 'migrat': did you mean 'migrate'?"),
    ("histroy", "unknown verb 'histroy': did you mean 'history'?"),
    ("xyzzy", "unknown verb 'xyzzy'; the verbs are migrate, checkpoint, suspend"),
])
def test_a_mistyped_verb_suggests_the_nearest_and_never_the_internal_ones(
        capsys: pytest.CaptureFixture[str], typed: str, said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([typed])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "history-prune" not in err
    assert err.count("\n") == 1
