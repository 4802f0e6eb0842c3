"""The version and tag rule (release/version.py): a release is named by the package version, a
build between releases by the version plus the commit, and every tag is a valid OCI tag
(`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`), PEP 440's `+` written as `-`. Pure logic, plus this
checkout's own git for `describe`."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from release import version

REPO = pathlib.Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("given_version", "tag"), [
    ("0.1.0", "0.1.0"),
    ("0.1.0+g0123456789ab", "0.1.0-g0123456789ab"),
    ("0.1.0+g0123456789ab.dirty", "0.1.0-g0123456789ab.dirty"),
    ("1.2.3rc1", "1.2.3rc1"),
    ("2.0.0.post1.dev3", "2.0.0.post1.dev3"),
    ("1.0.0-beta.2", "1.0.0-beta.2"),
    ("9" * 128, "9" * 128),
])
def test_a_version_s_tag(given_version: str, tag: str) -> None:
    assert version.oci_tag(given_version) == tag
    assert version.TAG.fullmatch(tag)


@pytest.mark.parametrize(("bad", "field"), [
    ("", "version"), ("-1.0", "version"), (".1.0", "version"), ("1.0 beta", "version"),
    ("1.0/2", "version"), ("1.0:2", "version"), ("v1@sha256", "version"), ("9" * 129, "version"),
])
def test_a_version_outside_the_bound_is_refused_in_one_line(bad: str, field: str) -> None:
    with pytest.raises(version.VersionError) as refused:
        version.oci_tag(bad)
    message = str(refused.value)
    assert message.startswith(f"{field} {bad!r}: must match ") and "\n" not in message


@given(st.text(alphabet="0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_.+-", min_size=1,
               max_size=140))
def test_every_tag_answered_is_a_valid_oci_tag_and_keeps_the_version_s_text(text: str) -> None:
    try:
        tag = version.oci_tag(text)
    except version.VersionError:
        assert not version.VERSION.fullmatch(text)
        return
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)
    assert tag == text.replace("+", "-") and "+" not in tag


def test_a_release_is_the_tagged_clean_version_and_anything_else_carries_the_commit() -> None:
    assert version.derived("0.1.0", revision=SHA, tags={"v0.1.0"}, dirty=False) == "0.1.0"
    assert version.derived("0.1.0", revision=SHA, tags=set(), dirty=False) == "0.1.0+g0123456789ab"
    assert version.derived("0.1.0", revision=SHA, tags={"v0.1.0"}, dirty=True) == "0.1.0+g0123456789ab.dirty"
    assert version.derived("0.1.0", revision=SHA, tags={"v0.0.9", "0.1.0"}, dirty=False) == "0.1.0+g0123456789ab"


def test_this_checkout_s_build_is_named_by_its_head() -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    build = version.describe(REPO)
    assert build.revision == head
    assert build.version.startswith(version.package_version(REPO))
    assert build.tag == version.oci_tag(build.version)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", build.created)
    assert version.describe(REPO, version="3.1.4").tag == "3.1.4"
