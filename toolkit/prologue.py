"""The prologue text, as shipped in the package.

`prologue/prologue.sh` is the only copy in the repository; the package data
file `toolkit/data/prologue.sh` is a committed symlink to it, which
setuptools resolves into a real file when it builds a wheel. Reading the
bytes and decoding them strictly (the script is ASCII) keeps the text that
goes into `sh -c` byte-for-byte the file: no newline translation, no
stripping. Standard library only: `toolkit wrap` reads it on its fast path.
"""

from __future__ import annotations

import functools
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prologue.sh")
# $0 of the prologue shell: names the process in `ps` and in shell errors.
ARG0 = "dispatch-prologue"


@functools.cache
def text() -> str:
    with open(PATH, "rb") as f:
        data = f.read()
    # A NUL cannot pass through execve; non-ASCII would depend on the locale.
    if b"\0" in data or not data.isascii():
        raise RuntimeError(f"{PATH}: the prologue must be ASCII without NUL")
    return data.decode("ascii")
