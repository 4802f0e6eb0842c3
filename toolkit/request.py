"""The StartRequest: what Start receives, read from a YAML or JSON file.

Model library: plain dataclasses with explicit validation, deliberately,
not pydantic v2:
- Errors are ours, one line each, naming the field path, the rule and the
  value found (`env[2].name: must not start with DISPATCH_ ..., found
  'DISPATCH_X'`). The bounds are the identity's, worded by `identity` (one wording for
  the CLI, the adapter and the prologue's tests); pydantic would wrap them
  in its own multi-line report and its coercions (`"1"` -> 1, 1.0 -> 1)
  that a checked contract does not want.
- No coercion at all: YAML 1.1 reads `jobId: 0123` as the integer 83 and
  `FOO: yes` as True; a string field refuses a non-string and says to quote
  it, instead of silently changing the value that becomes an identity.
- Nothing to install or import: the module is standard library only
  (`yamlio` imports YAML only when it reads YAML), so the CLI pays nothing for it
  on paths that do not read a request.

The file format is camelCase, as Kubernetes objects are (see
examples/start-request.yaml); unknown keys are refused so that a typo
(`numnodes`) is an error rather than a silently ignored field, and a key
written twice is refused rather than the last one winning.

Default name: when `name` is absent it is derived from the job id and the
submission only, so a repeated Start finds the TrainJob it made (the adapter
treats AlreadyExists as "already started"): a readable slug of the job id,
then N, then 8 hex digits of SHA-256 of the job id (so two ids with the same
slug differ), at most 32 characters. 32 keeps every name JobSet derives
from it (`<name>-dataset-initializer-0-0-abcde`, the longest in Trainer's
shipped runtimes) within 63.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from toolkit import formats, identity, names, yamlio

KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
MODES = ("plain", "kueue")
# metadata.name of a TrainJob: RFC 1035 label (Trainer's CRD rule).
NAME_MAX_LENGTH = 63
DERIVED_NAME_MAX_LENGTH = 32
# Kubernetes' environment variable names: printable ASCII without '='.
_ENV_NAME = re.compile(r"[!-<>-~][ -<>-~]*")
_RESOURCE_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_FIELDS = (
    "jobId generation submission attempt command env workdir namespace name runtimeRef mode "
    "queueName numNodes resourcesPerNode allowRankRestart"
).split()


class RequestError(ValueError):
    """A field of the request is wrong; the message starts with its path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclasses.dataclass(frozen=True)
class RuntimeRef:
    kind: str
    name: str


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    value: str


@dataclasses.dataclass(frozen=True)
class StartRequest:
    job_id: str
    generation: int
    submission: int
    attempt: int
    command: tuple[str, ...]
    namespace: str
    name: str
    runtime_ref: RuntimeRef
    env: tuple[EnvVar, ...] = ()
    workdir: str | None = None
    mode: str = "plain"
    queue_name: str | None = None
    num_nodes: int | None = None
    resources_per_node: Mapping[str, Mapping[str, str]] | None = None
    allow_rank_restart: bool = False

    @property
    def epoch_prefix(self) -> str:
        return identity.epoch_prefix(generation=self.generation, submission=self.submission)

    @property
    def token_prefix(self) -> str:
        return identity.token_prefix(job_id=self.job_id, submission=self.submission, attempt=self.attempt)


def _found(value: object) -> str:
    if value is None:
        return "found null"
    return f"found {type(value).__name__} {value!r}"


def _string(path: str, value: object) -> str:
    if not isinstance(value, str):
        hint = " (quote it)" if isinstance(value, (int, float, bool)) else ""
        raise RequestError(path, f"must be a string{hint}, {_found(value)}")
    return value


def _integer(path: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(path, f"must be an integer, {_found(value)}")
    return value


def _bounded(path: str, check: Any, value: object) -> Any:
    try:
        return check(value)
    except identity.BoundError as exc:
        raise RequestError(path, str(exc)) from None


def _mapping(path: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RequestError(path, f"must be a mapping, {_found(value)}")
    return value


def _dns(path: str, value: object, valid: Callable[[str], bool], what: str, limit: int) -> str:
    text = _string(path, value)
    if len(text) > limit:
        raise RequestError(path, f"must be at most {limit} characters, found {len(text)} in {text!r}")
    if not valid(text):
        raise RequestError(path, f"must be {what}, found {text!r}")
    return text


def _command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("command", f"must be a non-empty list of strings, {_found(value)}")
    items = tuple(_string(f"command[{i}]", item) for i, item in enumerate(value))
    if not items[0]:
        # The prologue refuses an empty first word: "no command to run".
        raise RequestError("command[0]", "must not be empty")
    if items[0].startswith("-"):
        # The prologue refuses it too: exec would read it as an option.
        raise RequestError("command[0]", f"must not start with '-', found {items[0]!r}")
    for i, item in enumerate(items):
        if "\0" in item:
            raise RequestError(f"command[{i}]", "must not contain a NUL character")
    return items


def env_var(*, name_path: str, value_path: str, name: object, value: object) -> EnvVar:
    """One entry of the job's own env; names starting DISPATCH_ are ours."""
    name = _string(name_path, name)
    if not _ENV_NAME.fullmatch(name):
        raise RequestError(name_path, f"must be printable ASCII without '=', not starting with a space, found {name!r}")
    if name.startswith(names.RESERVED_ENV_PREFIX):
        raise RequestError(
            name_path, f"must not start with {names.RESERVED_ENV_PREFIX} (reserved for dispatch), found {name!r}"
        )
    text = _string(value_path, value)
    if "\0" in text:
        raise RequestError(value_path, "must not contain a NUL character")
    return EnvVar(name=name, value=text)


def _env(value: object) -> tuple[EnvVar, ...]:
    if value is None:
        return ()
    out: list[EnvVar] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.append(env_var(name_path=f"env.{key}", value_path=f"env.{key}", name=key, value=item))
    elif isinstance(value, list):
        seen: dict[str, int] = {}
        for i, item in enumerate(value):
            entry = _mapping(f"env[{i}]", item)
            extra = sorted(set(entry) - {"name", "value"})
            if extra:
                raise RequestError(f"env[{i}].{extra[0]}", "unknown field (an entry has name and value)")
            if "name" not in entry:
                raise RequestError(f"env[{i}].name", "is required")
            var = env_var(name_path=f"env[{i}].name", value_path=f"env[{i}].value", name=entry["name"], value=entry.get("value", ""))
            if var.name in seen:
                raise RequestError(f"env[{i}].name", f"{var.name!r} is already env[{seen[var.name]}]")
            seen[var.name] = i
            out.append(var)
    else:
        raise RequestError("env", f"must be a mapping of name to value or a list of {{name, value}}, {_found(value)}")
    return tuple(out)


def _runtime_ref(value: object) -> RuntimeRef:
    ref = _mapping("runtimeRef", value)
    extra = sorted(set(ref) - {"kind", "name", "apiGroup"})
    if extra:
        raise RequestError(f"runtimeRef.{extra[0]}", "unknown field")
    if ref.get("apiGroup", names.TRAINER_GROUP) != names.TRAINER_GROUP:
        raise RequestError("runtimeRef.apiGroup", f"must be {names.TRAINER_GROUP}, found {ref['apiGroup']!r}")
    kind = _string("runtimeRef.kind", ref.get("kind", KINDS[0]))
    if kind not in KINDS:
        raise RequestError("runtimeRef.kind", f"must be one of {', '.join(KINDS)}, found {kind!r}")
    if "name" not in ref:
        raise RequestError("runtimeRef.name", "is required")
    name = _dns("runtimeRef.name", ref["name"], formats.dns_subdomain, "a DNS-1123 subdomain", 253)
    return RuntimeRef(kind=kind, name=name)


def _resources(value: object) -> Mapping[str, Mapping[str, str]] | None:
    if value is None:
        return None
    res = _mapping("resourcesPerNode", value)
    out: dict[str, dict[str, str]] = {}
    for part, items in res.items():
        if part not in ("limits", "requests"):
            raise RequestError(f"resourcesPerNode.{part}", "unknown field (limits or requests)")
        amounts = _mapping(f"resourcesPerNode.{part}", items)
        out[part] = {}
        for resource, amount in amounts.items():
            path = f"resourcesPerNode.{part}.{resource}"
            if not isinstance(resource, str) or not _RESOURCE_NAME.fullmatch(resource):
                raise RequestError(path, f"is not a resource name, found {resource!r}")
            if isinstance(amount, bool) or not isinstance(amount, (str, int)):
                raise RequestError(path, f"must be a quantity (a string such as '4Gi', or an integer), {_found(amount)}")
            text = str(amount)
            if not formats.quantity(text):
                raise RequestError(path, f"is not a Kubernetes quantity of zero or more, found {text!r}")
            out[part][resource] = text
    return out


def default_name(*, job_id: str, submission: int) -> str:
    """The TrainJob name derived from the job id and N (see the module docstring)."""
    identity.check_job_id(job_id)
    identity.check_submission(submission)
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    tail = f"-{submission}-{digest}"
    slug = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"j-{slug}".rstrip("-")
    slug = slug[: DERIVED_NAME_MAX_LENGTH - len(tail)].rstrip("-")
    return slug + tail


def from_dict(data: object) -> StartRequest:
    """Validate a decoded request document; RequestError names the field."""
    doc = _mapping("(request)", data)
    for key in doc:
        if key not in _FIELDS:
            raise RequestError(str(key), f"unknown field (known: {', '.join(_FIELDS)})")
    for key in ("jobId", "generation", "submission", "attempt", "command", "namespace", "runtimeRef"):
        if key not in doc:
            raise RequestError(key, "is required")
    job_id = _bounded("jobId", identity.check_job_id, _string("jobId", doc["jobId"]))
    generation = _bounded("generation", identity.check_generation, _integer("generation", doc["generation"]))
    submission = _bounded("submission", identity.check_submission, _integer("submission", doc["submission"]))
    attempt = _bounded("attempt", identity.check_attempt, _integer("attempt", doc["attempt"]))
    # The bound of the prefix as a whole (G = 9223372 only while the rest fits).
    _bounded("generation", lambda g: identity.epoch_prefix(generation=g, submission=submission), generation)

    mode = _string("mode", doc.get("mode", "plain"))
    if mode not in MODES:
        raise RequestError("mode", f"must be plain or kueue, found {mode!r}")
    queue_name = None
    if mode == "kueue":
        if doc.get("queueName") is None:
            raise RequestError("queueName", "is required in kueue mode")
        queue_name = _dns("queueName", doc["queueName"], formats.label_value, "a label value", 63)
        if not queue_name:
            raise RequestError("queueName", "must not be empty in kueue mode")
    elif doc.get("queueName") is not None:
        raise RequestError("queueName", "is only used in kueue mode (set mode: kueue)")

    num_nodes = None
    if doc.get("numNodes") is not None:
        num_nodes = _integer("numNodes", doc["numNodes"])
        if not 1 <= num_nodes <= 2**31 - 1:
            raise RequestError("numNodes", f"must be between 1 and {2**31 - 1}, found {num_nodes}")

    workdir = None
    if doc.get("workdir") is not None:
        workdir = _string("workdir", doc["workdir"])
        if not workdir or "\0" in workdir:
            raise RequestError("workdir", f"must be a non-empty path without NUL, found {workdir!r}")

    allow = doc.get("allowRankRestart", False)
    if not isinstance(allow, bool):
        raise RequestError("allowRankRestart", f"must be true or false, {_found(allow)}")

    namespace = _dns("namespace", doc["namespace"], formats.dns_label, "a DNS-1123 label", 63)
    if doc.get("name") is None:
        name = default_name(job_id=job_id, submission=submission)
    else:
        name = _dns("name", doc["name"], formats.rfc1035_label, "an RFC 1035 label (a-z, 0-9, '-', starting with a letter)", NAME_MAX_LENGTH)

    return StartRequest(
        job_id=job_id,
        generation=generation,
        submission=submission,
        attempt=attempt,
        command=_command(doc["command"]),
        env=_env(doc.get("env")),
        workdir=workdir,
        namespace=namespace,
        name=name,
        runtime_ref=_runtime_ref(doc["runtimeRef"]),
        mode=mode,
        queue_name=queue_name,
        num_nodes=num_nodes,
        resources_per_node=_resources(doc.get("resourcesPerNode")),
        allow_rank_restart=allow,
    )


def load(path: str) -> StartRequest:
    """Read and validate a StartRequest file (YAML, or JSON by `.json`; `-` is stdin)."""
    return from_dict(yamlio.load_document(path))
