"""A user without root for the tests that build as one: made with `useradd` (the tests run as root),
with a home of its own under a temporary directory, and removed with everything it started.

`useradd` gives the account subordinate ID ranges (/etc/subuid, /etc/subgid), which rootless
podman maps the IDs of an image's files into; an account made without them fails here, naming the
file, rather than build with one ID. The user's podman runs with the project's containers.conf and
its own storage and runtime directory under its home, never root's.

Its Python is Debian's python3 of the same minor version as this virtualenv's, in a virtualenv of
the user's own that adds a copy of this virtualenv's third-party site-packages (a `.pth` line):
neither the interpreter this virtualenv was made from nor the virtualenv itself need be readable by
other users (a clone in a private temporary directory is not), and nothing is installed again. The
modules of the checkout a command runs in are the ones it imports (`python -m` puts the working
directory first; the editable installs' finders are not copied).

`end()` stops every process left running as the user (rootless podman keeps a pause process that
holds its user namespace; its pid file names it), by pid, then removes the account and its home.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

from release import contexts

SYSTEM_PYTHON = pathlib.Path("/usr/bin/python3")


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    uid: int
    home: pathlib.Path

    @property
    def python(self) -> pathlib.Path:
        return self.home / "venv" / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.name, "PATH": "/usr/bin:/bin",
                "XDG_RUNTIME_DIR": str(self.home / "run"),
                "CONTAINERS_CONF": str(self.home / "containers.conf"), **extra}

    def run(self, *argv: str, cwd: pathlib.Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """ARGV run as the user (runuser), in CWD (the home by default), with `env()` and ENV."""
        command = ["runuser", "-u", self.name, "--", "env", "-i",
                   *(f"{k}={v}" for k, v in self.env(**(env or {})).items()), *argv]
        return subprocess.run(command, cwd=cwd or self.home, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def give(self, path: pathlib.Path) -> pathlib.Path:
        """PATH and everything under it owned by the user."""
        for p in [path, *path.rglob("*")]:
            os.lchown(p, self.uid, self.uid)
        return path


def _subordinate(name: str) -> None:
    for table in ("/etc/subuid", "/etc/subgid"):
        entries = pathlib.Path(table).read_text().splitlines() if pathlib.Path(table).exists() else []
        if not any(line.split(":")[0] == name for line in entries):
            raise AssertionError(f"useradd wrote no {table} range for {name}: rootless podman needs one "
                                 "(SUB_UID_COUNT and SUB_GID_COUNT in /etc/login.defs)")


def make(parent: pathlib.Path) -> User:
    """A new account with its home at PARENT/home, its runtime directory and its Python."""
    name = f"dispatch-rl-{secrets.token_hex(4)}"
    home = parent / "home"
    home.mkdir()
    parent.chmod(0o755)
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, capture_output=True, timeout=60)
    user = User(name=name, uid=pwd.getpwnam(name).pw_uid, home=home)
    try:
        _subordinate(name)
        (home / "run").mkdir(mode=0o700)
        # The project's containers.conf, where the user can read it (this checkout may be where it cannot).
        shutil.copy(contexts.REPO / "scripts" / "containers.conf", home / "containers.conf")
        user.give(home)
        if not SYSTEM_PYTHON.exists():
            raise AssertionError(f"{SYSTEM_PYTHON}: missing (make deps installs Debian's python3 and python3-venv)")
        made = user.run(str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])")
        if made.stdout.strip() != str(tuple(sys.version_info[:2])):
            raise AssertionError(f"{SYSTEM_PYTHON} is Python {made.stdout.strip()}, this virtualenv's "
                                 f"{sys.version_info[:2]}: the user's virtualenv borrows its site-packages")
        made = user.run(str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(home / "venv"))
        assert made.returncode == 0, made.stderr
        # A copy of this virtualenv's third-party packages: the virtualenv itself may sit under a
        # directory other users cannot enter (a clone in a private temporary directory). Our own
        # packages come from the clone the user works in, not from their editable installs here.
        site = home / "site"
        shutil.copytree(sysconfig.get_paths()["purelib"], site, symlinks=True,
                        ignore=shutil.ignore_patterns("__editable__*", "__pycache__"))
        (home / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" /
         "dispatch-dev.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
        user.give(home / "venv")
        user.give(site)
    except BaseException:
        end(user)
        raise
    return user


def _processes(uid: int) -> list[int]:
    pids = []
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # ended meanwhile
            continue
        uids = next((line.split()[1:] for line in lines if line.startswith("Uid:")), [])
        zombie = any(line.startswith("State:") and line.split()[1] == "Z" for line in lines)
        if str(uid) in uids and not zombie:
            pids.append(int(status.parent.name))
    return pids


def end(user: User) -> list[int]:
    """Stop the user's processes (by pid), remove the account and its home; answers the pids stopped."""
    stopped = _processes(user.uid)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while _processes(user.uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    subprocess.run(["userdel", user.name], check=False, capture_output=True, timeout=60)
    shutil.rmtree(user.home, ignore_errors=True)
    return stopped
