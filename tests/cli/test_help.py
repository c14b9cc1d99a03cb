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
