"""The wrapped trainer command and its environment (docs/toolkit.md).

    command = ["/bin/sh", "-c", <prologue text, byte-for-byte>, "dispatch-prologue"]
    args    = the user's command

so the container runs `/bin/sh -c PROLOGUE dispatch-prologue CMD...`: `$0`
is "dispatch-prologue" and `"$@"` is the user's command, which the prologue
execs (it keeps PID 1 and its exit status).

The env list has a fixed order: the job's own entries sorted by name (a
name starting DISPATCH_ is refused: that namespace is ours), then the
Downward API entries for A and J, the two prefixes, and the workdir when
there is one. The order is part of the output, not an accident: the
TrainJob's spec.trainer is immutable, so the same request must render the
same bytes.

Standard library only (and `prologue`, `names`, `identity`): `toolkit wrap`
imports this on its fast path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolkit import names, prologue

SHELL = "/bin/sh"


class WrapError(ValueError):
    """A command the prologue would refuse."""


class ReservedEnvError(ValueError):
    """A job env name starting DISPATCH_, or a repeated name."""


def command() -> list[str]:
    """spec.trainer.command: the prologue run by /bin/sh."""
    return [SHELL, "-c", prologue.text(), prologue.ARG0]


def argv(user_command: Sequence[str]) -> list[str]:
    """The whole exec-form command line: command() then the user's command."""
    if not user_command or not user_command[0]:
        raise WrapError("no command to wrap: the prologue refuses an empty command")
    if user_command[0].startswith("-"):
        raise WrapError(f"command {user_command[0]!r} starts with '-': the prologue refuses it (exec would read an option)")
    return command() + list(user_command)


def _field_ref(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def job_env(entries: Iterable[tuple[str, str]] | Mapping[str, str]) -> list[dict[str, Any]]:
    """The job's own env, sorted by name; DISPATCH_ names and repeats refused."""
    pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
    seen: set[str] = set()
    for name, _ in pairs:
        if name.startswith(names.RESERVED_ENV_PREFIX):
            raise ReservedEnvError(
                f"env {name}: names starting {names.RESERVED_ENV_PREFIX} are reserved for dispatch"
            )
        if name in seen:
            raise ReservedEnvError(f"env {name}: given twice")
        seen.add(name)
    return [{"name": name, "value": value} for name, value in sorted(pairs)]


def dispatch_env(*, epoch_prefix: str, token_prefix: str, workdir: str | None = None) -> list[dict[str, Any]]:
    """The prologue's inputs: A and J through the Downward API, then the prefixes."""
    env = [
        {"name": names.ENV_ADMISSION, **_field_ref(f"metadata.annotations['{names.ADMISSION_ANNOTATION}']")},
        {"name": names.ENV_RESTART, **_field_ref(f"metadata.labels['{names.RESTART_LABEL}']")},
        {"name": names.ENV_EPOCH_PREFIX, "value": epoch_prefix},
        {"name": names.ENV_TOKEN_PREFIX, "value": token_prefix},
    ]
    if workdir:
        env.append({"name": names.ENV_WORKDIR, "value": workdir})
    return env


def env(
    *,
    job: Iterable[tuple[str, str]] | Mapping[str, str],
    epoch_prefix: str,
    token_prefix: str,
    workdir: str | None = None,
) -> list[dict[str, Any]]:
    """spec.trainer.env: the job's env sorted, then ours."""
    return job_env(job) + dispatch_env(epoch_prefix=epoch_prefix, token_prefix=token_prefix, workdir=workdir)


def shell_quote(word: str) -> str:
    """One POSIX shell word: single quotes, each ' written as '\\''."""
    if word and all(c.isascii() and (c.isalnum() or c in "@%+:,./-_") for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def shell_line(words: Sequence[str], *, assignments: Sequence[tuple[str, str]] = ()) -> str:
    """A command line a POSIX shell reads back as exactly these words."""
    parts = [f"{name}={shell_quote(value)}" for name, value in assignments]
    return " ".join(parts + [shell_quote(w) for w in words])
