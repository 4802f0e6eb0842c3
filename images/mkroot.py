"""Makes the root filesystem of one of our Python images: what the image's entry point loads, and
nothing else (images/{sidecar,controller,dispatcher}.Containerfile run this in their build stage,
on the Python base, and copy the result into an empty image).

    mkroot.py [--root ROOT] [--probe-src PROBE] IMAGE SRC DEST

IMAGE names the roots (ROOTS below). SRC holds our packages and, for the controller and the
dispatcher, the third-party packages unpacked from their wheels; it becomes /opt/dispatch, the
image's working directory, so `python -m IMAGE` finds them with no site and no PYTHONPATH.

ROOT (default /, this interpreter's own) is the root filesystem the image's interpreter, standard
library and shared libraries are taken from: a Debian root of the image's architecture, which may
not be this machine's (the images' Containerfiles mount their base of the target platform there,
and run this on the build machine's base). Nothing of ROOT is ever run: the modules are found by
this interpreter, which must be ROOT's Python version (checked: the same version string in ROOT's
interpreter, the same bytecode magic number in ROOT's importlib), each module then taken from ROOT
(an extension module by its name, with ROOT's platform tag), and the libraries found by reading
ELF headers (images/elf.py). PROBE (default SRC) is SRC as this interpreter can import it: for
another architecture, the same distributions unpacked from this machine's wheels, whose extension
modules load here; each module found there is taken from SRC.

The modules are found by importing the roots with this interpreter (-S, as the image runs) and
taking every module loaded, startup's included: an import added to our code is carried without a
list to edit. For the controller and the dispatcher the roots are every module of the image's own
package and what its __main__ imports, and the closure is grown to a fixpoint by reading the import statements of every module
loaded from SRC, function bodies included (a lazy import, which importing alone does not run): an
import of our own package that does not resolve fails the build; one of a third-party module that
does not resolve (an optional dependency tried under `except ImportError`) is reported and left out,
as it would be missing under pip too. Standard-library modules' own lazy imports are not read: the
ones our code reaches are among the roots (EXTRA).

Source modules become sourceless bytecode in place of the .py (`os.pyc`, not
`__pycache__/os.cpython-311.pyc`), so the image holds no source and needs no writable path;
third-party bytecode is compiled without docstrings (asserts kept), ours and the standard
library's as they are. Built-in and frozen modules need no file. Extension modules are copied, and
every shared library the interpreter and they load (images/elf.py, as the loader finds them) is
copied with the symbolic links on its path (/lib64 -> usr/lib64 ...). The data files of every
package loaded from SRC come along (not its .py files nor py.typed), as does the *.dist-info (its RECORD left out: metadata and licenses) of each
distribution the image carries a module of, its METADATA cut to the headers (the description after
them is the project's README, for some its changelog too: 250 KB in the controller's image that
nothing reads at run time; importlib.metadata and image scanners read the headers).
tests/sidecar/test_sidecar_retry.py holds every module a sidecar check imports to the sidecar's
closure; tests/controller/test_image.py and tests/dispatcher/test_image.py import, inside the
image, every module it carries. A third-party package that is bytecode alone is then moved into
the zip archive on the interpreter's default path (zip_pure_packages), which holds it in about a
quarter of the space.

No shell, no package manager, no /etc: the images run as a numeric user, and read only their
environment, the Downward API and ServiceAccount files, and the API server.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import marshal
import os
import pathlib
import py_compile
import re
import shutil
import subprocess
import sys
import types
import zipfile


def _sibling(name: str) -> types.ModuleType:
    """images/NAME.py, loaded from beside this file however this file was loaded: run as a script in
    the build stage, or by its path from a test, where images/ is on no import path. A deliberate
    exception to importing by name."""
    spec = importlib.util.spec_from_file_location(f"_mkroot_{name}", pathlib.Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
    spec.loader.exec_module(module)
    return module


elf = _sibling("elf")

# What each image's entry point imports, at start and later. runpy runs `-m IMAGE`; site lets
# `python3` without -S start in the image (the image tests' probes). The sidecar's: encodings.ascii
# is the codec of the file its startupProbe waits for; email.utils is imported by toolkit.backoff for
# a Retry-After that is an HTTP date (rare: the apiserver sends seconds).
# encodings.cp437 is the codec zipfile reads a member's name with (importlib.metadata reads the zip
# archive on sys.path that way, zip_pure_packages). _strptime is what datetime.strptime imports at
# its first call, which no import statement names: the Kubernetes client's leader election parses
# the Lease's times with it.
EXTRA = ("runpy", "encodings.ascii", "encodings.idna", "encodings.latin_1", "encodings.cp437", "email.utils",
         "_strptime")
ROOTS = {
    "sidecar": ("runpy", "sidecar", "sidecar.main", "encodings.ascii", "email.utils"),
    # The standard-library modules cryptography's modules import that nothing else loads (its
    # PKCS#7 serialization: email's MIME writer), since those modules are carried whole (WHOLE).
    "controller": ("site", *EXTRA, "email.generator", "email.message", "email.policy", "email.base64mime"),
    # concurrent.futures.thread: the package's module __getattr__ imports it on the first use of
    # ThreadPoolExecutor (the dispatcher's worker pool), an import no statement names.
    "dispatcher": ("site", *EXTRA, "concurrent.futures.thread"),
}
# Third-party packages each image carries whole, every module of them, not only those an import
# shows: cryptography's Rust extension imports its Python modules from native code (dsa, dh, the
# serialization package), which no import statement names, and which an import order that fails
# partway inside a caller's `try: ... except ImportError` can leave unloaded at probe time.
WHOLE = {"controller": ("cryptography",)}
# The images whose own package's every module is a root, and whose closure grows by reading imports.
SCANNED = ("controller", "dispatcher")
OURS = ("sidecar", "controller", "dispatcher", "toolkit")
STDLIB = pathlib.Path(os.__file__).parent
APP = pathlib.Path("/opt/dispatch")

PROBE = """
import importlib.util, sys
sys.path.insert(0, SRC)
failed = {}
for name in REQUIRED:
    if name.startswith("?"):  # required if it names a module (`from A import B`: B may be an attribute)
        name = name[1:]
        parent = sys.modules.get(name.rpartition(".")[0])
        if (parent is not None and not hasattr(parent, "__path__")) or (
                "." in name and importlib.util.find_spec(name) is None):
            continue
    __import__(name)
for name in OPTIONAL:
    parent = sys.modules.get(name.rpartition(".")[0])
    if parent is not None and not hasattr(parent, "__path__"):
        continue  # `from A import B` with A a module: B is an attribute
    try:
        if importlib.util.find_spec(name) is not None:
            __import__(name)
    except Exception as exc:  # an optional dependency absent, or one that refuses to load here
        failed[name] = f"{type(exc).__name__}: {exc}"
print(repr(({n: getattr(m.__spec__, 'origin', None) for n, m in sys.modules.items()
             if getattr(m, '__spec__', None)}, failed)))
"""


def _load(src: pathlib.Path, required: list[str], optional: list[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Import REQUIRED (each must load) and OPTIONAL (each if it can) in a fresh -S interpreter;
    every module then loaded, by origin, and the optional ones that did not load, with why."""
    code = f"SRC = {str(src)!r}\nREQUIRED = {required!r}\nOPTIONAL = {optional!r}\n" + PROBE
    done = subprocess.run([sys.executable, "-S", "-"], input=code, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mkroot: importing the roots failed:\n{done.stderr}")
    loaded, failed = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return loaded, failed


def package_modules(src: pathlib.Path, package: str) -> list[str]:
    """Every module of PACKAGE under SRC but its __main__ (importing that runs the program)."""
    found = []
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def imports_in(path: pathlib.Path, module: str) -> set[str]:
    """The module names PATH's import statements name, anywhere in it (MODULE is its own name);
    `from A import B` names A and A.B (B may be a module)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target:
                names.add(target)
                names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def closure(src: pathlib.Path, image: str = "sidecar") -> dict[str, str | None]:
    """Every module IMAGE's entry point loads, by origin (see the module docstring)."""
    required = list(ROOTS[image])
    if image in SCANNED:
        # Every module of the package, and the modules its __main__ (which importing would run) names.
        required += package_modules(src, image) + [
            f"?{n}" for n in sorted(imports_in(src / image / "__main__.py", f"{image}.__main__"))]
    if image not in SCANNED:
        loaded, _ = _load(src, required, [])
        return loaded
    optional: set[str] = set()
    read: dict[str, set[str]] = {}
    while True:
        loaded, failed = _load(src, required, sorted(optional))
        found: set[str] = set()
        for name, origin in loaded.items():
            if origin and origin.endswith(".py") and pathlib.Path(origin).is_relative_to(src):
                if origin not in read:
                    read[origin] = imports_in(pathlib.Path(origin), name)
                found |= read[origin]
        new = found - set(loaded) - optional
        if not new:
            mine = sorted(n for n in failed if n.split(".")[0] == image)
            if mine:
                raise SystemExit(f"mkroot: {mine[0]}, imported by {image}, does not load: {failed[mine[0]]}")
            print(f"mkroot: {image}: left out, not loadable here: " + ", ".join(sorted(failed)))
            return loaded
        optional |= new


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                # Dropped (a module's `from __future__` must come first), or a pass where it was all.
                node.body[:1] = [] if len(node.body) > 1 else [ast.copy_location(ast.Pass(), first)]
    return tree


def compile_module(path: pathlib.Path, out: pathlib.Path, *, docstrings: bool) -> None:
    """PATH as sourceless, unchecked hash-based bytecode at OUT (PEP 552), with or without docstrings."""
    if docstrings:
        py_compile.compile(str(path), cfile=str(out), dfile=str(path), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return
    source = path.read_bytes()
    code = compile(_strip_docstrings(ast.parse(source, str(path))), str(path), "exec", dont_inherit=True)
    out.write_bytes(importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                    + importlib.util.source_hash(source) + marshal.dumps(code))


def replicate(path: str, dest: pathlib.Path, root: pathlib.Path) -> None:
    """Copy PATH, a path inside ROOT, into DEST at the same place, with every symbolic link on the
    way (a link to a link too; an absolute link is followed in ROOT, as the image will follow it)."""
    parts = pathlib.PurePosixPath(path).parts[1:]
    here = pathlib.PurePosixPath("/")
    for i, part in enumerate(parts):
        step = here / part
        if (root / step.relative_to("/")).is_symlink():
            target = os.readlink(root / step.relative_to("/"))
            link = dest / step.relative_to("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(target)
            resolved = os.path.normpath(os.path.join(str(here), target))
            replicate(os.path.join(resolved, *parts[i + 1:]), dest, root)
            return
        here = step
    out = dest / here.relative_to("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / here.relative_to("/"), out)


def check_version(root: pathlib.Path, interpreter: str) -> None:
    """ROOT's Python is this interpreter's version, so that the bytecode compiled here is its own:
    its interpreter names the same version (PY_VERSION, a string of its own in the binary) and its
    importlib the same magic number. Read from the files, never run."""
    version = "{}.{}.{}".format(*sys.version_info[:3])
    alone = rb"(?<![\x20-\x7e])%s(?![\x20-\x7e])"
    binary = elf.inside(root, interpreter).read_bytes()
    if not re.search(alone % re.escape(version.encode()), binary):
        named = sorted({m.decode() for m in re.findall(alone % rb"3\.\d+\.\d+", binary)})
        raise SystemExit(f"mkroot: {interpreter} in {root} is not Python {version} (it names "
                         f"{', '.join(named) or 'no version'}): the bytecode compiled here would not be its own")
    bootstrap = elf.inside(root, str(STDLIB / "importlib" / "_bootstrap_external.py")).read_text()
    magic = re.search(r"^MAGIC_NUMBER = \((\d+)\)\.to_bytes\(2, 'little'\)", bootstrap, re.MULTILINE)
    if magic is None or int(magic.group(1)).to_bytes(2, "little") != importlib.util.MAGIC_NUMBER[:2]:
        raise SystemExit(f"mkroot: the importlib in {root} has another bytecode magic number than Python {version}")


def source_of(origin: pathlib.Path, *, src: pathlib.Path, probe: pathlib.Path, root: pathlib.Path,
              triplet: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Where the module this interpreter loaded from ORIGIN (under PROBE or the standard library)
    is taken from for the image, and its path in the image: the same file under SRC or ROOT's
    standard library, a name with this machine's triplet in it (_sysconfigdata__TRIPLET) given
    ROOT's TRIPLET, an extension module ROOT's platform tag."""
    if origin.is_relative_to(probe):
        base, image_dir, rel = src, APP, origin.relative_to(probe)
    elif origin.is_relative_to(STDLIB):
        here = getattr(sys.implementation, "_multiarch", "")
        rel = origin.relative_to(STDLIB)
        rel = pathlib.Path(str(rel).replace(here, triplet)) if here else rel
        base, image_dir = elf.inside(root, str(STDLIB)), STDLIB
    else:
        raise SystemExit(f"mkroot: a module comes from {origin}, outside the standard library and {probe}")
    if origin.suffix == ".py":
        found = base / rel
    else:  # an extension module: its name, and ROOT's tag (as importlib.machinery.EXTENSION_SUFFIXES has them)
        name = origin.name.split(".")[0]
        tags = (f".cpython-{sys.version_info[0]}{sys.version_info[1]}-{triplet}.so", ".abi3.so", ".so")
        found = next((c for c in (base / rel.parent / f"{name}{t}" for t in tags) if c.is_file()), base / rel)
    if not found.is_file():
        raise SystemExit(f"mkroot: {found} is missing (this machine loaded {origin}): SRC and ROOT must "
                         "hold the same distributions and Python as this machine's")
    return found, image_dir / found.relative_to(base)


def copy_data(src: pathlib.Path, package_dir: pathlib.Path, dest: pathlib.Path) -> None:
    """PACKAGE_DIR's data files (not its modules), and those of its subdirectories that are not packages."""
    for item in package_dir.iterdir():
        if item.name in ("__pycache__", "py.typed") or item.suffix in (".py", ".pyc", ".pyi", ".so"):
            continue  # (py.typed marks a package for type checkers; nothing reads it at run time)
        if item.is_dir():
            if not (item / "__init__.py").exists():
                copy_data(src, item, dest)
            continue
        out = dest / APP.relative_to("/") / item.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, out)


def distribution_tops(info: pathlib.Path) -> set[str]:
    """The top-level modules and packages the distribution of INFO (a *.dist-info) installs, from its RECORD."""
    record = info / "RECORD"
    if not record.exists():
        return set()
    tops = set()
    for line in record.read_text().splitlines():
        first = line.split(",")[0].split("/")[0]
        if first and not first.endswith((".dist-info", ".data")):
            tops.add(first.split(".")[0])
    return tops


def zip_pure_packages(dest: pathlib.Path) -> int:
    """Move every third-party top-level module or package under DEST's /opt/dispatch that is bytecode
    alone (no extension module, no data file) into the zip archive the interpreter has on its
    default sys.path (PREFIX/lib/pythonXY.zip), deflated and in a fixed order and time; answers how
    many modules moved. Bytecode deflates to about a quarter, and zipimport reads sourceless .pyc;
    a package with an extension module or data stays on disk (neither loads from a zip here)."""
    archive = pathlib.Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}{sys.version_info[1]}.zip"
    default_path = subprocess.run([sys.executable, "-S", "-E", "-c", "import sys; print(repr(sys.path))"],
                                  capture_output=True, text=True, check=True).stdout
    if str(archive) not in ast.literal_eval(default_path):
        return 0
    app = dest / APP.relative_to("/")
    entries: list[tuple[str, pathlib.Path]] = []
    for top in sorted(app.iterdir()):
        if top.name.split(".")[0] in OURS or top.suffix == ".dist-info":
            continue
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if not p.is_dir())
        if files and all(p.suffix == ".pyc" and not p.is_symlink() for p in files):
            entries += [(str(p.relative_to(app)), p) for p in files]
    if not entries:
        return 0
    out = dest / archive.relative_to("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, path in entries:
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), path.read_bytes(),
                       compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    for _, path in entries:
        path.unlink()
    for top in sorted(app.iterdir()):
        if top.is_dir() and not any(p.is_file() for p in top.rglob("*")):
            shutil.rmtree(top)
    return len(entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mkroot.py", description="The minimal root of one of our Python images.")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path("/"),
                        help="the root filesystem of the image's platform the interpreter, standard library and "
                             "libraries are taken from (default: this interpreter's own)")
    parser.add_argument("--probe-src", type=pathlib.Path, default=None,
                        help="SRC as this interpreter imports it (its extension modules this machine's; default SRC)")
    parser.add_argument("image", choices=sorted(ROOTS))
    parser.add_argument("src", type=pathlib.Path)
    parser.add_argument("dest", type=pathlib.Path)
    args = parser.parse_args(argv)
    image, src, dest, root = args.image, args.src.absolute(), args.dest.absolute(), args.root.absolute()
    probe = (args.probe_src or src).absolute()
    interpreter = os.path.realpath(sys.executable)  # /usr/bin/python3.11, in ROOT too (both Debian's)
    check_version(root, interpreter)
    machine = elf.read(elf.inside(root, interpreter)).machine
    if machine not in elf.TRIPLETS:
        raise SystemExit(f"mkroot: {interpreter} in {root} is for ELF machine {machine}, none we build for")
    triplet = elf.TRIPLETS[machine]
    modules = closure(probe, image)
    modules[f"{image}.__main__"] = str(probe / image / "__main__.py")  # what `-m IMAGE` runs
    for package in WHOLE.get(image, ()):
        for path in sorted((probe / package).rglob("*")):
            if path.suffix in (".py", ".so"):
                parts = path.relative_to(probe).parts
                parts = (*parts[:-1], path.name.split(".")[0])
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                modules.setdefault(name, str(path))
    # The landmark by which the interpreter finds its standard library (os itself is frozen).
    if modules.get("os") in (None, "frozen"):
        modules["os"] = str(STDLIB / "os.py")
    extensions: list[tuple[str, pathlib.Path]] = []  # (path in the image, the file copied there)
    packages = set()
    for name, origin in sorted(modules.items()):
        if origin in (None, "built-in", "frozen"):
            continue
        found, in_image = source_of(pathlib.Path(origin), src=src, probe=probe, root=root, triplet=triplet)
        out = dest / in_image.relative_to("/")
        if found.name.startswith("__init__.") and found.is_relative_to(src):
            packages.add(found.parent)
        out.parent.mkdir(parents=True, exist_ok=True)
        if found.suffix == ".py":
            compile_module(found, out.with_suffix(".pyc"), docstrings=_ours(name) or in_image.is_relative_to(STDLIB))
        else:  # an extension module
            shutil.copy2(found, out)
            extensions.append((str(in_image), out))
    for package_dir in sorted(packages):
        copy_data(src, package_dir, dest)
    tops = {name.split(".")[0] for name in modules}
    for info in sorted(src.glob("*.dist-info")):
        if distribution_tops(info) & tops:  # a distribution the image carries: its metadata and licenses
            out = dest / APP.relative_to("/") / info.name
            shutil.copytree(info, out, ignore=shutil.ignore_patterns("RECORD"))
            metadata = out / "METADATA"
            if metadata.exists():
                headers, blank, _description = metadata.read_bytes().partition(b"\n\n")
                metadata.write_bytes(headers + (b"\n" if blank else b""))
    zipped = zip_pure_packages(dest)
    replicate(interpreter, dest, root)
    for library in elf.needed(root, interpreter):
        replicate(library, dest, root)
    for in_image, copied in extensions:
        for library in elf.needed(root, in_image, file=copied):
            replicate(library, dest, root)
    (dest / interpreter.lstrip("/")).with_name("python3").symlink_to(pathlib.Path(interpreter).name)
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"mkroot: {image} ({triplet}): {sum(1 for p in dest.rglob('*.pyc')) + zipped} modules ({zipped} zipped), "
          f"{len(extensions)} extension modules, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
