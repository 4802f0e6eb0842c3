"""The bases a release is built on, carried from the machine that made them to a builder without root.

Making the bases takes root once (`make images`: debootstrap, and podman as root); building the
release on them does not. Rootless podman builds the release's images as any user whose account has
subordinate ID ranges (/etc/subuid and /etc/subgid, which `useradd` writes), into that user's own
storage, where the bases are not. So the bases travel as one file:

    python -m release.bases export FILE   (as root, after make images)
    python -m release --bases FILE ...    (as any user: loaded, then the release is built)

BASES are the images the release's Containerfiles name (release/contexts.py): the Python base and
the busybox base, each for every architecture of ARCHES. FILE is one `podman save -m` archive of
the four (a docker-archive: each image's config is kept as it is, so an image loaded from it has the
ID it had where it was made, and a base is named as the Containerfiles name it). Loading checks that
every base arrived, each for its architecture; it never touches an image that is not a base.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from release import contexts

BASES = tuple(contexts.base(image, arch) for image in (contexts.PYTHON_BASE, contexts.BUSYBOX_BASE)
              for arch in contexts.ARCHES)


class BasesError(RuntimeError):
    """The bases cannot be exported or loaded; the message names the base or the file and why."""


def _said(stderr: str) -> str:
    """What podman said, on one line (its errors can take several)."""
    return " ".join(stderr.split())[-1000:]


def _arch_of(image: str) -> str:
    """The architecture a base is for: the one its name carries, else this machine's."""
    return next((arch for arch in contexts.ARCHES if image.endswith(f"-{arch}")), contexts.HOST_ARCH)


def check(bases: tuple[str, ...] = BASES) -> None:
    """Every one of BASES is in local storage, each for its architecture."""
    for image in bases:
        done = contexts.podman("image", "inspect", "--format", "{{.Architecture}}", image)
        if done.returncode != 0:
            raise BasesError(f"base {image}: not in local storage (make images builds it, as root; "
                             "a user without root loads it with --bases FILE)")
        if done.stdout.strip() != _arch_of(image):
            raise BasesError(f"base {image}: is for {done.stdout.strip()}, not {_arch_of(image)}")


def export(path: pathlib.Path, bases: tuple[str, ...] = BASES) -> pathlib.Path:
    """BASES into the archive PATH, readable by every user; written beside PATH, then renamed."""
    check(bases)
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    done = contexts.podman("save", "-q", "-m", "--format", "docker-archive", "-o", str(partial), *bases, timeout=900)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BasesError(f"podman save of the bases to {path}: {_said(done.stderr)}")
    partial.chmod(0o644)
    partial.rename(path)
    return path


def load(path: pathlib.Path, bases: tuple[str, ...] = BASES) -> None:
    """The bases in the archive PATH (`export`'s) into local storage, then `check`ed."""
    if not (path.is_file() and os.access(path, os.R_OK)):
        raise BasesError(f"--bases {path}: not a readable file (python -m release.bases export FILE writes it)")
    done = contexts.podman("load", "-q", "-i", str(path), timeout=900)
    if done.returncode != 0:
        raise BasesError(f"--bases {path}: podman load: {_said(done.stderr)}")
    check(bases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.bases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    out = commands.add_parser("export", help="write the bases into one archive FILE (as root, after make images)")
    out.add_argument("file", type=pathlib.Path, help="the archive to write")
    args = parser.parse_args(argv)
    try:
        print(export(args.file))
    except BasesError as exc:
        print(f"release.bases: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
