"""Checkpoint classes as configuration: ``--class NAME`` looked up in a classes file.

The file (``--classes-file``, else ``$CONTROLPLANE_CLASSES_FILE``; ``deploy/`` mounts its
ConfigMap at ``/etc/controlplane/classes/classes.yaml``) holds ``classes: [...]``, each a
definition :func:`~controlplane.machines.config.classes.parse_class` accepts. The verb embeds
the chosen class's normalised JSON in the operation's spec, so a later edit of the file
never changes a running operation or its replay. ``--repository`` alone stays the short
form (the default class with that repository); with ``--class`` it overrides the class's
repository. Every problem is a ``UsageError`` naming the file, the class and the field.
The parser imports this module for :func:`add_class_options`: PyYAML and the class
definitions are imported when a class is looked up.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.engine.jsonvalue import JsonObject
    from controlplane.machines.config.classes import CheckpointClass

ENV = "CONTROLPLANE_CLASSES_FILE"


def add_class_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repository",
                   help="artifact repository, e.g. registry.example.com/checkpoints "
                   "(required unless --class names a class that has one; resume: default "
                   "the suspension's own class)")
    p.add_argument("--class", dest="class_name", metavar="NAME",
                   help="checkpoint class from the classes file (repository, tag scheme, "
                   "timeouts, retention, saver/loader overrides, on_failure)")
    p.add_argument("--classes-file", default=os.environ.get(ENV), metavar="FILE",
                   help=f"YAML file with `classes: [...]` (default ${ENV})")


def load_classes(path: str) -> dict[str, CheckpointClass]:
    """Every class in ``path`` by name; a bad file is a ``UsageError`` naming the field."""
    import yaml

    from controlplane.engine.decider import InvalidSpec
    from controlplane.machines.config.classes import parse_class

    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read the classes file {path!r}: {exc.strerror}",
                         hint="pass --classes-file FILE or set $" + ENV) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"the classes file {path!r} is not YAML: {exc}") from None
    entries = document.get("classes") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise UsageError(f"the classes file {path!r} must hold `classes:` with a list of "
                         "class definitions")
    found: dict[str, CheckpointClass] = {}
    for i, entry in enumerate(entries):
        try:
            klass = parse_class(entry, field=f"classes[{i}]")
        except InvalidSpec as exc:
            raise UsageError(f"{path}: {exc}") from None
        if klass.name in found:
            raise UsageError(f"{path}: classes[{i}].name {klass.name!r} is defined twice")
        found[klass.name] = klass
    return found


def class_for(args: argparse.Namespace) -> JsonObject:
    """The class an operation verb runs under, as the JSON its spec embeds."""
    chosen = given_class(args)
    if chosen is None:
        raise UsageError("say where checkpoints go: --repository REGISTRY/REPO, or "
                         "--class NAME from a classes file")
    return chosen


def given_class(args: argparse.Namespace) -> JsonObject | None:
    """The class ``--repository``/``--class`` name, or ``None`` when neither is given
    (``resume`` then takes the suspension's own)."""
    from controlplane.engine.decider import InvalidSpec
    from controlplane.machines.config.classes import class_to_json, parse_class

    repository: str | None = args.repository
    if args.class_name is None:
        return None if repository is None else {"repository": repository}
    if not args.classes_file:
        raise UsageError(f"--class {args.class_name} needs a classes file",
                         hint="pass --classes-file FILE or set $" + ENV)
    classes = load_classes(args.classes_file)
    klass = classes.get(args.class_name)
    if klass is None:
        raise UsageError(f"no class {args.class_name!r} in {args.classes_file} (classes: "
                         f"{', '.join(sorted(classes)) or 'none'})")
    chosen = class_to_json(klass)
    if repository is not None:
        try:
            chosen = class_to_json(parse_class({**chosen, "repository": repository}))
        except InvalidSpec as exc:
            raise UsageError(str(exc).replace("class.repository", "--repository")) from None
    return chosen
