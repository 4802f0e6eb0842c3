"""dispatch_fence's POSIX fence is standard library only, so any training
image with a Python can import it: held two ways, as tests/toolkit holds
`toolkit wrap` to importing nothing heavy.

1. In the project's interpreter, importing it and running both commands
   loads no module outside the standard library and, of the fence, only its
   POSIX files (kit.POSIX_FILES: no object-store code, no other toolkit module).
2. Those files alone (what the sample trainer image carries), copied where
   nothing else is, run with `python -I -S` (no site-packages at all): a
   publish and a read work, so no import can be satisfied from outside the
   standard library.

Which fence module may import which is test_layers.py's.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from tests.checkpoint import kit

PROBE = r"""
import sys
allowed = set(sys.argv[3].split(","))
before = set(sys.modules)
from dispatch_fence import checkpoint
root, staging = sys.argv[1], sys.argv[2]
for argv in (["publish", staging, root, "--epoch", "7", "--attempt", "j.1.0.1.0", "--keep", "2"], ["latest", root]):
    code = checkpoint.main(argv)
    assert code == 0, (argv, code)
outside = sorted(
    m for m in set(sys.modules) - before
    if m.split(".")[0] not in sys.stdlib_module_names and m not in allowed
)
print(outside, file=sys.stderr)
sys.exit(1 if outside else 0)
"""

# The modules of kit.POSIX_FILES, as sys.modules names them.
ALLOWED = ",".join("dispatch_fence" if f == "__init__.py" else f"dispatch_fence.{f[:-3]}" for f in kit.POSIX_FILES)


def test_importing_and_running_it_loads_only_the_standard_library(tmp_path: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "j.1.0.1.0")
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "root"), str(staging), ALLOWED],
                         cwd=kit.REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(tmp_path / "root" / "ckpt-0000000000000000007-000001-j.1.0.1.0")] * 2


def test_the_posix_files_alone_work_without_site_packages(tmp_path: pathlib.Path) -> None:
    lib = tmp_path / "lib" / "dispatch_fence"
    lib.mkdir(parents=True)
    for name in kit.POSIX_FILES:
        shutil.copy(kit.FENCE / name, lib / name)
    staging = kit.staging(tmp_path, "j.1.0.1.0")
    code = f"import sys; sys.path.insert(0, {str(lib.parent)!r})\n" + PROBE
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path / "root"), str(staging), ALLOWED],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "site-packages" not in out.stderr


def test_the_package_init_imports_nothing() -> None:
    # `from dispatch_fence import checkpoint` runs its __init__.py first: it must stay a docstring.
    import ast

    tree = ast.parse((kit.FENCE / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
