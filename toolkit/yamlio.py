"""Reading and writing the YAML and JSON documents the CLI handles.

Reading is strict: a key given twice in one mapping is refused (PyYAML and
json would silently keep the last one, so a request could say two things
and mean one), and errors are one line naming the file and the position.
Writing is stable: keys keep their insertion order (the renderers choose
it), and a multi-line string, such as the prologue, is written as a
literal block (`|`) so a reviewer reads the script as it is; the loader
gives back the same bytes (tests hold that).

`yaml` is imported inside the functions: modules that only might need it
(request, the CLI) stay cheap to import.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any


class LoadError(ValueError):
    """The file cannot be read or decoded; the message names the file."""


def _refuse_duplicates(pairs: list[tuple[Any, Any]], *, where: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if isinstance(key, (list, dict)):
            raise LoadError(f"{where}: a key must be a plain value, found {type(key).__name__} {key!r}")
        if key in out:
            raise LoadError(f"{where}: key {key!r} appears twice")
        out[key] = value
    return out


def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise LoadError(f"{path}: cannot read: {reason}") from None


def loads_yaml(text: str, *, where: str) -> list[Any]:
    """Every non-empty document of a YAML stream."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        pairs = [(loader.construct_object(k, deep=True), loader.construct_object(v, deep=True)) for k, v in node.value]
        return _refuse_duplicates(pairs, where=f"{where} line {node.start_mark.line + 1}")

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        docs = list(yaml.load_all(text, Loader=Loader))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise LoadError(f"{where}: not YAML: {problem}{at}") from None
    return [d for d in docs if d is not None]


def load_documents(path: str) -> list[Any]:
    """The documents of a file: one for `.json`, every one of a YAML stream."""
    text = _read(path)
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            return [json.loads(text, object_pairs_hook=lambda p: _refuse_duplicates(p, where=path))]
        except json.JSONDecodeError as exc:
            raise LoadError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    docs = loads_yaml(text, where=path)
    if not docs:
        raise LoadError(f"{path}: no document")
    return docs


def load_document(path: str) -> Any:
    """Exactly one document."""
    docs = load_documents(path)
    if len(docs) != 1:
        raise LoadError(f"{path}: expected one document, found {len(docs)}")
    return docs[0]


def _dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, string)
    return Dumper


def dump(obj: Any) -> str:
    import yaml

    return str(yaml.dump(obj, Dumper=_dumper(), sort_keys=False, default_flow_style=False, width=1 << 20))


def dump_all(objs: Iterable[Any]) -> str:
    import yaml

    return str(
        yaml.dump_all(list(objs), Dumper=_dumper(), sort_keys=False, default_flow_style=False, width=1 << 20)
    )
