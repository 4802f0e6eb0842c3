"""The product's layers point one way (docs/toolkit.md, "Architecture"): every
import of every module of the product, read with `ast`, goes to its own layer
or one the layer table below lets it use, and never to a tool outside the
product.

What counts as an import: `import x`, `from x import y`, `from . import y`
(at module level, inside a function, under TYPE_CHECKING alike), a call
`importlib.import_module("x")` or `__import__("x")` with a literal name, and
a literal "module:attribute" string naming a first-party module (the lazy
command table in toolkit/cli.py names its commands that way, and the click
group imports them from it). A finding names the file, the line, the import
and both layers.

The layer table is the one written description of the order; EXCEPTIONS are
the imports allowed against it, each with its reason, and an exception no
longer used fails too, so the list only shrinks.

The tools outside the product import one way too: the release never imports
the local cluster (TOOLS_NEVER), read the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("toolkit", "controller", "dispatcher", "sidecar")
# First-party code outside the product: it may import the product, the product never imports it.
OUTSIDE = ("devcluster", "release", "refbackend", "bench", "tests", "scripts", "examples", "dispatch_fence", "fence")


@dataclasses.dataclass(frozen=True)
class Layer:
    modules: tuple[str, ...]  # module names, or fnmatch patterns of them
    below: tuple[str, ...]  # the layers it may import besides its own
    # Third-party packages it may import: those the user wheel declares (pyproject.toml), or those and
    # the development distribution's (dev/pyproject.toml), or none. The standard library always.
    third_party: str | None = "wheel"


_UNDER_THE_SHELLS = ("core", "domain", "kube", "operations")

# Bottom to top. A layer imports its own and the ones in `below`: nothing above, nothing beside.
LAYERS: dict[str, Layer] = {
    # The shared core: the standard library only, importable alone (the sidecar ships it and nothing else).
    "core": Layer(modules=("toolkit", "toolkit.names", "toolkit.marks", "toolkit.detect", "toolkit.envparse",
                           "toolkit.envtable",
                           "toolkit.backoff", "toolkit.jsonlog", "toolkit.paths", "toolkit.identity",
                           "toolkit.prologue", "toolkit.formats"),
                  below=(), third_party=None),
    # The identity domain, pure: no Kubernetes client, no I/O beyond reading the files it is given.
    "domain": Layer(modules=("toolkit.raising", "toolkit.derive", "toolkit.history", "toolkit.history.*",
                             "toolkit.causes",
                             "toolkit.flagmark", "toolkit.render", "toolkit.runtime_check", "toolkit.request",
                             "toolkit.wrap", "toolkit.yamlio", "toolkit.releaseinfo"),
                    below=("core",)),
    # The Kubernetes client, beside the domain: neither imports the other.
    "kube": Layer(modules=("toolkit.kube", "toolkit.events", "toolkit.clusterconfig", "toolkit.leader",
                           "toolkit.informer", "toolkit.kubecontext"), below=("core",)),
    # The domain's operations on the outside world: on a cluster through the client, on images through Docker.
    "operations": Layer(modules=("toolkit.adapter", "toolkit.adapter.*", "toolkit.admission_checks",
                                 "toolkit.listing", "toolkit.image_check", "toolkit.mirror"),
                        below=("core", "domain", "kube")),
    # The shells on top: none imports another.
    "cli": Layer(modules=("toolkit.cli", "toolkit.cli_*"), below=_UNDER_THE_SHELLS),
    # The processes: installed into their images, with what the development distribution declares.
    "controller": Layer(modules=("controller", "controller.*"), below=_UNDER_THE_SHELLS, third_party="dev"),
    "dispatcher": Layer(modules=("dispatcher", "dispatcher.*"), below=_UNDER_THE_SHELLS, third_party="dev"),
    "sidecar": Layer(modules=("sidecar", "sidecar.*"), below=("core",), third_party=None),
}

# (importing module, imported module or package): why it is allowed. At most five.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # The checkpoint fence is its own distribution (fence/) so trainers install it alone; the one
    # command that publishes checkpoints from a shell is its only user in the product.
    ("toolkit.cli_checkpoint", "dispatch_fence"): "`toolkit checkpoint` is the fence's command line",
    # requests comes with the docker client (a declared dependency) and carries its errors.
    ("toolkit.image_check", "requests"): "the docker client's transport errors are requests' own",
}

_MODULE_ATTR = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))}


def layer_of(module: str) -> str | None:
    found = [name for name, layer in LAYERS.items()
             if any(fnmatch.fnmatchcase(module, pattern) for pattern in layer.modules)]
    assert len(found) <= 1, f"{module} is in more than one layer: {found}"
    return found[0] if found else None


def _import_names(*pyprojects: str) -> set[str]:
    """The import names of the pyprojects' dependencies, as the installed distributions provide them."""
    wanted = set()
    for pyproject in pyprojects:
        project = tomllib.loads((ROOT / pyproject).read_text())["project"]
        wanted |= {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower().replace("_", "-") for d in project["dependencies"]}
    return {name for name, dists in importlib.metadata.packages_distributions().items()
            if any(d.lower().replace("_", "-") in wanted for d in dists)}


def declared_dependencies() -> dict[str, set[str]]:
    """A layer's `third_party` -> the import names it may use."""
    return {"wheel": _import_names("pyproject.toml"), "dev": _import_names("pyproject.toml", "dev/pyproject.toml")}


def imports(source: str, *, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in `source`, as named in the module docstring."""
    known = set(product_modules())
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def resolve(name: str) -> str:
        # The longest product module `name` starts with, else `name` itself.
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in known:
                return ".".join(parts[:end])
        return name

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, resolve(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            for alias in node.names:
                candidate = f"{base_name}.{alias.name}"
                found.append((node.lineno, candidate if candidate in known else resolve(base_name)))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                found.append((node.lineno, resolve(node.args[0].value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_ATTR.fullmatch(node.value):
            target = node.value.partition(":")[0]
            if target.split(".")[0] in PRODUCT + OUTSIDE:
                found.append((node.lineno, resolve(target)))
    return sorted(found)


def violations(source: str, *, module: str, path: str, is_package: bool = False,
               third_party: dict[str, set[str]] | None = None) -> list[str]:
    """One line per import of `module` that its layer does not allow."""
    third_party = declared_dependencies() if third_party is None else third_party
    own = layer_of(module)
    if own is None:
        return [f"{path}: {module} is in no layer (add it to LAYERS in tests/lint/test_layers.py)"]
    layer = LAYERS[own]
    out = []
    for line, target in imports(source, module=module, is_package=is_package):
        top = target.split(".")[0]
        if (module, top) in EXCEPTIONS or (module, target) in EXCEPTIONS:
            continue
        if top in PRODUCT:
            theirs = layer_of(target)
            if theirs == own or theirs in layer.below:
                continue
            why = f"the {theirs} layer, which the {own} layer may not import"
        elif top in OUTSIDE:
            why = "outside the product"
        elif top in sys.stdlib_module_names or top == "__future__":
            continue
        elif layer.third_party and top in third_party[layer.third_party]:
            continue
        elif layer.third_party is None and any(top in names for names in third_party.values()):
            why = f"a third-party package, and the {own} layer imports the standard library only"
        elif layer.third_party == "wheel" and top in third_party["dev"]:
            why = f"a package the user wheel does not declare (pyproject.toml), and the {own} layer ships in it"
        else:
            why = "outside the product, and not a declared dependency"
        out.append(f"{path}:{line}: {module} ({own}) imports {target}: {why}")
    return out


def test_every_module_of_the_product_imports_only_what_its_layer_allows() -> None:
    third_party = declared_dependencies()
    found = []
    for module, path in product_modules().items():
        found += violations(path.read_text(), module=module, path=str(path.relative_to(ROOT)),
                            is_package=path.name == "__init__.py", third_party=third_party)
    assert found == [], "\n".join(found)


def test_every_exception_is_still_used() -> None:
    modules = product_modules()
    for importer, imported in EXCEPTIONS:
        path = modules[importer]
        targets = {t for _, t in imports(path.read_text(), module=importer)}
        assert any(t == imported or t.split(".")[0] == imported for t in targets), (importer, imported)
    assert len(EXCEPTIONS) <= 5


def test_the_table_names_layers_that_exist_and_only_lower_ones() -> None:
    order = list(LAYERS)
    for name, layer in LAYERS.items():
        assert all(order.index(b) < order.index(name) for b in layer.below), name


# -- the check can fail -------------------------------------------------------

UPWARD = '''\
import importlib
from toolkit import kube


def later():
    from controller import app
    import devcluster.local
    from . import cli_root
    return importlib.import_module("dispatcher.app")


COMMAND = "toolkit.cli_cluster:status_cmd"
'''


def test_an_upward_import_is_reported_with_its_file_and_line() -> None:
    found = violations(UPWARD, module="toolkit.names", path="toolkit/names.py", third_party={"wheel": set(), "dev": set()})
    assert found == [
        "toolkit/names.py:2: toolkit.names (core) imports toolkit.kube: the kube layer, which the core layer may not import",
        "toolkit/names.py:6: toolkit.names (core) imports controller.app: the controller layer, which the core layer may not import",
        "toolkit/names.py:7: toolkit.names (core) imports devcluster.local: outside the product",
        "toolkit/names.py:8: toolkit.names (core) imports toolkit.cli_root: the cli layer, which the core layer may not import",
        "toolkit/names.py:9: toolkit.names (core) imports dispatcher.app: the dispatcher layer, which the core layer may not import",
        "toolkit/names.py:12: toolkit.names (core) imports toolkit.cli_cluster: the cli layer, which the core layer may not import",
    ]


@pytest.mark.parametrize(("module", "source", "allowed"), [
    ("toolkit.adapter", "from toolkit import kube, raising, names\n", True),
    ("toolkit.raising", "from toolkit import kube\n", False),  # the pure domain knows no client
    ("toolkit.kube", "from toolkit import history\n", False),  # nor the client the domain
    ("toolkit.history.repeats", "from toolkit import kube\n", False),  # a part of the domain is the domain
    ("toolkit.adapter.holds", "from toolkit.history import stored\n", True),  # operations use the domain's parts
    ("sidecar.main", "from toolkit import kube\n", False),  # the sidecar: the core only
    ("controller.app", "from toolkit import cli_root\n", False),  # one shell never imports another
    ("toolkit.cli_root", "import click\n", True),
    ("toolkit.detect", "import yaml\n", False),  # the core: the standard library only
    ("toolkit.cli_root", "import leftpad\n", False),  # not a declared dependency
    ("controller.metrics", "import prometheus_client\n", True),  # the controller's image has it
    ("toolkit.cli_root", "import prometheus_client\n", False),  # the user wheel does not
])
def test_the_table_decides(module: str, source: str, allowed: bool) -> None:
    found = violations(source, module=module, path="x.py",
                       third_party={"wheel": {"click", "yaml"}, "dev": {"click", "yaml", "prometheus_client"}})
    assert (found == []) is allowed, found


# -- the tools outside the product --------------------------------------------

# Tool -> the tools it never imports. The local cluster installs the release (devcluster/install.py),
# so the release, what a person runs to publish, knows nothing of the local cluster:
# devcluster -> release -> product.
TOOLS_NEVER: dict[str, tuple[str, ...]] = {"release": ("devcluster",)}


def tool_violations(source: str, *, module: str, path: str) -> list[str]:
    """One line per import of `module`, a tool's module, of a tool TOOLS_NEVER forbids it."""
    never = TOOLS_NEVER.get(module.split(".")[0], ())
    return [f"{path}:{line}: {module} imports {target}: {target.split('.')[0]} depends on "
            f"{module.split('.')[0]}, never the other way"
            for line, target in sorted(set(imports(source, module=module))) if target.split(".")[0] in never]


def test_the_release_imports_nothing_of_the_local_cluster() -> None:
    found = []
    for tool in TOOLS_NEVER:
        paths = sorted((ROOT / tool).rglob("*.py"))
        assert paths, f"{tool}/ holds no module"
        for path in paths:
            found += tool_violations(path.read_text(), module=module_name(path), path=str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)


REACHING_BACK = '''\
import importlib
from release import contexts


def default_kubectl():
    from devcluster import harness, local
    import devcluster.stack
    return importlib.import_module("devcluster.local")
'''


def test_a_release_import_of_the_local_cluster_is_reported_inside_a_function_too() -> None:
    found = tool_violations(REACHING_BACK, module="release.bundle", path="release/bundle.py")
    assert found == [
        "release/bundle.py:6: release.bundle imports devcluster: devcluster depends on release, never the other way",
        "release/bundle.py:7: release.bundle imports devcluster.stack: devcluster depends on release, never the other way",
        "release/bundle.py:8: release.bundle imports devcluster.local: devcluster depends on release, never the other way",
    ]


# -- small rooms --------------------------------------------------------------

MAX_LINES = 400
# Modules allowed past MAX_LINES, each with its reason: at most five. None today.
LONG_MODULES: dict[str, str] = {}


def test_no_module_of_the_product_passes_the_line_bound() -> None:
    modules = product_modules()
    long = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    over = sorted(f"{modules[name].relative_to(ROOT)}: {n} lines" for name, n in long.items()
                  if n > MAX_LINES and name not in LONG_MODULES)
    assert over == [], f"split it, or list it in LONG_MODULES with its reason: {over}"
    assert len(LONG_MODULES) <= 5 and all(long.get(name, 0) > MAX_LINES for name in LONG_MODULES)
