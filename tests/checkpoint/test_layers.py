"""The fence's modules point one way (docs/checkpoint.md, "The fence's modules"):
every import of every module of fence/dispatch_fence/, read with `ast`, goes to
a layer below its own, never to one beside it or above, so the fence has no
import circle, the imports a function makes when it runs included.

What counts as an import: `import x`, `from x import y`, `from . import y`, at
module level, inside a function and under TYPE_CHECKING alike, and a call of
`importlib.import_module` or `__import__` (whose name must be a literal, or the
call is a finding: an import this test cannot read). A finding names the file,
the line, the import and both layers. Outside the fence a layer imports the
standard library, and only the third-party packages its row names.

LAYERS is the order; the doc's table is checked against it row by row, and no
module of the fence is longer than MAX_LINES.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import sys

import pytest

from tests.checkpoint import kit

PACKAGE = "dispatch_fence"
MAX_LINES = 400
DOC = kit.REPO / "docs" / "checkpoint.md"


@dataclasses.dataclass(frozen=True)
class Layer:
    files: tuple[str, ...]  # the modules' files in fence/dispatch_fence/
    below: tuple[str, ...]  # the layers it may import (the package itself: every layer)
    third_party: tuple[str, ...] = ()  # top-level names it may import besides the standard library


# Bottom to top. A module imports the layers in `below` only: nothing of its own layer, nothing above.
LAYERS: dict[str, Layer] = {
    "package": Layer(files=("__init__.py",), below=()),
    "model": Layer(files=("model.py",), below=()),
    "posix": Layer(files=("posix.py",), below=("model",)),
    "transfer": Layer(files=("transfer.py",), below=("model",)),
    "client": Layer(files=("client.py",), below=("model", "transfer")),
    "aws": Layer(files=("aws.py",), below=()),
    "clients": Layer(files=("s3.py", "gcs.py"), below=("model", "transfer", "client", "aws"),
                     third_party=("obstore", "google")),
    "objectstore": Layer(files=("objectstore.py",), below=("model", "transfer", "client", "clients")),
    "roots": Layer(files=("roots.py",), below=("model", "posix", "objectstore")),
    "cli": Layer(files=("cli.py",), below=("model", "roots")),
    "dcp_storage": Layer(files=("dcp_storage.py",), below=("model", "roots", "objectstore"), third_party=("torch",)),
    "dcp_reader": Layer(files=("dcp_reader.py",), below=("model", "roots", "objectstore", "dcp_storage"),
                        third_party=("torch",)),
    "integrations": Layer(files=("dcp.py", "huggingface.py", "lightning.py"),
                          below=("model", "roots", "objectstore", "dcp_storage", "dcp_reader"),
                          third_party=("torch", "lightning", "transformers")),
    "surface": Layer(files=("checkpoint.py", "__main__.py"), below=("model", "posix", "roots", "cli")),
}


def module_of(file: str) -> str:
    return PACKAGE if file == "__init__.py" else f"{PACKAGE}.{file.removesuffix('.py')}"


def layer_of(module: str) -> str | None:
    found = [name for name, layer in LAYERS.items() if module in map(module_of, layer.files)]
    assert len(found) <= 1, f"{module} is in more than one layer: {found}"
    return found[0] if found else None


def fence_files() -> dict[str, pathlib.Path]:
    """module name -> file, for every .py under fence/dispatch_fence/."""
    return {module_of(str(p.relative_to(kit.FENCE))): p for p in sorted(kit.FENCE.rglob("*.py"))}


def imports(source: str, *, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in SOURCE, as the module docstring counts them; a
    module of the fence is named whole (`from dispatch_fence import s3` imports dispatch_fence.s3).
    An import_module or __import__ call whose name is not a literal yields the name "?"."""
    package = module if module == PACKAGE else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                found.append((node.lineno, f"{base}.{alias.name}" if base == PACKAGE else base))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                found.append((node.lineno, arg.value if literal else "?"))  # type: ignore[union-attr]
    return sorted(found)


def violations(source: str, *, module: str, path: str) -> list[str]:
    """One line per import of MODULE that its layer does not allow."""
    own = layer_of(module)
    if own is None:
        return [f"{path}: {module} is in no layer (add it to LAYERS in tests/checkpoint/test_layers.py "
                "and to the table in docs/checkpoint.md)"]
    layer = LAYERS[own]
    out = []
    for line, target in imports(source, module=module):
        top = target.split(".")[0]
        if target == "?":
            why = "a name that is not a literal: an import this test cannot read"
        elif top == PACKAGE:
            if target == PACKAGE:
                continue  # the package itself: its __init__.py imports nothing
            theirs = layer_of(target)
            if theirs in layer.below:
                continue
            where = "its own layer" if theirs == own else f"the {theirs} layer" if theirs else "no layer"
            why = f"{where}, which the {own} layer may not import"
        elif top in sys.stdlib_module_names or top == "__future__" or top in layer.third_party:
            continue
        else:
            why = f"outside the standard library, and not a package the {own} layer may import"
        out.append(f"{path}:{line}: {module} ({own}) imports {target}: {why}")
    return out


def test_every_import_of_the_fence_goes_down_its_layers() -> None:
    found = []
    for module, path in fence_files().items():
        found += violations(path.read_text(), module=module, path=str(path.relative_to(kit.REPO)))
    assert found == [], "\n".join(found)


def test_the_fence_has_no_import_circle() -> None:
    # Implied by the test above when the table is right; this one holds the graph itself.
    files = fence_files()
    graph = {m: {t for _, t in imports(p.read_text(), module=m) if t in files and t != m} for m, p in files.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"an import circle: {' -> '.join(path[path.index(module):] + [module])}"
        if module not in done:
            for target in sorted(graph[module]):
                visit(target, path + [module])
            done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_table_names_every_module_once_and_goes_only_down() -> None:
    order = list(LAYERS)
    for name, layer in LAYERS.items():
        assert all(order.index(b) < order.index(name) for b in layer.below), name
    listed = sorted(f for layer in LAYERS.values() for f in layer.files)
    assert listed == sorted(str(p.relative_to(kit.FENCE)) for p in fence_files().values())


def test_no_module_of_the_fence_is_longer_than_the_bound() -> None:
    long = {str(p.relative_to(kit.REPO)): n for p in fence_files().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"longer than {MAX_LINES} lines: {long}"


def doc_table() -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(layer, files, layers it imports) for every row of the doc's table, in its order."""
    text = DOC.read_text()
    section = text[text.index("\n## The fence's modules\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    out = []
    for cells in rows[2:]:  # after the header and its rule
        layer, files, _, below = (c.strip() for c in cells)
        out.append((layer, tuple(re.findall(r"`([^`]+\.py)`", files)),
                    () if below == "nothing" else tuple(b.strip() for b in below.split(","))))
    return out


def test_the_doc_writes_the_same_order_down() -> None:
    assert doc_table() == [(name, layer.files, layer.below) for name, layer in LAYERS.items()]


# -- the check can fail -------------------------------------------------------

AGAINST = '''\
import importlib
from dispatch_fence import posix


def later(name):
    from dispatch_fence import roots
    from . import model
    from .lightning import CheckpointIO
    import obstore
    importlib.import_module("dispatch_fence.cli")
    return __import__(name)
'''


def test_an_import_against_the_order_is_reported_with_its_file_and_line() -> None:
    found = violations(AGAINST, module="dispatch_fence.gcs", path="fence/dispatch_fence/gcs.py")
    layers = "which the clients layer may not import"
    assert found == [
        f"fence/dispatch_fence/gcs.py:2: dispatch_fence.gcs (clients) imports dispatch_fence.posix: the posix layer, {layers}",
        f"fence/dispatch_fence/gcs.py:6: dispatch_fence.gcs (clients) imports dispatch_fence.roots: the roots layer, {layers}",
        f"fence/dispatch_fence/gcs.py:8: dispatch_fence.gcs (clients) imports dispatch_fence.lightning: "
        f"the integrations layer, {layers}",
        f"fence/dispatch_fence/gcs.py:10: dispatch_fence.gcs (clients) imports dispatch_fence.cli: the cli layer, {layers}",
        "fence/dispatch_fence/gcs.py:11: dispatch_fence.gcs (clients) imports ?: "
        "a name that is not a literal: an import this test cannot read",
    ]


@pytest.mark.parametrize(("module", "source", "allowed"), [
    ("dispatch_fence.objectstore", "from dispatch_fence import s3\n", True),  # the protocol imports its clients
    ("dispatch_fence.s3", "from dispatch_fence import objectstore\n", False),  # never the other way round
    ("dispatch_fence.s3", "from dispatch_fence import gcs\n", False),  # beside each other
    ("dispatch_fence.posix", "def f():\n    from dispatch_fence import objectstore\n", False),  # the roots: beside
    ("dispatch_fence.model", "def f():\n    from dispatch_fence import roots\n", False),  # a lazy import is one too
    ("dispatch_fence.roots", "def f():\n    from dispatch_fence import objectstore\n", True),
    ("dispatch_fence.cli", "from dispatch_fence import checkpoint\n", False),  # the surface is on top
    ("dispatch_fence.dcp", "from dispatch_fence import lightning\n", False),
    ("dispatch_fence.model", "import obstore\n", False),  # the standard library only
    ("dispatch_fence.s3", "from obstore.store import S3Store\n", True),
    ("dispatch_fence.lightning", "from lightning.fabric.plugins import CheckpointIO\n", True),
    ("dispatch_fence.checkpoint", "import dispatch_fence\nfrom dispatch_fence import cli\n", True),
])
def test_the_table_decides(module: str, source: str, allowed: bool) -> None:
    found = violations(source, module=module, path="x.py")
    assert (found == []) is allowed, found
