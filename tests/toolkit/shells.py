"""The shells the prologue must behave identically in (docs/prologue.md), as argv
prefixes that run `<prefix> -c SCRIPT NAME ARGS...`. A missing shell fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from toolkit import prologue

NAMES = ["dash", "bash", "bash-posix", "posh", "mksh", "yash", "ksh", "zsh-as-sh", "busybox-sh"]
_ZSH_DIR = tempfile.mkdtemp(prefix="toolkit-zsh-")


def _need(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} is not installed (scripts/install-host-packages.sh installs it)"
    return path


def argv(name: str) -> list[str]:
    if name == "bash-posix":
        return [_need("bash"), "--posix"]
    if name == "zsh-as-sh":
        # zsh emulates sh only when started under the name sh.
        link = os.path.join(_ZSH_DIR, "sh")
        if not os.path.lexists(link):
            os.symlink(_need("zsh"), link)
        return [link]
    if name == "busybox-sh":
        return [_need("busybox"), "sh"]
    return [_need(name)]


PRINT = ["/bin/sh", "-c", 'printf "%s\\n%s\\n" "${DISPATCH_EPOCH-unset}" "${DISPATCH_ATTEMPT-unset}"']


def run_prologue(shell: str, env: dict[str, str], command: list[str] = PRINT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*argv(shell), "-c", prologue.text(), prologue.ARG0, *command],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
