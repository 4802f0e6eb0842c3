"""Property: the real prologue, in every one of the nine shells, either
refuses (125) or prints exactly the epoch and attempt a Python reference of
DESIGN.md §2 gives; and no two shells ever disagree on an input.

The reference here is deliberately written from the design text alone (not
imported from toolkit.identity), so that the prologue, the toolkit and this
test are three readings of one formula; tests/toolkit holds the toolkit equal
to the prologue.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = pathlib.Path(__file__).resolve().parents[2]
PROLOGUE = (REPO / "prologue" / "prologue.sh").read_text()
INT64_MAX = 2**63 - 1
_COUNT = re.compile(r"0|[1-9][0-9]{0,5}")
_PREFIX = re.compile(r"[1-9][0-9]{0,12}")


def reference(a: str, j: str, prefix: str, token: str) -> tuple[str, str] | None:
    """(epoch, attempt), or None where the design says refuse."""
    if not (_COUNT.fullmatch(a) and _COUNT.fullmatch(j)):
        return None
    r = int(a) + int(j)
    if int(a) == 0 or r >= 10**6:
        return None
    if prefix and not _PREFIX.fullmatch(prefix):
        return None
    epoch = int(prefix) * 10**6 + r if prefix else r
    if epoch > INT64_MAX or not token:
        return None
    return str(epoch), f"{token}.{a}.{j}"


@pytest.fixture(scope="module")
def shells() -> dict[str, list[str]]:
    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "sh").symlink_to("/usr/bin/zsh")  # zsh emulates sh under that name
    argvs = {
        "dash": ["/usr/bin/dash"],
        "bash": ["/usr/bin/bash"],
        "bash-posix": ["/usr/bin/bash", "--posix"],
        "busybox": ["/usr/bin/busybox", "sh"],
        "posh": ["/usr/bin/posh"],
        "mksh": ["/usr/bin/mksh"],
        "yash": ["/usr/bin/yash"],
        "ksh93": ["/usr/bin/ksh93"],
        "zsh": [str(tmp / "sh")],
    }
    missing = [name for name, argv in argvs.items() if not os.access(argv[0], os.X_OK)]
    assert not missing, f"missing shells: {missing} (make deps)"
    yield argvs
    shutil.rmtree(tmp)


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        [*argv, "-c", PROLOGUE, "dispatch-prologue", "/bin/sh", "-c",
         'printf "%s|%s" "$DISPATCH_EPOCH" "$DISPATCH_ATTEMPT"'],
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", **env},
        capture_output=True,
        timeout=10,
    )
    return proc.returncode, proc.stdout.decode("utf-8", "surrogateescape")


# Strings an environment can hold (no NUL; encodable), weighted towards the
# interesting edges: digits, leading zeros, signs, spaces, huge values.
_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
_digits = st.text(alphabet="0123456789", min_size=1, max_size=8)
_near = st.integers(min_value=0, max_value=1_100_000).map(str)
_counts = st.one_of(_near, _digits, _text, st.sampled_from(["0", "", "+1", "-1", " 1", "08", "0x1", "1e3", "٣", "1\n"]))
_prefixes = st.one_of(
    st.just(""),
    st.integers(min_value=1, max_value=10**14).map(str),
    st.sampled_from(["9223372036854", "9223372036855", "9223371999999", "0", "01"]),
    _text,
)
_tokens = st.one_of(st.just("job.1.0"), st.just(""), _text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=_counts, j=_counts, prefix=_prefixes, token=_tokens)
def test_every_shell_agrees_with_the_reference(shells, a: str, j: str, prefix: str, token: str) -> None:
    env = {
        "DISPATCH_K8S_ADMISSION": a,
        "DISPATCH_K8S_RESTART": j,
        "DISPATCH_K8S_EPOCH_PREFIX": prefix,
        "DISPATCH_K8S_TOKEN_PREFIX": token,
    }
    want = reference(a, j, prefix, token)
    results = {name: run(argv, env) for name, argv in shells.items()}
    assert len(set(results.values())) == 1, f"shells disagree on {env!r}: {results}"
    status, out = next(iter(results.values()))
    if want is None:
        assert status == 125, f"{env!r}: expected a refusal, got {status} {out!r}"
    else:
        assert (status, out) == (0, "|".join(want)), env
