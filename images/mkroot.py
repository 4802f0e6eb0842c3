"""Makes the root filesystem of one of our Python images: what the image's entry point loads, and
nothing else (images/{sidecar,controller,dispatcher}.Containerfile run this in their build stage,
on the Python base, and copy the result into an empty image).

    mkroot.py IMAGE SRC DEST

IMAGE names the roots (ROOTS below). SRC holds our packages and, for the controller and the
dispatcher, the third-party packages unpacked from their wheels; it becomes /opt/dispatch, the
image's working directory, so `python -m IMAGE` finds them with no site and no PYTHONPATH.

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
every shared library the interpreter and they load (ldd) is copied with the symbolic links on its
path (/lib64 -> usr/lib64 ...). The data files of every package loaded from SRC come along (not
its .py files nor py.typed), as does the *.dist-info (its RECORD left out: metadata and licenses) of each
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

import ast
import importlib.util
import marshal
import os
import pathlib
import py_compile
import shutil
import subprocess
import sys
import zipfile

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


def main() -> int:
    image, src, dest = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    if image not in ROOTS:
        raise SystemExit(f"mkroot: IMAGE must be one of {', '.join(ROOTS)}, found {image!r}")
    modules = closure(src, image)
    modules[f"{image}.__main__"] = str(src / image / "__main__.py")  # what `-m IMAGE` runs
    for package in WHOLE.get(image, ()):
        for path in sorted((src / package).rglob("*")):
            if path.suffix in (".py", ".so"):
                parts = path.relative_to(src).parts
                parts = (*parts[:-1], path.name.split(".")[0])
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                modules.setdefault(name, str(path))
    binaries = [os.path.realpath(sys.executable)]
    # The landmark by which the interpreter finds its standard library (os itself is frozen).
    if modules.get("os") in (None, "frozen"):
        modules["os"] = str(STDLIB / "os.py")
    packages = set()
    for name, origin in sorted(modules.items()):
        if origin in (None, "built-in", "frozen"):
            continue
        path = pathlib.Path(origin)
        if path.is_relative_to(src):
            out = dest / APP.relative_to("/") / path.relative_to(src)
            if path.name.startswith("__init__."):
                packages.add(path.parent)
        elif path.is_relative_to(STDLIB):
            out = dest / path.relative_to("/")
        else:
            raise SystemExit(f"mkroot: {name} comes from {origin}, outside the standard library and {src}")
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            compile_module(path, out.with_suffix(".pyc"), docstrings=_ours(name) or path.is_relative_to(STDLIB))
        else:  # an extension module
            shutil.copy2(path, out)
            binaries.append(str(path))
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
    replicate(binaries[0], dest)
    for binary in binaries:
        for library in libraries(binary):
            replicate(library, dest)
    (dest / binaries[0].lstrip("/")).with_name("python3").symlink_to(pathlib.Path(binaries[0]).name)
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"mkroot: {image}: {sum(1 for p in dest.rglob('*.pyc')) + zipped} modules ({zipped} zipped), "
          f"{len(binaries) - 1} extension modules, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
