"""``cpctl`` as a kubectl plugin: ``kubectl checkpoint VERB ...`` runs ``kubectl-checkpoint``.

kubectl finds ``kubectl-checkpoint`` on PATH and runs it with the words after the plugin's
name unchanged, its own ``--kubeconfig``, ``--context`` and ``--namespace``/``-n``
included. This module is the plugin's side of that: the name the program was run by
(:func:`shown_name`: help and errors then say ``kubectl checkpoint``), those three flags
taken from anywhere on the line (:func:`take_flags`; kubectl users put them before or
after the verb), and what they mean for the parsed verb (:func:`apply`): the kubeconfig
(the flag, else ``$CONTROLPLANE_KUBECONFIG``, ``$KUBECONFIG``, ``~/.kube/config``) and
context a cluster verb connects and is recorded with, and the namespace of a bare POD
(``-n``, else the context's namespace, else ``default``, as kubectl). ``main`` calls it
before and after parsing, ``completion`` for context names. Standard library only at
import (the parser imports it); a kubeconfig is read with PyYAML when a verb needs it.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.errors import UsageError

CPCTL = "cpctl"
#: The executable kubectl runs for ``kubectl checkpoint`` (and the one it asks for
#: completions, ``kubectl_complete-checkpoint``).
EXECUTABLE = "kubectl-checkpoint"
#: kubectl's flags the plugin honours, each taking a value: the spelling -> its name.
FLAGS = {"--kubeconfig": "kubeconfig", "--context": "context", "--namespace": "namespace",
         "-n": "namespace"}
#: The verbs whose POD argument (``workload``) a namespace qualifies.
POD_VERBS = ("checkpoint", "migrate", "suspend", "resume", "checkpoints")


@dataclass(frozen=True)
class KubectlFlags:
    """kubectl's flags as given on the command line (``None``: not given)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


def shown_name(argv0: str) -> str:
    """The name help and errors use: ``kubectl checkpoint`` when run as
    ``kubectl-checkpoint`` (kubectl's plugin, or krew's symlink to it), else ``cpctl``."""
    base = os.path.basename(argv0).removesuffix(".exe")
    if base.startswith("kubectl-"):  # kubectl-foo_bar is `kubectl foo-bar` (kubectl's rule)
        return "kubectl " + base.removeprefix("kubectl-").replace("-", " ").replace("_", "-")
    return CPCTL


def is_kubectl(name: str) -> bool:
    return name != CPCTL


def say(text: str, name: str) -> str:
    """``text`` (help, an error) with ``cpctl`` said the way the user called it."""
    return text if name == CPCTL else re.sub(r"\bcpctl\b", name, text)


def take_flags(argv: Sequence[str]) -> tuple[list[str], KubectlFlags]:
    """``argv`` without kubectl's flags, and their values. Each is accepted anywhere before
    ``--``, as ``--flag VALUE``, ``--flag=VALUE``, ``-n VALUE``, ``-nVALUE`` or
    ``-n=VALUE``; given twice, the last wins (as kubectl)."""
    rest: list[str] = []
    found: dict[str, str] = {}
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            rest.extend(words[i:])
            break
        flag, eq, value = word.partition("=")
        if flag not in FLAGS and word.startswith("-n") and not word.startswith("--"):
            flag, eq, value = "-n", "=", word[2:].removeprefix("=")  # -nVALUE, -n=VALUE
        if flag not in FLAGS or (flag == "-n" and word.startswith("--")):
            rest.append(word)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(words):
                raise UsageError(f"flag needs an argument: {flag}")
            value = words[i + 1]
            i += 1
        if not value:
            raise UsageError(f"flag needs an argument: {flag}")
        found[FLAGS[flag]] = value
        i += 1
    return rest, KubectlFlags(**found)


def kubeconfig_path(given: str | None, environ: Mapping[str, str]) -> str | None:
    """The kubeconfig as kubectl picks it: ``given``, else ``$KUBECONFIG`` (a list of
    files, merged), else ``~/.kube/config`` when it exists."""
    if given:
        return given
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    home = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    return home if os.path.exists(home) else None


@dataclass(frozen=True)
class Kubeconfig:
    """What the plugin reads of a kubeconfig: its current context and each context's
    namespace (files of a list merged as kubectl does: the first to set a value wins)."""

    current: str | None
    namespaces: dict[str, str | None]

    @classmethod
    def read(cls, path: str) -> Kubeconfig:
        import yaml  # only for a verb that needs the context's namespace, or completion

        current: str | None = None
        namespaces: dict[str, str | None] = {}
        for file in (p for p in path.split(os.pathsep) if p):
            try:
                with open(os.path.expanduser(file), encoding="utf-8") as f:
                    doc: Any = yaml.safe_load(f)
            except FileNotFoundError:
                continue  # kubectl skips a missing file of the list
            except (OSError, yaml.YAMLError) as exc:
                raise UsageError(f"cannot read kubeconfig {file}: {exc}") from None
            if not isinstance(doc, dict):
                continue
            current = current or (str(doc["current-context"]) if doc.get("current-context")
                                  else None)
            for entry in doc.get("contexts") or []:
                if isinstance(entry, dict) and entry.get("name") is not None and \
                        str(entry["name"]) not in namespaces:
                    inner = entry.get("context")
                    ns = inner.get("namespace") if isinstance(inner, dict) else None
                    namespaces[str(entry["name"])] = str(ns) if ns else None
        return cls(current, namespaces)

    def namespace(self, context: str | None, path: str) -> str:
        """The namespace of ``context`` (else the current one), ``default`` if it sets
        none; a context the kubeconfig lacks is refused, as kubectl does."""
        name = context or self.current
        if name is None:
            return "default"
        if name not in self.namespaces:
            raise UsageError(f"context {name!r} does not exist in kubeconfig {path}",
                             hint=f"its contexts: {', '.join(self.namespaces) or 'none'}")
        return self.namespaces[name] or "default"


def apply(args: argparse.Namespace, flags: KubectlFlags,
          environ: Mapping[str, str] | None = None) -> None:
    """Give the parsed verb kubectl's flags: the kubeconfig and context to any verb that
    reaches a cluster, ``-n`` to ``list``'s namespace filter, and a namespace to a bare
    POD. Verbs that take neither a cluster nor a pod (``history ID``...) ignore them."""
    env = os.environ if environ is None else environ
    if hasattr(args, "kubeconfig") and not getattr(args, "in_cluster", False):
        # --kubeconfig wins; then cpctl's own $CONTROLPLANE_KUBECONFIG (the parsed default).
        args.kubeconfig = kubeconfig_path(flags.kubeconfig or args.kubeconfig, env)
    if flags.context is not None or not hasattr(args, "context"):
        args.context = flags.context
    if args.verb == "list" and flags.namespace is not None:
        args.namespace = flags.namespace
    workload = getattr(args, "workload", None)
    if args.verb not in POD_VERBS or not workload:
        return
    if "/" in workload:
        given = workload.split("/", 1)[0]
        if flags.namespace is not None and given != flags.namespace:
            raise UsageError(f"{workload} names namespace {given!r} but -n says "
                             f"{flags.namespace!r}", hint="give the namespace once")
        return
    namespace = flags.namespace
    if namespace is None:
        path = kubeconfig_path(flags.kubeconfig or getattr(args, "kubeconfig", None), env)
        namespace = Kubeconfig.read(path).namespace(flags.context, path) if path else \
            "default"
    args.workload = f"{namespace}/{workload}"
