"""Property: the real prologue, in every one of the nine shells, either
refuses (125, one `dispatch: ` line, nothing run) or hands the command
exactly the epoch and attempt a Python reference of docs/prologue.md gives; and
no two shells ever disagree on an input.

Inputs are arbitrary environment values (bytes, no NUL: an environment
cannot hold one), unset or set, weighted towards the edges: canonical
numbers around every bound, leading zeros, signs, spaces, hex, exponents,
non-ASCII digits and bytes that are not UTF-8.

The reference here is deliberately written from the design text alone (not
imported from toolkit.identity), so that the prologue, the toolkit and this
test are three readings of one formula.

The command is /usr/bin/env -0, so each run is one subprocess and the test
sees the whole environment the command got: DISPATCH_EPOCH and
DISPATCH_ATTEMPT, no DISPATCH_K8S_*, and an unrelated variable with odd
bytes passed through untouched.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

REPO = pathlib.Path(__file__).resolve().parents[2]
PROLOGUE = (REPO / "prologue" / "prologue.sh").read_bytes()
INT64_MAX = 2**63 - 1
_COUNT = re.compile(rb"0|[1-9][0-9]{0,5}")
_PREFIX = re.compile(rb"[1-9][0-9]{0,12}")
_TOKEN = re.compile(rb"[!-~]+")  # visible ASCII, as toolkit.identity makes a JobID
INPUTS = (b"DISPATCH_K8S_ADMISSION", b"DISPATCH_K8S_RESTART", b"DISPATCH_K8S_EPOCH_PREFIX", b"DISPATCH_K8S_TOKEN_PREFIX")
# Not an input: must reach the command byte for byte.
BYSTANDER = b"BYSTANDER"


def reference(*, a: bytes | None, j: bytes | None, prefix: bytes | None, token: bytes | None) -> tuple[bytes, bytes] | None:
    """(DISPATCH_EPOCH, DISPATCH_ATTEMPT), or None where the design says refuse.

    An empty epoch prefix means G = N = 0; an unset one is refused (the
    packager always sets it)."""
    if a is None or j is None or not (_COUNT.fullmatch(a) and _COUNT.fullmatch(j)):
        return None
    r = int(a) + int(j)
    if int(a) == 0 or r >= 10**6:
        return None
    if prefix is None or (prefix and not _PREFIX.fullmatch(prefix)):
        return None
    epoch = int(prefix) * 10**6 + r if prefix else r
    if epoch > INT64_MAX or token is None or not _TOKEN.fullmatch(token):
        return None
    return str(epoch).encode(), token + b"." + a + b"." + j


@pytest.fixture(scope="module")
def shells(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[str]]]:
    tmp = tmp_path_factory.mktemp("zsh-as-sh")
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


def yash_blind(value: bytes, *, locale: bytes | None) -> bool:
    """yash does not import a variable whose bytes are not text in the
    locale (any byte above 0x7f in the C locale): to yash it is unset."""
    if locale != b"C.UTF-8":
        return any(byte > 0x7F for byte in value)
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def run(argv: list[str], env: dict[bytes, bytes]) -> tuple[int, dict[bytes, bytes], bytes]:
    """Exit status, the DISPATCH_* and bystander part of the command's
    environment, and stderr."""
    proc = subprocess.run(
        [*argv, "-c", PROLOGUE, "dispatch-prologue", "/usr/bin/env", "-0"],
        env=env,
        capture_output=True,
        timeout=10,
        check=False,
    )
    seen = {}
    for entry in proc.stdout.split(b"\0"):
        key, _, value = entry.partition(b"=")
        if key.startswith(b"DISPATCH_") or key == BYSTANDER:
            seen[key] = value
    return proc.returncode, seen, proc.stderr


_odd_bytes = st.binary(max_size=10).map(lambda b: b.replace(b"\0", b"\x01"))
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10).map(
    lambda s: s.encode()
)
_digits = st.text(alphabet="0123456789", min_size=1, max_size=8).map(str.encode)
_near = st.one_of(
    st.integers(min_value=0, max_value=20),
    st.integers(min_value=999_990, max_value=1_000_010),
    st.integers(min_value=0, max_value=1_100_000),
).map(lambda n: str(n).encode())
_counts = st.one_of(
    _near,
    _digits,
    _text,
    _odd_bytes,
    st.none(),
    st.sampled_from(
        [b"0", b"", b"+1", b"-1", b" 1", b"1 ", b"08", b"010", b"0x1", b"1e3", "٣".encode(), "１".encode(), b"1\n",
         b"99999999999999999999", b"9223372036854775807", b"-n", b"\\c", b"\xff"]
    ),
)
# (A, J) drawn alone, or as a pair whose R sits at the bound 10^6.
_at_bound = st.integers(min_value=0, max_value=10**6).flatmap(
    lambda a: st.tuples(st.just(a), st.integers(min_value=max(0, 10**6 - a - 2), max_value=10**6 - a + 1))
).map(lambda p: (str(p[0]).encode(), str(p[1]).encode()))
_pairs = st.one_of(st.tuples(_counts, _counts), _at_bound)
_prefixes = st.one_of(
    st.none(),
    st.just(b""),
    st.integers(min_value=1, max_value=10**14).map(lambda n: str(n).encode()),
    st.integers(min_value=9223372036850, max_value=9223372036856).map(lambda n: str(n).encode()),
    st.sampled_from([b"9223371999999", b"9223372000000", b"0", b"01", b"00000000000001", b" 1", "٣".encode()]),
    _digits,
    _text,
    _odd_bytes,
)
_tokens = st.one_of(st.none(), st.just(b"job.1.0"), st.just(b""), _text, _odd_bytes)


# C.UTF-8, and the C locale a container gets when nothing sets one.
_locales = st.sampled_from([b"C.UTF-8", b"C.UTF-8", b"C", None])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(aj=_pairs, prefix=_prefixes, token=_tokens, bystander=_odd_bytes, locale=_locales)
@example(aj=(b"999999", b"1"), prefix=b"", token=b"t", bystander=b"", locale=b"C.UTF-8")
@example(aj=(b"775806", b"1"), prefix=b"9223372036854", token=b"t", bystander=b"", locale=b"C.UTF-8")
@example(aj=(b"775807", b"1"), prefix=b"9223372036854", token=b"t", bystander=b"", locale=b"C.UTF-8")
@example(aj=(b"010", b"0"), prefix=b"7", token=b"t", bystander=b"", locale=b"C.UTF-8")
@example(aj=(b"1", b"999998"), prefix=b"", token=b"t", bystander=b"\xff", locale=None)
@example(aj=(b"1", b"0"), prefix="١".encode(), token=b"t", bystander=b"", locale=None)
def test_every_shell_agrees_with_the_reference(
    shells: dict[str, list[str]],
    aj: tuple[bytes | None, bytes | None],
    prefix: bytes | None,
    token: bytes | None,
    bystander: bytes,
    locale: bytes | None,
) -> None:
    a, j = aj
    env = {b"PATH": b"/usr/bin:/bin", BYSTANDER: bystander}
    if locale is not None:
        env[b"LC_ALL"] = locale
    for key, value in zip(INPUTS, (a, j, prefix, token), strict=True):
        if value is not None:
            env[key] = value
    want = reference(a=a, j=j, prefix=prefix, token=token)
    results = {name: run(argv, env) for name, argv in shells.items()}
    # Exit status and the command's environment: the same in all nine.
    outcomes = {(status, tuple(sorted(seen.items()))) for status, seen, _ in results.values()}
    assert len(outcomes) == 1, f"shells disagree on {env!r}: {results}"
    # The refusal line too, except that yash sees an input it cannot import
    # as unset, and says so: it must say what dash says for the unset input.
    errs = {name: err for name, (_, _, err) in results.items()}
    blind = {key for key in INPUTS if key in env and yash_blind(env[key], locale=locale)}
    if blind:
        _, _, as_unset = run(shells["dash"], {k: v for k, v in env.items() if k not in blind})
        assert errs.pop("yash") == as_unset, f"yash on {env!r}: {results['yash']}, dash with {blind} unset: {as_unset!r}"
    assert len(set(errs.values())) == 1, f"refusal lines differ on {env!r}: {errs}"
    status, seen, err = next(iter(results.values()))
    if want is None:
        assert status == 125, f"{env!r}: expected a refusal, got {status} {seen!r}"
        assert err.startswith(b"dispatch: ") and err.endswith(b"\n") and err.count(b"\n") == 1, err
        assert seen == {}, f"{env!r}: the command ran"
    else:
        epoch, attempt = want
        assert status == 0 and err == b"", (env, status, err)
        assert seen == {b"DISPATCH_EPOCH": epoch, b"DISPATCH_ATTEMPT": attempt, BYSTANDER: bystander}, env
