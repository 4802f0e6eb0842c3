"""What a build is called: its version, the OCI tag it is pushed under, and its revision.

The version is the package's (pyproject.toml) when HEAD carries the tag `v<version>` and the tree
is clean: a release. Between releases it is the version plus the commit as a PEP 440 local
version, `0.1.0+g<12 hex>` (`.dirty` added for uncommitted changes), so a build between releases
never takes a release's name. An OCI tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`: PEP 440's `+` is
not allowed, so the tag writes it as `-` (`0.1.0-g<12 hex>`); a release's tag is its version.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import re
import subprocess
import tomllib

TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# What a version given by hand may hold (PEP 440 and semver both fit in it).
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.+-]{0,127}")


class VersionError(ValueError):
    """A version or tag outside its bound; the message names the field and the bound."""


@dataclasses.dataclass(frozen=True)
class Build:
    version: str   # PEP 440 when derived: 0.1.0 or 0.1.0+g0123456789ab[.dirty]
    tag: str       # the OCI tag: 0.1.0 or 0.1.0-g0123456789ab[.dirty]
    revision: str  # the full commit hash
    created: str   # the commit's time, RFC 3339 UTC (so a rebuild of a commit carries the same label)


def oci_tag(version: str) -> str:
    """The OCI tag for VERSION: `+` (a PEP 440 local version) becomes `-`; anything else must already fit."""
    if not VERSION.fullmatch(version):
        raise VersionError(f"version {version!r}: must match {VERSION.pattern}")
    tag = version.replace("+", "-")
    if not TAG.fullmatch(tag):
        raise VersionError(f"tag {tag!r}: must match {TAG.pattern}")
    return tag


def package_version(repo: pathlib.Path) -> str:
    """[project].version of REPO's pyproject.toml."""
    with (repo / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def describe(repo: pathlib.Path, *, version: str | None = None) -> Build:
    """The build of REPO's HEAD; VERSION, when given, names it instead of the derived version."""
    revision = _git(repo, "rev-parse", "HEAD")
    stamp = int(_git(repo, "show", "-s", "--format=%ct", "HEAD"))
    created = datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if version is None:
        version = derived(package_version(repo), revision=revision,
                          tags=set(_git(repo, "tag", "--points-at", "HEAD").split()),
                          dirty=bool(_git(repo, "status", "--porcelain", "--untracked-files=no")))
    return Build(version=version, tag=oci_tag(version), revision=revision, created=created)


def derived(base: str, *, revision: str, tags: set[str], dirty: bool) -> str:
    """BASE at a release (HEAD tagged v<BASE>, clean), else BASE+g<first 12 of REVISION>[.dirty]."""
    if f"v{base}" in tags and not dirty:
        return base
    return f"{base}+g{revision[:12]}" + (".dirty" if dirty else "")
