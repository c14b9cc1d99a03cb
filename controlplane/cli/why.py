"""The "why" of an event as a terminal line: its facts as readable ``key=value`` text.

An event's facts are the observations that justified it, often nested by object
(``{"pod default/app": {"pod": "default/app", "pod_phase": "Running", ...}}``).
:func:`facts_text` flattens them into ``pod=default/app pod_phase=Running ...``:
nested objects contribute their own keys (a pair already shown is not repeated;
two objects that differ keep both values), the
keys that say most come first (what was observed to exist, its phase and node, the
error), values are quoted only when they hold a space, and booleans read
``true``/``false``. :func:`fit` cuts a line to a width with ``…``. Pure; used by
``cpctl history``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

#: Keys (by their last ``_`` word) that explain an event best, in order.
_TELLING = ("present", "phase", "deleting", "node", "ready", "unschedulable", "error",
            "class", "message", "digest", "problem", "command", "action")
#: Said last of all: a UID tells a machine which object, a reader the name beside it does.
_LAST = ("uid",)


def facts_text(facts: Mapping[str, object]) -> str:
    """``key=value`` pairs of ``facts``, most telling first; ``""`` for no facts."""
    pairs: list[tuple[str, str]] = []
    for key, value in _flat(facts):
        pair = (key, _value(value))
        if pair not in pairs:  # two objects observed alike: say it once
            pairs.append(pair)
    ordered = sorted(pairs, key=lambda pair: _rank(pair[0]))
    return " ".join(f"{key}={value}" for key, value in ordered)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``…`` when it was cut."""
    if width < 1 or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def _flat(facts: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in facts.items():
        if isinstance(value, Mapping):
            # "pod default/app": {...} names the object its own keys describe.
            named = any(str(k).split("_")[0] == key.split(" ")[0] for k in value)
            yield from _flat(value, "" if named else f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        text = ",".join(_value(v) for v in value)
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return f'"{text}"' if " " in text or not text else text


def _rank(key: str) -> tuple[int, int, str]:
    last = key.rsplit("_", 1)[-1].rsplit(".", 1)[-1]
    telling = (_TELLING.index(last) if last in _TELLING
               else len(_TELLING) + 1 + _LAST.index(last) if last in _LAST else len(_TELLING))
    # The object's name itself ("pod", "tag", "node") leads its group.
    return (0 if "_" not in key and "." not in key else 1, telling, key)
