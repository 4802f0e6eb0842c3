"""The shared libraries an ELF program or library loads, found by reading its headers, never by
running it (images/mkroot.py: a root for another architecture is made on this machine, whose
loader cannot run that root's programs, as `ldd` would).

    needed(root, path, file=None) -> [path, ...]

answers every library PATH (a path inside the root filesystem ROOT) loads, its loader first, each
as a path inside ROOT, in the order found: the program interpreter of its PT_INTERP header, and
the DT_NEEDED entries of its dynamic section, then theirs, each found as the loader finds it: the
object's own DT_RUNPATH (or DT_RPATH) with $ORIGIN, then the directories ROOT's /etc/ld.so.conf
names, then those Debian's loader knows without it (the multiarch /lib/TRIPLET and /usr/lib/TRIPLET
of the object's machine, then /lib64, /usr/lib64, /lib and /usr/lib: an image has no /etc, and its
libraries are found there). A candidate of
another ELF class or machine (a multiarch root may hold both) is passed over, as the loader
passes it over. A name found nowhere fails: an image that would not start is not made.

Standard library only (`struct` over the ELF header, the program headers and the dynamic
section): it runs in the build stage with `python3 -S`. Paths inside ROOT follow ROOT's symbolic
links as the image will (an absolute link is taken from ROOT, not from this machine's /).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pathlib
import struct

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 1, 5, 15, 29
# The multiarch triplet of each machine we build for (e_machine: EM_X86_64, EM_AARCH64): the
# name of Debian's library directories and the tag of CPython's extension modules.
TRIPLETS = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu"}
DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


class ElfError(Exception):
    """A file that is not an ELF object we can read, or a library that is nowhere in the root."""


@dataclasses.dataclass(frozen=True)
class Elf:
    elf_class: int  # 1: 32-bit, 2: 64-bit
    machine: int  # e_machine
    interpreter: str | None  # PT_INTERP: the loader a program names
    needed: tuple[str, ...]  # DT_NEEDED, in order
    runpath: tuple[str, ...]  # DT_RUNPATH, or DT_RPATH when there is no DT_RUNPATH


def inside(root: pathlib.Path, path: str) -> pathlib.Path:
    """Where PATH, as seen inside ROOT, is on this machine: every symbolic link on the way followed
    within ROOT (at most 40 links, as the kernel allows)."""
    parts = list(pathlib.PurePosixPath(path).parts[1:])
    here = pathlib.PurePosixPath("/")
    hops = 0
    while parts:
        step = here / parts.pop(0)
        real = root / step.relative_to("/")
        if real.is_symlink():
            hops += 1
            if hops > 40:
                raise ElfError(f"{path}: too many symbolic links in {root}")
            target = pathlib.PurePosixPath(os.readlink(real))
            parts = [*(target.parts[1:] if target.is_absolute() else target.parts), *parts]
            here = pathlib.PurePosixPath("/") if target.is_absolute() else here
            continue
        here = pathlib.PurePosixPath(os.path.normpath(step))
    return root / here.relative_to("/")


def read(path: pathlib.Path) -> Elf:
    """PATH's class, machine, interpreter, DT_NEEDED and run path, from its headers."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ElfError(f"{path}: not an ELF object")
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        (machine, phoff, phentsize, phnum) = (struct.unpack_from(end + "H", data, 18)[0],
                                              *struct.unpack_from(end + "Q", data, 32),
                                              *struct.unpack_from(end + "HH", data, 54))
    else:
        (machine, phoff, phentsize, phnum) = (struct.unpack_from(end + "H", data, 18)[0],
                                              *struct.unpack_from(end + "I", data, 28),
                                              *struct.unpack_from(end + "HH", data, 42))
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    interpreter = None
    for i in range(phnum):
        at = phoff + i * phentsize
        if wide:
            p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from(end + "IIQQQQ", data, at)
        else:
            p_type, offset, vaddr, _paddr, filesz = struct.unpack_from(end + "IIIII", data, at)
        if p_type == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (offset, filesz)
        elif p_type == PT_INTERP:
            interpreter = data[offset:offset + filesz].split(b"\0")[0].decode()
    entries: list[tuple[int, int]] = []
    if dynamic is not None:
        entry = struct.Struct(end + ("qQ" if wide else "iI"))
        for at in range(dynamic[0], dynamic[0] + dynamic[1] - entry.size + 1, entry.size):
            tag, value = entry.unpack_from(data, at)
            if tag == DT_NULL:
                break
            entries.append((tag, value))

    def string(offset: int) -> str:
        strtab = next((v for t, v in entries if t == DT_STRTAB), None)
        if strtab is None:
            raise ElfError(f"{path}: a dynamic section without DT_STRTAB")
        # DT_STRTAB is an address: the file offset is found through the PT_LOAD segment holding it.
        base = next((o + strtab - v for v, o, size in loads if v <= strtab < v + size), None)
        if base is None:
            raise ElfError(f"{path}: DT_STRTAB {strtab:#x} is in no loaded segment")
        return data[base + offset:data.index(b"\0", base + offset)].decode()

    needed = tuple(string(v) for t, v in entries if t == DT_NEEDED)
    runpaths = [string(v) for t, v in entries if t == DT_RUNPATH] or [string(v) for t, v in entries if t == DT_RPATH]
    runpath = tuple(d for p in runpaths for d in p.split(":") if d)
    return Elf(elf_class=data[4], machine=machine, interpreter=interpreter, needed=needed, runpath=runpath)


def config_dirs(root: pathlib.Path, conf: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The library directories ROOT's ld.so.conf names, its `include` files' too, in order."""
    path = inside(root, conf)
    if depth > 8 or not path.is_file():
        return []
    found: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include "):
            for pattern in line.split()[1:]:
                base = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(conf), pattern)
                for match in sorted(glob.glob(str(root / base.lstrip("/")))):
                    found += config_dirs(root, "/" + str(pathlib.Path(match).relative_to(root)), depth + 1)
        elif line.startswith("/"):
            found.append(line)
    return found


def needed(root: pathlib.Path, path: str, *, file: pathlib.Path | None = None) -> list[str]:
    """Every library PATH (inside ROOT) loads, transitively, its loader first (the module docstring).
    FILE is where PATH is read from when it is not in ROOT yet (an extension module of the image)."""
    first = read(file if file is not None else inside(root, path))
    triplet = TRIPLETS.get(first.machine)
    system = [*config_dirs(root), *([f"/lib/{triplet}", f"/usr/lib/{triplet}"] if triplet else []), *DEFAULT_DIRS]
    found: list[str] = []
    if first.interpreter:
        found.append(first.interpreter)
    queue = [(path, first)]
    seen_names: set[str] = set()
    while queue:
        owner, elf = queue.pop(0)
        origin = os.path.dirname(owner)
        dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in elf.runpath] + system
        for name in elf.needed:
            if name in seen_names:
                continue
            seen_names.add(name)
            library = _find(root, name, dirs, first) if "/" not in name else name
            if library not in found:
                found.append(library)
            queue.append((library, read(inside(root, library))))
    return found


def _find(root: pathlib.Path, name: str, dirs: list[str], like: Elf) -> str:
    for directory in dirs:
        candidate = os.path.normpath(os.path.join(directory, name))
        real = inside(root, candidate)
        if real.is_file():
            try:
                elf = read(real)
            except ElfError:
                continue
            if (elf.elf_class, elf.machine) == (like.elf_class, like.machine):
                return candidate
    raise ElfError(f"{name}: not found for machine {like.machine} in {root} (searched {', '.join(dirs)})")
