"""Makes the sidecar image's root filesystem: what `python -S -m sidecar` loads,
and nothing else (images/sidecar.Containerfile runs this in its build stage,
on the Python base, and copies the result into an empty image).

    mkroot.py SRC DEST

SRC holds sidecar/ and toolkit/. The modules are found by importing ROOTS with
this interpreter (-S, as the sidecar runs) and taking every module loaded,
startup's included: so an import added to the sidecar is carried without a
list to edit. Source modules are compiled to sourceless bytecode in place of
the .py (`os.pyc`, not `__pycache__/os.cpython-311.pyc`), so the image holds
no source and needs no writable path; built-in and frozen modules need no
file. Extension modules are copied, and every shared library the interpreter
and they load (ldd) is copied with the symbolic links on its path (/lib64 ->
usr/lib64 ...). tests/sidecar/test_sidecar_retry.py runs the sidecar for a
whole check and holds every module it imports to the closure of ROOTS.

No shell, no package manager, no /etc: the image runs as a numeric user, and
the sidecar reads only its environment, the Downward API files and the
token and CA files.
"""

from __future__ import annotations

import ast
import os
import pathlib
import py_compile
import shutil
import subprocess
import sys

# What the sidecar imports, at start and later: runpy runs `-m sidecar`;
# encodings.ascii is the codec of the file the startupProbe waits for (written
# after the first check); email.utils is imported by toolkit.backoff for a
# Retry-After that is an HTTP date (rare: the apiserver sends seconds).
ROOTS = ("runpy", "sidecar", "sidecar.main", "encodings.ascii", "email.utils")
STDLIB = pathlib.Path(os.__file__).parent
APP = pathlib.Path("/opt/dispatch")


def closure(src: pathlib.Path) -> dict[str, str | None]:
    """Every module loaded by importing ROOTS (not sidecar.__main__: importing it runs the sidecar), by origin.
    The probe imports nothing of its own, so what it reports is what the roots load."""
    code = ("import sys\n"
            f"sys.path.insert(0, {str(src)!r})\n"
            f"for name in {ROOTS!r}: __import__(name)\n"
            "print(repr({n: getattr(m.__spec__, 'origin', None) for n, m in sys.modules.items()}))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    modules: dict[str, str | None] = ast.literal_eval(done.stdout)
    return modules


def replicate(path: str, dest: pathlib.Path) -> None:
    """Copy PATH into DEST at the same place, with every symbolic link on the way (a link to a link too)."""
    parts = pathlib.PurePosixPath(path).parts[1:]
    here = pathlib.Path("/")
    for i, part in enumerate(parts):
        step = here / part
        if step.is_symlink():
            target = os.readlink(step)
            link = dest / step.relative_to("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(target)
            resolved = os.path.normpath(os.path.join(here, target))
            replicate(os.path.join(resolved, *parts[i + 1:]), dest)
            return
        here = step
    out = dest / here.relative_to("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(here, out)


def libraries(binary: str) -> list[str]:
    """The shared libraries BINARY loads, as the loader finds them (ldd), the loader itself included."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        if "=>" in words:
            path = words[words.index("=>") + 1]
            if path.startswith("/"):
                found.append(path)
        elif words and words[0].startswith("/"):
            found.append(words[0])  # the program interpreter
    return found


def main() -> int:
    src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    modules = closure(src)
    modules["sidecar.__main__"] = str(src / "sidecar" / "__main__.py")  # what `-m sidecar` runs
    binaries = [os.path.realpath(sys.executable)]
    # The landmark by which the interpreter finds its standard library (os itself is frozen).
    modules.setdefault("os", str(STDLIB / "os.py"))
    if modules["os"] == "frozen":
        modules["os"] = str(STDLIB / "os.py")
    for name, origin in sorted(modules.items()):
        if origin in (None, "built-in", "frozen"):
            continue
        path = pathlib.Path(origin)
        if path.is_relative_to(src):
            out = dest / APP.relative_to("/") / path.relative_to(src)
        elif path.is_relative_to(STDLIB):
            out = dest / path.relative_to("/")
        else:
            raise SystemExit(f"mkroot: {name} comes from {origin}, outside the standard library and {src}")
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            py_compile.compile(str(path), cfile=str(out.with_suffix(".pyc")), dfile=str(path), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        else:  # an extension module
            shutil.copy2(path, out)
            binaries.append(str(path))
    replicate(binaries[0], dest)
    for binary in binaries:
        for library in libraries(binary):
            replicate(library, dest)
    (dest / binaries[0].lstrip("/")).with_name("python3").symlink_to(pathlib.Path(binaries[0]).name)
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"mkroot: {sum(1 for p in dest.rglob('*.pyc'))} modules, "
          f"{len(binaries) - 1} extension modules, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
