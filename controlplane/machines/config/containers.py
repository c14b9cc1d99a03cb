"""The dumper's saver and loader containers: defaults, user overrides, operator-owned keys.

A checkpoint class may override the saver (runs the capture on the source node) and the
loader (runs the restore in the new pod): ``image``, ``command`` (the whole argv),
``env``, ``env_from_secret`` and ``volume_mounts``. Overrides are layered over the
operator's defaults: image and command replace, env merges by name (the user wins),
the secret is appended as an ``envFrom`` source, mounts are appended. The container
names, the ``CHECKPOINT_*`` variables the operator sets and the operator's socket mount
are operator-owned: an override that touches them is rejected, naming the field.

Used by :mod:`controlplane.machines.config.classes` (parse, validate) and by the machines, which
send the merged container to the agent as JSON. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.machines.base.codec import encode_object
from controlplane.machines.base.frozen import replace

SAVER_NAME = "checkpoint-saver"
LOADER_NAME = "checkpoint-loader"
SOCKET_DIR = "/var/run/checkpoint"
SOCKET_VOLUME = "checkpoint-socket"
OPERATOR_ENV = frozenset({"CHECKPOINT_SOCKET_DIR", "CHECKPOINT_ID", "CHECKPOINT_ARTIFACT",
                          "CHECKPOINT_PROTOCOL_VERSION"})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True)
class VolumeMount:
    name: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class Container:
    """A fully resolved saver or loader container."""

    name: str
    image: str
    command: tuple[str, ...]
    env: tuple[EnvVar, ...] = ()
    env_from_secrets: tuple[str, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()

    def to_annotation(self) -> str:
        """Canonical JSON (sorted keys), as sent to the agent in an annotation."""
        return json.dumps(encode_object(self), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ContainerOverride:
    """A user's override; empty fields leave the default untouched."""

    image: str | None = None
    command: tuple[str, ...] | None = None
    env: tuple[EnvVar, ...] = ()
    env_from_secret: str | None = None
    volume_mounts: tuple[VolumeMount, ...] = ()


_OPERATOR_ENV_DEFAULTS = (EnvVar("CHECKPOINT_SOCKET_DIR", SOCKET_DIR),
                          EnvVar("CHECKPOINT_PROTOCOL_VERSION", "v1"))
_OPERATOR_MOUNTS = (VolumeMount(SOCKET_VOLUME, SOCKET_DIR),)

DEFAULT_SAVER = Container(
    name=SAVER_NAME, image="ghcr.io/checkpoint-controlplane/dumper:v1",
    command=("dumper", "save"), env=_OPERATOR_ENV_DEFAULTS, volume_mounts=_OPERATOR_MOUNTS,
)
DEFAULT_LOADER = Container(
    name=LOADER_NAME, image="ghcr.io/checkpoint-controlplane/dumper:v1",
    command=("dumper", "load"), env=_OPERATOR_ENV_DEFAULTS, volume_mounts=_OPERATOR_MOUNTS,
)


def merge(default: Container, override: ContainerOverride) -> Container:
    """Layer ``override`` over ``default`` (see the module docstring for the rules)."""
    env = {e.name: e for e in default.env}
    for e in override.env:
        if e.name not in OPERATOR_ENV:  # parse_override already refuses these
            env[e.name] = e
    secrets = default.env_from_secrets
    if override.env_from_secret and override.env_from_secret not in secrets:
        secrets = (*secrets, override.env_from_secret)
    return replace(
        default,
        image=override.image or default.image,
        command=override.command or default.command,
        env=tuple(env.values()),
        env_from_secrets=secrets,
        volume_mounts=(*default.volume_mounts, *override.volume_mounts),
    )


def parse_override(data: JsonValue, *, field: str) -> ContainerOverride:
    """Parse and validate one override object; errors name the field and the fix."""
    if data is None:
        return ContainerOverride()
    if not isinstance(data, dict):
        raise InvalidSpec(f"{field} must be an object with image, command, env, "
                          "env_from_secret, volume_mounts")
    known = {"image", "command", "env", "env_from_secret", "volume_mounts"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidSpec(f"{field} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))} (the container name is "
                          "operator-owned)")
    return ContainerOverride(
        image=_image(data.get("image"), field=f"{field}.image"),
        command=_command(data.get("command"), field=f"{field}.command"),
        env=_env(data.get("env"), field=f"{field}.env"),
        env_from_secret=_secret(data.get("env_from_secret"), field=f"{field}.env_from_secret"),
        volume_mounts=_mounts(data.get("volume_mounts"), field=f"{field}.volume_mounts"),
    )


def override_to_json(override: ContainerOverride) -> JsonObject:
    out: JsonObject = {}
    if override.image is not None:
        out["image"] = override.image
    if override.command is not None:
        out["command"] = list(override.command)
    if override.env:
        out["env"] = [{"name": e.name, "value": e.value} for e in override.env]
    if override.env_from_secret is not None:
        out["env_from_secret"] = override.env_from_secret
    if override.volume_mounts:
        out["volume_mounts"] = [{"name": m.name, "mount_path": m.mount_path,
                                 "read_only": m.read_only} for m in override.volume_mounts]
    return out


def _image(value: JsonValue, *, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise InvalidSpec(f"{field} must be a non-empty image reference without spaces, "
                          f"got {value!r}")
    return value


def _command(value: JsonValue, *, field: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidSpec(f"{field} must be a non-empty list of strings (the whole argv)")
    for i, arg in enumerate(value):
        if not isinstance(arg, str) or not arg:
            raise InvalidSpec(f"{field}[{i}] must be a non-empty string, got {arg!r}")
    return tuple(str(a) for a in value)


def _env(value: JsonValue, *, field: str) -> tuple[EnvVar, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidSpec(f"{field} must be a list of {{name, value}} objects")
    seen: set[str] = set()
    out: list[EnvVar] = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "value"}:
            raise InvalidSpec(f"{where} must be an object with keys name and value")
        name, val = item.get("name"), item.get("value", "")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise InvalidSpec(f"{where}.name must be a C identifier, got {name!r}")
        if name in OPERATOR_ENV:
            raise InvalidSpec(f"{where}.name {name!r} is operator-owned and cannot be "
                              "overridden; remove it")
        if name in seen:
            raise InvalidSpec(f"{where}.name {name!r} is listed twice; keep one")
        if not isinstance(val, str):
            raise InvalidSpec(f"{where}.value must be a string, got {val!r}")
        seen.add(name)
        out.append(EnvVar(name, val))
    return tuple(out)


def _secret(value: JsonValue, *, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value):
        raise InvalidSpec(f"{field} must name a Secret (lowercase DNS name), got {value!r}")
    return value


def _mounts(value: JsonValue, *, field: str) -> tuple[VolumeMount, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidSpec(f"{field} must be a list of {{name, mount_path, read_only}} objects")
    paths: set[str] = set()
    out: list[VolumeMount] = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "mount_path", "read_only"}:
            raise InvalidSpec(f"{where} must be an object with keys name, mount_path, read_only")
        out.append(_mount(item, where=where, paths=paths))
    return tuple(out)


def _mount(item: Mapping[str, JsonValue], *, where: str, paths: set[str]) -> VolumeMount:
    name, path, read_only = item.get("name"), item.get("mount_path"), item.get("read_only", False)
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        raise InvalidSpec(f"{where}.name must be a volume name (DNS label), got {name!r}")
    if name == SOCKET_VOLUME:
        raise InvalidSpec(f"{where}.name {name!r} is the operator-owned socket volume; "
                          "use another volume")
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
        raise InvalidSpec(f"{where}.mount_path must be an absolute path without '..', "
                          f"got {path!r}")
    normal = path.rstrip("/") or "/"
    if normal == SOCKET_DIR or normal.startswith(SOCKET_DIR + "/") or \
            SOCKET_DIR.startswith(normal.rstrip("/") + "/"):
        raise InvalidSpec(f"{where}.mount_path {path!r} overlaps the operator-owned "
                          f"{SOCKET_DIR}; mount elsewhere")
    if normal in paths:
        raise InvalidSpec(f"{where}.mount_path {path!r} is mounted twice; keep one")
    if not isinstance(read_only, bool):
        raise InvalidSpec(f"{where}.read_only must be true or false, got {read_only!r}")
    paths.add(normal)
    return VolumeMount(name, normal, read_only)
