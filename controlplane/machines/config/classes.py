"""Checkpoint classes: named configurations of how a workload is checkpointed and restored.

A class names the artifact ``repository`` and the ``tag_scheme`` (which must contain
``{checkpoint_id}``, so a tag is never reused by another checkpoint), the ``timeouts`` of
every waiting phase, the ``retention`` of artifacts (keep the last N, a maximum age,
delete after a successful migration), the saver/loader container overrides (see
:mod:`controlplane.machines.config.containers`), the ``on_failure`` behaviour of a failed
capture (``Resume`` the workload or ``Kill`` it), how many restore attempts a
migration or resume makes, ``encryption`` (the recipients a checkpoint's layers are
sealed for and where the key that unseals them lives: :class:`Encryption`), and
``transfer`` (``registry`` or ``stream``: how a migration carries the checkpoint), and
``history_keep_days``: how long the history of a settled operation of this class is kept
before ``cpctl history prune`` summarises it
(``store/retention.py``; unset: the prune's ``--keep-days`` policy decides).

The submitter resolves a class by name and embeds its normalised JSON in the machine spec,
so a later edit of the class never changes a running machine or its replay.
Pure functions: :func:`parse_class` (validate, raise ``InvalidSpec`` naming the field),
:func:`class_to_json`, :func:`tag_for`, :func:`retention_victims`.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

import orjson

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.machines.base.codec import OMIT_DEFAULT
from controlplane.machines.base.refs import is_valid_tag, parse_repository
from controlplane.machines.config.containers import (
    DEFAULT_LOADER,
    DEFAULT_SAVER,
    Container,
    ContainerOverride,
    merge,
    override_to_json,
    parse_override,
)
from controlplane.machines.config.modes import (
    DEFAULT_MODE,
    DEFAULT_TRANSFER,
    MigrationMode,
    Transfer,
    parse_mode,
    parse_transfer,
)
from controlplane.machines.config.runtimes import RestorePath

DEFAULT_CLASS_NAME = "default"
DEFAULT_REPOSITORY = "localhost:5000/checkpoints"
DEFAULT_TAG_SCHEME = "{namespace}.{pod}.{checkpoint_id}"
TAG_PLACEHOLDERS = frozenset({"checkpoint_id", "namespace", "pod"})
MAX_TIMEOUT = 7 * 86400
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_RUNTIME = re.compile(r"^[a-z0-9][-a-z0-9._]{0,62}$")


class OnFailure(StrEnum):
    """What happens to the workload when its capture fails."""

    RESUME = "Resume"  # withdraw the request: the agent resumes the workload
    KILL = "Kill"  # delete the pod (UID precondition): for workloads that cannot thaw


@dataclass(frozen=True)
class Timeouts:
    """Deadlines, in seconds, of each waiting phase (hang guards)."""

    capture: int = 600  # request -> artifact verified in the registry
    release: int = 120  # withdraw a request / wake in place -> observed
    delete: int = 300  # delete the source -> observed gone or terminating
    resolve: int = 300  # restore/resume: the artifact proven present in the registry
    schedule: int = 300  # restored pod created -> bound to a node
    restore: int = 900  # restored pod created -> running with a fresh identity
    gc: int = 86400  # garbage collection of the artifact, retries included


@dataclass(frozen=True)
class Retention:
    """How long artifacts live. ``None`` disables a rule."""

    keep_last: int | None = None
    max_age_seconds: int | None = None
    delete_after_migration: bool = True


#: Where a key lives, as the node agent resolves it: a file on the node, or a key of a
#: Kubernetes Secret mounted into the agent (``secret:NAME/KEY``; docs/security.md).
KEY_SOURCES = ("file:", "secret:")
PEM_PUBLIC = "-----BEGIN PUBLIC KEY-----"
_SECRET_REF = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True)
class Encryption:
    """A sealed class: its checkpoints' layers are encrypted (ocicrypt, docs/security.md).

    ``recipients``: the public keys the layer keys are wrapped for, each an inline PEM
    (``-----BEGIN PUBLIC KEY-----``), ``file:/path`` on the node or ``secret:NAME/KEY``;
    a new set applies to new checkpoints, old ones stay readable while their key is kept.
    ``key``: where the private key that unseals them is (``secret:NAME/KEY`` from
    ``keySecretRef``, or ``file:/path`` from ``keyFile``). ``required`` (the default): a
    capture whose recipients the agent cannot resolve fails; it never pushes plain text.
    """

    recipients: tuple[str, ...]
    key: str = ""
    required: bool = True

    def seal_annotation(self) -> str:
        """What a capture request carries: the recipients and whether sealing is required."""
        return orjson.dumps({"recipients": list(self.recipients),
                             "required": self.required}).decode()

    def to_json(self) -> JsonObject:
        out: JsonObject = {"recipients": list(self.recipients), "required": self.required}
        if self.key.startswith("secret:"):
            name, _, key = self.key.removeprefix("secret:").partition("/")
            out["keySecretRef"] = {"name": name, "key": key}
        elif self.key:
            out["keyFile"] = self.key.removeprefix("file:")
        return out


@dataclass(frozen=True)
class CheckpointClass:
    name: str = DEFAULT_CLASS_NAME
    repository: str = DEFAULT_REPOSITORY
    tag_scheme: str = DEFAULT_TAG_SCHEME
    timeouts: Timeouts = field(default_factory=Timeouts)
    retention: Retention = field(default_factory=Retention)
    saver: ContainerOverride = field(default_factory=ContainerOverride)
    loader: ContainerOverride = field(default_factory=ContainerOverride)
    on_failure: OnFailure = OnFailure.RESUME
    restore_attempts: int = 3
    #: Owner kinds whose pods this class moves as bare pods (``owners: {Kind: "move"}``):
    #: the operator vouches that the owner does not recreate a deleted pod (an operator
    #: that expects suspend/resume, say). Every other controller-owned pod is refused.
    movable_owners: tuple[str, ...] = field(default=(), metadata=OMIT_DEFAULT)
    #: Days a settled operation's events are kept before a prune replaces them by one
    #: summary row (``None``: the prune's ``--keep-days`` decides).
    history_keep_days: int | None = field(default=None, metadata=OMIT_DEFAULT)
    #: Runtime name -> restore path (``"cri-o"`` or ``"agent"``), over what the node's
    #: reported runtime implies (:mod:`controlplane.machines.config.runtimes`).
    runtimes: tuple[tuple[str, str], ...] = field(default=(), metadata=OMIT_DEFAULT)
    #: Sealed checkpoints: ``None`` pushes plain layers.
    encryption: Encryption | None = field(default=None, metadata=OMIT_DEFAULT)
    #: How this class's migrations move memory unless a migration names its own
    #: (:mod:`controlplane.machines.config.modes`).
    migration_mode: MigrationMode = field(default=DEFAULT_MODE, metadata=OMIT_DEFAULT)
    #: How this class's migrations carry the checkpoint to the target: through the
    #: registry, or streamed agent to agent beside the push (:mod:`...config.modes`).
    transfer: Transfer = field(default=DEFAULT_TRANSFER, metadata=OMIT_DEFAULT)

    def seal_annotation(self) -> str:
        """The capture request's ``capture-seal`` (empty: push plain layers)."""
        return self.encryption.seal_annotation() if self.encryption is not None else ""

    def unseal_annotation(self) -> str:
        """The restore request's ``restore-unseal``: where the unsealing key is (may be empty)."""
        return self.encryption.key if self.encryption is not None else ""

    def runtime_paths(self) -> dict[str, str]:
        return dict(self.runtimes)

    def saver_container(self) -> Container:
        return merge(DEFAULT_SAVER, self.saver)

    def saver_annotation(self) -> str:
        """The merged saver as the agent reads it (kept per class: see ``_annotation``)."""
        return _annotation(DEFAULT_SAVER, self.saver)

    def loader_annotation(self) -> str:
        """The merged loader as the agent reads it (kept per class: see ``_annotation``)."""
        return _annotation(DEFAULT_LOADER, self.loader)

    def loader_container(self) -> Container:
        return merge(DEFAULT_LOADER, self.loader)


@functools.lru_cache(maxsize=256)
def _annotation(default: Container, override: ContainerOverride) -> str:
    # Every machine of a class sends the same merged container, and initial_state builds
    # it on every lease and every replayed machine: merged and serialised once per class.
    return merge(default, override).to_annotation()


DEFAULT_CLASS = CheckpointClass()

_KEYS = {"name", "repository", "tag_scheme", "timeouts", "retention", "saver", "loader",
         "on_failure", "restore_attempts", "owners", "history_keep_days", "runtimes",
         "encryption", "migration_mode", "transfer"}
MAX_HISTORY_KEEP_DAYS = 100 * 366
_OWNER_POLICIES = ("move", "refuse")


def parse_class(data: JsonValue, *, field: str = "class") -> CheckpointClass:
    """Validate a class definition; missing keys take the defaults.

    Every machine embeds its class, and ``initial_state`` parses it on every lease and
    every replayed machine (a third of a rebuild's ``initial_state``), so a valid
    definition's parse is kept, keyed by its canonical JSON. Errors are not kept: each
    names the caller's field.
    """
    if data is None:
        return DEFAULT_CLASS
    key = _canonical(data)
    parsed = _PARSED.get(key) if key is not None else None
    if parsed is None:
        parsed = _parse_class(data, field=field)
        if key is not None and len(_PARSED) < _MAX_PARSED:
            _PARSED[key] = parsed
    return parsed


_PARSED: dict[bytes, CheckpointClass] = {}
_MAX_PARSED = 256  # classes are few; past this, parse each time rather than grow


def _canonical(data: JsonValue) -> bytes | None:
    """``data`` as sorted-key JSON bytes: equal for equal definitions (``true`` is not ``1``)."""
    if not isinstance(data, dict):
        return None
    try:
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON: let the parse say why
        return None


def _parse_class(data: JsonValue, *, field: str) -> CheckpointClass:
    if not isinstance(data, dict):
        raise InvalidSpec(f"{field} must be an object (a checkpoint class definition)")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InvalidSpec(f"{field} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(_KEYS))}")
    name = data.get("name", DEFAULT_CLASS_NAME)
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidSpec(f"{field}.name must be a lowercase DNS label, got {name!r}")
    on_failure = data.get("on_failure", OnFailure.RESUME.value)
    if not isinstance(on_failure, str) or on_failure not in {m.value for m in OnFailure}:
        raise InvalidSpec(f"{field}.on_failure must be 'Resume' or 'Kill', got {on_failure!r}")
    return CheckpointClass(
        name=name,
        repository=parse_repository(data.get("repository", DEFAULT_REPOSITORY),
                                    field=f"{field}.repository"),
        tag_scheme=_tag_scheme(data.get("tag_scheme", DEFAULT_TAG_SCHEME),
                               field=f"{field}.tag_scheme"),
        timeouts=_timeouts(data.get("timeouts"), field=f"{field}.timeouts"),
        retention=_retention(data.get("retention"), field=f"{field}.retention"),
        saver=parse_override(data.get("saver"), field=f"{field}.saver"),
        loader=parse_override(data.get("loader"), field=f"{field}.loader"),
        on_failure=OnFailure(str(on_failure)),
        restore_attempts=_int(data.get("restore_attempts", 3), field=f"{field}.restore_attempts",
                              low=1, high=10),
        movable_owners=_owners(data.get("owners"), field=f"{field}.owners"),
        history_keep_days=_keep_days(data.get("history_keep_days"),
                                     field=f"{field}.history_keep_days"),
        runtimes=_runtimes(data.get("runtimes"), field=f"{field}.runtimes"),
        encryption=_encryption(data.get("encryption"), field=f"{field}.encryption"),
        migration_mode=parse_mode(data.get("migration_mode", DEFAULT_MODE.value),
                                  field=f"{field}.migration_mode"),
        transfer=parse_transfer(data.get("transfer", DEFAULT_TRANSFER.value),
                                field=f"{field}.transfer"),
    )


_ENCRYPTION_KEYS = {"recipients", "keySecretRef", "keyFile", "required"}


def _encryption(data: JsonValue, *, field: str) -> Encryption | None:
    """``{recipients: [...], keySecretRef: {name, key} | keyFile: path, required: bool}``."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InvalidSpec(f"{field} must be an object, e.g. {{recipients: [<PEM public key>], "
                          "keySecretRef: {name: checkpoint-keys, key: private.pem}}")
    unknown = sorted(set(data) - _ENCRYPTION_KEYS)
    if unknown:
        raise InvalidSpec(f"{field} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(_ENCRYPTION_KEYS))}")
    raw = data.get("recipients")
    if not isinstance(raw, list) or not raw:
        raise InvalidSpec(f"{field}.recipients must list at least one public key (an inline "
                          f"PEM '{PEM_PUBLIC}...', 'file:/path' on the node or "
                          "'secret:NAME/KEY'); a sealed class with no recipient could only "
                          "push plain text")
    recipients = []
    for number, item in enumerate(raw):
        where = f"{field}.recipients[{number}]"
        if not isinstance(item, str):
            raise InvalidSpec(f"{where} must be a string, got {item!r}")
        recipients.append(_key_source(item.strip(), field=where, pem=True))
    required = data.get("required", True)
    if not isinstance(required, bool):
        raise InvalidSpec(f"{field}.required must be true or false, got {required!r}")
    if "keySecretRef" in data and "keyFile" in data:
        raise InvalidSpec(f"{field}: give keySecretRef or keyFile, not both")
    key = ""
    ref = data.get("keySecretRef")
    if ref is not None:
        if not isinstance(ref, dict) or set(ref) - {"name", "key"} or \
                not isinstance(ref.get("name"), str) or not isinstance(ref.get("key"), str):
            raise InvalidSpec(f"{field}.keySecretRef must be {{name: SECRET, key: KEY}} (the "
                              f"Secret mounted into the node agent), got {ref!r}")
        key = _key_source(f"secret:{ref['name']}/{ref['key']}", field=f"{field}.keySecretRef",
                          pem=False)
    path = data.get("keyFile")
    if path is not None:
        if not isinstance(path, str) or not path.startswith("/"):
            raise InvalidSpec(f"{field}.keyFile must be an absolute path on the node, got "
                              f"{path!r}")
        key = f"file:{path}"
    return Encryption(tuple(recipients), key, required)


def _key_source(text: str, *, field: str, pem: bool) -> str:
    if pem and text.startswith(PEM_PUBLIC):
        return text
    if text.startswith("file:/"):
        return text
    if text.startswith("secret:") and _SECRET_REF.match(text.removeprefix("secret:")):
        return text
    raise InvalidSpec(f"{field} must be {'an inline PEM public key, ' if pem else ''}"
                      "'file:/absolute/path' or 'secret:NAME/KEY' (NAME a Secret's name), "
                      f"got {text[:60]!r}")


def _runtimes(data: JsonValue, *, field: str) -> tuple[tuple[str, str], ...]:
    """``{"cri-o": "cri-o", "my-runtime": "agent"}`` -> sorted pairs."""
    if data is None:
        return ()
    paths = sorted(p.value for p in RestorePath)
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and _RUNTIME.match(k) and v in paths for k, v in data.items()):
        raise InvalidSpec(f"{field} must map a runtime name (the scheme of a node's "
                          f"containerRuntimeVersion, e.g. cri-o) to one of {', '.join(paths)}, "
                          f"e.g. {{\"my-crio\": \"cri-o\"}}; got {data!r}")
    return tuple(sorted((str(k), str(v)) for k, v in data.items()))


def _keep_days(value: JsonValue, *, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"{field} must be a whole number of days from 0 to "
                          f"{MAX_HISTORY_KEEP_DAYS} (how long a settled operation's history "
                          f"is kept before it is pruned to a summary), got {value!r}")
    return _int(value, field=field, low=0, high=MAX_HISTORY_KEEP_DAYS)


def _owners(data: JsonValue, *, field: str) -> tuple[str, ...]:
    """``{"Kind": "move" | "refuse"}`` -> the kinds moved, sorted."""
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise InvalidSpec(f"{field} must map an owner kind to 'move' or 'refuse', e.g. "
                          '{"Sandbox": "move"}')
    moved = []
    for kind, policy in data.items():
        if not _KIND.match(kind) or policy not in _OWNER_POLICIES:
            raise InvalidSpec(f"{field}.{kind}: {policy!r} is not 'move' or 'refuse' for a "
                              "Kubernetes kind (e.g. Sandbox)")
        if policy == "move":
            moved.append(kind)
    return tuple(sorted(moved))


def class_to_json(cls: CheckpointClass) -> JsonObject:
    """The normalised form (what a spec embeds); ``parse_class`` of it is the identity."""
    t, r = cls.timeouts, cls.retention
    return {
        "name": cls.name, "repository": cls.repository, "tag_scheme": cls.tag_scheme,
        "timeouts": {"capture": t.capture, "release": t.release, "delete": t.delete,
                     "resolve": t.resolve, "schedule": t.schedule, "restore": t.restore,
                     "gc": t.gc},
        "retention": {"keep_last": r.keep_last, "max_age_seconds": r.max_age_seconds,
                      "delete_after_migration": r.delete_after_migration},
        "saver": override_to_json(cls.saver), "loader": override_to_json(cls.loader),
        "on_failure": cls.on_failure.value, "restore_attempts": cls.restore_attempts,
        **({"owners": {kind: "move" for kind in cls.movable_owners}}
           if cls.movable_owners else {}),
        **({"history_keep_days": cls.history_keep_days}
           if cls.history_keep_days is not None else {}),
        **({"runtimes": dict(cls.runtimes)} if cls.runtimes else {}),
        **({"encryption": cls.encryption.to_json()} if cls.encryption is not None else {}),
        **({"migration_mode": cls.migration_mode.value}
           if cls.migration_mode is not DEFAULT_MODE else {}),
        **({"transfer": cls.transfer.value} if cls.transfer is not DEFAULT_TRANSFER else {}),
    }


def tag_for(cls: CheckpointClass, *, checkpoint_id: str, namespace: str, pod: str) -> str:
    """The tag a checkpoint is pushed to; falls back to ``ckpt-<id>`` if the scheme overflows."""
    tag = cls.tag_scheme.format_map({"checkpoint_id": checkpoint_id, "namespace": namespace,
                                     "pod": pod})
    if is_valid_tag(tag):
        return tag
    fallback = re.sub(r"[^A-Za-z0-9_.-]", "-", f"ckpt-{checkpoint_id}")[:128]
    return fallback


def artifact_for(cls: CheckpointClass, *, checkpoint_id: str, namespace: str, pod: str) -> str:
    """``repository:tag`` for a new checkpoint of ``namespace/pod``."""
    tag = tag_for(cls, checkpoint_id=checkpoint_id, namespace=namespace, pod=pod)
    return f"{cls.repository}:{tag}"


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact a retention sweep may consider (from the reporting tables)."""

    ref: str  # registry/repo@sha256:...
    workload: str  # namespace/name
    created_at: datetime


def retention_victims(artifacts: Iterable[StoredArtifact], retention: Retention, now: datetime,
                      *, protected: frozenset[str] = frozenset()) -> tuple[StoredArtifact, ...]:
    """Artifacts the retention rules allow deleting; ``protected`` refs are always kept.

    Per workload, newest first: beyond ``keep_last`` or older than ``max_age_seconds``.
    The caller protects every artifact an active machine or a suspended workload needs.
    """
    by_workload: dict[str, list[StoredArtifact]] = {}
    for artifact in artifacts:
        by_workload.setdefault(artifact.workload, []).append(artifact)
    victims: list[StoredArtifact] = []
    for workload in sorted(by_workload):
        newest_first = sorted(by_workload[workload], key=lambda a: (a.created_at, a.ref),
                              reverse=True)
        for rank, artifact in enumerate(newest_first):
            too_many = retention.keep_last is not None and rank >= retention.keep_last
            too_old = (retention.max_age_seconds is not None and
                       now - artifact.created_at > timedelta(seconds=retention.max_age_seconds))
            if (too_many or too_old) and artifact.ref not in protected:
                victims.append(artifact)
    return tuple(victims)


def _tag_scheme(value: JsonValue, *, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidSpec(f"{field} must be a template string containing '{{checkpoint_id}}'")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as err:
        raise InvalidSpec(f"{field} {value!r} is not a valid template: {err}") from None
    unknown = sorted(set(names) - TAG_PLACEHOLDERS)
    if unknown:
        raise InvalidSpec(f"{field} uses unknown placeholder(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(TAG_PLACEHOLDERS))}")
    if "checkpoint_id" not in names:
        raise InvalidSpec(f"{field} {value!r} must contain '{{checkpoint_id}}' so that no two "
                          "checkpoints share a tag (a reused tag is a stale artifact)")
    sample = value.format_map({"checkpoint_id": "c", "namespace": "ns", "pod": "p"})
    if not is_valid_tag(sample):
        raise InvalidSpec(f"{field} {value!r} does not expand to a valid tag: use letters, "
                          "digits, '_', '.', '-' around the placeholders")
    return value


def _timeouts(value: JsonValue, *, field: str) -> Timeouts:
    if value is None:
        return Timeouts()
    if not isinstance(value, dict):
        raise InvalidSpec(f"{field} must be an object of seconds per phase")
    defaults = Timeouts()
    known = {"capture", "release", "delete", "resolve", "schedule", "restore", "gc"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidSpec(f"{field} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    got = {k: _int(value.get(k, getattr(defaults, k)), field=f"{field}.{k}", low=1,
                   high=MAX_TIMEOUT) for k in known}
    if got["schedule"] > got["restore"]:
        raise InvalidSpec(f"{field}.schedule ({got['schedule']}) must not exceed "
                          f"{field}.restore ({got['restore']}): a pod is scheduled before it runs")
    return Timeouts(**got)


def _retention(value: JsonValue, *, field: str) -> Retention:
    if value is None:
        return Retention()
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{field} must be an object (keep_last, max_age_seconds, "
                          "delete_after_migration)")
    unknown = sorted(set(value) - {"keep_last", "max_age_seconds", "delete_after_migration"})
    if unknown:
        raise InvalidSpec(f"{field} has unknown key(s) {', '.join(unknown)}")
    keep = value.get("keep_last")
    age = value.get("max_age_seconds")
    after = value.get("delete_after_migration", True)
    if not isinstance(after, bool):
        raise InvalidSpec(f"{field}.delete_after_migration must be true or false")
    return Retention(
        keep_last=None if keep is None else _int(keep, field=f"{field}.keep_last", low=1,
                                                 high=10_000),
        max_age_seconds=None if age is None else _int(age, field=f"{field}.max_age_seconds",
                                                      low=60, high=10 * 365 * 86400),
        delete_after_migration=after,
    )


def _int(value: JsonValue, *, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"{field} must be an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidSpec(f"{field} must be from {low} to {high}, got {value}")
    return value
