"""Shell completion for ``cpctl``, ``kubectl-checkpoint`` and ``kubectl checkpoint``.

One engine, read off the parser itself (:func:`complete`: verbs, a verb's flags, a flag's
choices), answers in the protocol of Cobra's ``__complete`` command, which kubectl (1.26
and later) speaks to a plugin's ``kubectl_complete-<plugin>`` executable: one candidate a
line (``VALUE<TAB>description``), then ``:N``, N the ShellCompDirective bits (4: no file
names; 2: no space after; 0: the shell's default, file names). Three callers ask it:
``kubectl __complete checkpoint ...`` through ``kubectl_complete-checkpoint`` (a console
script, ``main.kubectl_complete``), and the bash and zsh scripts ``cpctl completion
bash|zsh`` prints, which run ``cpctl __complete WORDS...`` (or ``kubectl-checkpoint
__complete``) on each TAB. Standard library only at import: a TAB must stay quick.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from controlplane.cli import plugin
from controlplane.cli.retention import VERBS as HISTORY_VERBS

#: ``cpctl __complete WORDS...``: the engine's door (not a verb: never in ``--help``).
HIDDEN_VERB = "__complete"
SHELLS = ("bash", "zsh")
#: Cobra's ShellCompDirective bits.
NO_SPACE, NO_FILES, DEFAULT = 2, 4, 0
#: A flag value that is a file: the shell completes file names for it.
_PATH_WORDS = ("FILE", "PATH", "PEM", "DIR", "KUBECONFIG", "LAYOUT", "SPEC", "ARCHIVE")

Candidates = tuple[list[tuple[str, str]], int]


def subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[
        argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)


def _values(action: argparse.Action) -> int:
    """How many words an option consumes after it (0: a switch, ``--wait``)."""
    if action.nargs is None:
        return 1
    return action.nargs if isinstance(action.nargs, int) else 1


def _short(text: str | None) -> str:
    """A help text's first clause, for the description beside a candidate."""
    if not text or text == argparse.SUPPRESS:
        return ""
    cuts = [m.start() for m in re.finditer(r"; | \(|: ", text)
            if text[:m.start()].count("`") % 2 == 0]  # never inside a `quote`
    first = text[:cuts[0] if cuts else len(text)].strip()
    return first if len(first) <= 60 else first[:59] + "…"


def _is_path(action: argparse.Action) -> bool:
    said = f"{action.metavar or ''} {action.dest}".upper()
    return any(word in said for word in _PATH_WORDS)


def _value_of(action: argparse.Action | str, prefix: str) -> Candidates:
    """The candidates for an option's value (``action``, or one of kubectl's flags)."""
    if isinstance(action, str):  # kubectl's --context / --namespace / --kubeconfig
        if action == "context":
            try:
                path = plugin.kubeconfig_path(None, os.environ)
                contexts = list(plugin.Kubeconfig.read(path).namespaces) if path else []
            except Exception:  # a broken kubeconfig completes nothing, never a traceback
                contexts = []
            return [(c, "kubeconfig context") for c in contexts], NO_FILES
        return [], DEFAULT if action == "kubeconfig" else NO_FILES
    if action.choices is not None:
        return [(str(c), "") for c in action.choices], NO_FILES
    return [], DEFAULT if _is_path(action) else NO_FILES


def complete(parser: argparse.ArgumentParser, words: Sequence[str], *,
             kubectl: bool) -> Candidates:
    """The candidates for the last of ``words`` (the words after the program's name; the
    last is the one being typed, ``""`` for a new one), each with a description, and the
    directive. ``kubectl``: kubectl's ``--context``, ``-n``, ``--kubeconfig`` too."""
    done, prefix = list(words[:-1]), (words[-1] if words else "")
    current, positionals = parser, 0
    waiting: argparse.Action | str | None = None  # the option whose value comes next
    options_over = False
    i = 0
    while i < len(done):
        word = done[i]
        i += 1
        if waiting is not None:
            waiting = None
            continue
        if word == "--":
            options_over = True
            continue
        if word.startswith("-") and word != "-" and not options_over:
            flag, eq, _ = word.partition("=")
            if kubectl and flag in plugin.FLAGS:
                waiting = None if eq else plugin.FLAGS[flag]
            elif (action := _option(current, flag)) is not None and not eq and \
                    _values(action):
                waiting = action
                i += _values(action) - 1  # nargs=3: the last value is the one waited for
            continue
        sub = subparsers(current)
        if sub is not None and positionals == 0:
            if word == "history" and i < len(done) and done[i] in HISTORY_VERBS:
                word = f"history-{done[i]}"  # `history prune`: routed as main routes it
                i += 1
            if word in sub.choices:
                current = sub.choices[word]
                continue
        positionals += 1
    if waiting is not None:
        return _value_of(waiting, prefix)
    if prefix.startswith("-") and not options_over:
        flag, eq, value = prefix.partition("=")
        if eq:  # --output=js: the flag's values, said whole (the shell trims the flag)
            theirs = plugin.FLAGS.get(flag) if kubectl else None
            found, directive = _value_of(theirs or _option(current, flag) or flag, value)
            return [(f"{flag}={v}", d) for v, d in found if v.startswith(value)], directive
        return _flags(current, kubectl, prefix), NO_FILES
    sub = subparsers(current)
    if sub is not None and positionals == 0:
        verbs = [(c.dest, _short(c.help)) for c in sub._choices_actions]
        return [(v, d) for v, d in verbs if v.startswith(prefix)], NO_FILES
    found, directive = _positional(current, positionals)
    if current.prog.endswith(" history") and positionals == 0:
        found = [(v, "") for v in HISTORY_VERBS] + found
    return [(v, d) for v, d in found if v.startswith(prefix)], directive


def _flags(parser: argparse.ArgumentParser, kubectl: bool, prefix: str) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith(prefix):
                seen.append((flag, _short(action.help)))
    if kubectl:
        seen += [(f, "kubectl's flag") for f in plugin.FLAGS if f.startswith(prefix)
                 and f not in parser._option_string_actions]
    return seen


def _positional(parser: argparse.ArgumentParser, index: int) -> Candidates:
    """The candidates for the ``index``-th positional argument of a verb."""
    taken = [a for a in parser._actions if not a.option_strings
             and not isinstance(a, argparse._SubParsersAction)]
    if not taken:
        return [], NO_FILES
    return _value_of(taken[min(index, len(taken) - 1)], "")


def answer(parser: argparse.ArgumentParser, words: Sequence[str], *, kubectl: bool) -> int:
    """Print the candidates for ``words`` in Cobra's protocol; exit 0 (any failure prints
    no candidate and the default directive: completion must never break a shell)."""
    try:
        found, directive = complete(parser, words, kubectl=kubectl)
    except Exception:
        found, directive = [], DEFAULT
    lines = [f"{v}\t{d}" if d else v for v, d in found]
    if any(v.endswith("=") for v, _ in found):
        directive |= NO_SPACE
    sys.stdout.write("".join(f"{line}\n" for line in lines) + f":{directive}\n")
    return 0


BASH = r"""# bash completion for cpctl and kubectl-checkpoint (`cpctl completion bash`).
# Load it: source <(cpctl completion bash)   (or save it in ~/.local/share/bash-completion/
# completions/cpctl). `kubectl checkpoint <TAB>` is kubectl's own completion, which asks
# kubectl_complete-checkpoint (installed beside cpctl).
_cpctl_complete() {
    local line=${COMP_LINE:0:COMP_POINT} out directive cur trim c
    local -a words
    read -r -a words <<< "$line"
    [[ $line =~ [[:space:]]$ ]] && words+=("")
    cur=${words[${#words[@]}-1]}
    out=$("${words[0]}" __complete "${words[@]:1}" 2>/dev/null) || return 0
    directive=${out##*:}
    [[ $directive =~ ^[0-9]+$ ]] || directive=0
    # bash splits the word being typed at = and : (COMP_WORDBREAKS): reply with what
    # comes after the last of them.
    trim=""
    [[ $cur == *[=:]* ]] && trim=${cur%"${cur##*[=:]}"}
    COMPREPLY=()
    while IFS= read -r c; do
        [[ -z $c || $c == :* ]] && continue
        c=${c%%$'\t'*}
        COMPREPLY+=("${c#"$trim"}")
    done <<< "$out"
    (( directive & 2 )) && compopt -o nospace 2>/dev/null
    if (( ${#COMPREPLY[@]} == 0 && (directive & 4) == 0 )); then
        compopt -o default 2>/dev/null
    fi
    return 0
}
complete -F _cpctl_complete cpctl kubectl-checkpoint
"""

ZSH = r"""#compdef cpctl kubectl-checkpoint
# zsh completion for cpctl and kubectl-checkpoint (`cpctl completion zsh`).
# Load it after compinit: source <(cpctl completion zsh)   (or save it as _cpctl in a
# directory of $fpath). `kubectl checkpoint <TAB>` is kubectl's own completion, which
# asks kubectl_complete-checkpoint (installed beside cpctl).
_cpctl() {
    local out directive line value
    local -a lines comps
    out=$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null) || return 1
    lines=("${(@f)out}")
    directive=${lines[-1]#:}
    [[ $directive == <-> ]] || directive=0
    for line in "${(@)lines[1,-2]}"; do
        [[ -z $line ]] && continue
        value=${line%%$'\t'*}
        if [[ $line == *$'\t'* ]]; then
            comps+=("${value//:/\\:}:${line#*$'\t'}")
        else
            comps+=("${value//:/\\:}")
        fi
    done
    if (( ${#comps} )); then
        if (( directive & 2 )); then
            _describe -t values cpctl comps -S ''
        else
            _describe -t values cpctl comps
        fi
    elif (( (directive & 4) == 0 )); then
        _files
    fi
}
if [[ $funcstack[1] == _cpctl ]]; then
    _cpctl "$@"  # autoloaded from $fpath
else
    compdef _cpctl cpctl kubectl-checkpoint
fi
"""


async def completion_cmd(args: argparse.Namespace) -> int:
    """``cpctl completion bash|zsh``: print the script."""
    sys.stdout.write(BASH if args.shell == "bash" else ZSH)
    return 0
