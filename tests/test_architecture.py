"""The layering of ARCHITECTURE.md, checked on the source: import cycles and forbidden edges fail the suite.

Imports are read with ``ast`` from every module of the four packages, function-local imports included;
imports under ``if TYPE_CHECKING:`` (annotations only) are ignored. ``from pkg import name`` counts as an edge to
``pkg.name`` when that is a module, otherwise to ``pkg``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tabletopic", "worker", "coordinator", "configs")

# The broker's upper layer: what worker/, coordinator/ and configs/ must never import (ARCHITECTURE.md).
UPPER = ("tabletopic.broker", "tabletopic.plugin_host", "tabletopic.server", "tabletopic.cli")


@dataclass(frozen=True)
class Rule:
    """Modules under ``source`` must not import modules under any of ``forbidden`` (prefixes), except ``allowed``."""

    source: str
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    why: str = ""


RULES = (
    Rule("configs", ("tabletopic", "worker", "coordinator"), why="configs is the bottom layer"),
    Rule("worker", UPPER, why="workers get what they need from the broker by injection or from its base modules"),
    Rule("coordinator", UPPER, why="the coordinator gets what it needs by injection or from the broker's base"),
    Rule("worker", ("coordinator",), allowed=("coordinator.contract",),
         why="worker and coordinator share only the contract module"),
    Rule("coordinator", ("worker",), why="worker and coordinator share only the contract module"),
    Rule("coordinator", ("tabletopic.spark",),
         why="the coordinator reaches Spark only through the TableEngine it is given (coordinator.engine)"),
    Rule("worker", ("tabletopic.spark",), why="workers never run Spark"),
    *(Rule(side, ("tabletopic.table_runtime",), why="the runtime owns the coordinator and the workers, not the reverse")
      for side in ("coordinator", "worker")),
    Rule("tabletopic.table_runtime", (*UPPER, "tabletopic.protocol", "tabletopic.spark", "tabletopic.registry"),
         why="the runtime reads its topic through a TopicView and is given its table engine: the broker and attach "
             "mode both run it"),
    Rule("tabletopic.attach", (*UPPER, "tabletopic.log", "tabletopic.groups", "tabletopic.topics",
                               "tabletopic.registry", "tabletopic.spark", "worker"),
         why="attach mode runs the table-topic runtime against another cluster: it never reaches into the broker's "
             "own server, logs, groups or topics, nor into Spark or the workers except through the runtime"),
    *(Rule(side, ("tabletopic.attach",), why="attach mode is a host of the runtime beside the broker, not below it")
      for side in ("configs", "worker", "coordinator", "tabletopic.broker", "tabletopic.plugin_host",
                   "tabletopic.server", "tabletopic.log", "tabletopic.table_runtime", "tabletopic.table_services")),
    Rule("tabletopic.protocol", ("tabletopic.server", "tabletopic.log", "tabletopic.broker"),
         why="the wire codec is pure"),
    Rule("tabletopic.log", ("tabletopic.server", "tabletopic.broker", "tabletopic.plugin_host"),
         why="the log is below the server"),
    Rule("tabletopic.registry", (*UPPER, "worker", "coordinator"),
         why="the schema registry is served by the broker, on its base modules; the broker wires it"),
    *(Rule(base, ("tabletopic.registry",), why="the schema registry sits above the broker's base modules")
      for base in ("worker", "coordinator", "tabletopic.log", "tabletopic.protocol", "tabletopic.groups",
                   "tabletopic.topics", "tabletopic.server")),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, list[str]]]:
    """(imported module, names) for every import outside ``if TYPE_CHECKING:`` blocks."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            yield base, [a.name for a in node.names]
        todo.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module → the project modules it imports (at any depth of its code)."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for target, names in _imports(tree, mod, path.name == "__init__.py"):
            if target.split(".")[0] not in packages:
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            if subs:
                edges.update(subs)
            if len(subs) < len(names) or not names:
                # the module itself (or its nearest existing parent package)
                t = target
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t:
                    edges.add(t)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def forbidden_edges(graph: Mapping[str, set[str]], rules: Iterable[Rule] = RULES) -> list[str]:
    bad = []
    for rule in rules:
        for mod, targets in sorted(graph.items()):
            if not _under(mod, rule.source):
                continue
            for t in sorted(targets):
                if any(_under(t, f) for f in rule.forbidden) and not any(_under(t, a) for a in rule.allowed):
                    bad.append(f"{mod} -> {t} ({rule.why})")
    return bad


# ------------------------------------------------------------------------------------------------ the real tree
def test_no_import_cycle_between_files() -> None:
    cycles = find_cycles(import_graph(ROOT))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_forbidden_import() -> None:
    bad = forbidden_edges(import_graph(ROOT))
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def importers_of(root: Path, prefix: str) -> set[str]:
    """Project modules importing ``prefix`` (e.g. a third-party module), function-local imports included."""
    out = set()
    for pkg in PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            mod = module_name(p, root)
            for target, names in _imports(ast.parse(p.read_text(), str(p)), mod, p.name == "__init__.py"):
                if any(_under(t, prefix) for t in (target, *(f"{target}.{n}" for n in names))):
                    out.add(mod)
    return out


MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (methods, nested functions) of the four packages longer than ``limit`` lines."""
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > limit:
                        out.append(f"{p.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_80_lines() -> None:
    assert not long_functions(ROOT), "split into named steps:\n" + "\n".join(long_functions(ROOT))


def test_length_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    _tree(tmp_path, {"worker/__init__.py": "", "worker/long.py": f"def f():\n{body}", "worker/ok.py": "def g():\n"
                     + body[: -len(f"    x{MAX_FUNCTION_LINES - 1} = {MAX_FUNCTION_LINES - 1}\n")]})
    assert long_functions(tmp_path) == [f"worker/long.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_only_the_codec_imports_kafka_protocol() -> None:
    # the codec, and the messages kafka-python lacks, defined with its classes (tabletopic/protocol/messages/)
    assert importers_of(ROOT, "kafka.protocol") <= {"tabletopic.protocol.codec", "tabletopic.protocol.messages"}


def spark_package_modules(root: Path) -> set[str]:
    """The modules of the Spark package, ``tabletopic/spark/``."""
    return {module_name(p, root) for p in (root / "tabletopic" / "spark").rglob("*.py")}


def test_only_the_spark_package_imports_pyspark() -> None:
    assert importers_of(ROOT, "pyspark") <= spark_package_modules(ROOT)


# ------------------------------------------------------------------------------------------------ the checker
def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


BASE = {
    "tabletopic/__init__.py": "",
    "tabletopic/broker.py": "from worker import convert\n",
    "tabletopic/durable.py": "",
    "worker/__init__.py": "",
    "worker/convert.py": "from tabletopic import durable\nfrom coordinator.contract import Message\n",
    "coordinator/__init__.py": "",
    "coordinator/contract.py": "class Message: ...\n",
    "configs/__init__.py": "",
}


def test_checker_accepts_a_clean_tree(tmp_path: Path) -> None:
    graph = import_graph(_tree(tmp_path, BASE))
    assert graph["worker.convert"] == {"tabletopic.durable", "coordinator.contract"}
    assert find_cycles(graph) == []
    assert forbidden_edges(graph) == []


def test_checker_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    files = dict(BASE)
    files["coordinator/contract.py"] = "def f():\n    from worker.convert import x\n    return x\n"
    cycles = find_cycles(import_graph(_tree(tmp_path, files)))
    assert cycles == [["coordinator.contract", "worker.convert"]]


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        ("worker/convert.py", "from tabletopic.broker import Broker\n", "worker.convert -> tabletopic.broker"),
        ("worker/convert.py", "from coordinator import committer\n", "worker.convert -> coordinator.committer"),
        ("configs/model.py", "import worker.convert\n", "configs.model -> worker.convert"),
        ("coordinator/contract.py", "def f():\n    from ..worker import convert\n", "coordinator.contract -> worker"),
        ("tabletopic/registry/api.py", "from tabletopic.broker import Broker\n",
         "tabletopic.registry.api -> tabletopic.broker"),
        ("worker/convert.py", "from tabletopic.registry import api\n", "worker.convert -> tabletopic.registry.api"),
    ],
)
def test_checker_finds_an_upward_or_sideways_import(tmp_path: Path, path: str, text: str, expected: str) -> None:
    files = dict(BASE, **{"coordinator/committer.py": "", "tabletopic/registry/__init__.py": "",
                          "tabletopic/registry/api.py": "", path: text})
    bad = forbidden_edges(import_graph(_tree(tmp_path, files)))
    assert any(b.startswith(expected) for b in bad), bad


def test_type_checking_imports_are_not_edges(tmp_path: Path) -> None:
    files = dict(BASE)
    files["worker/convert.py"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tabletopic.broker import Broker\n"
    )
    assert forbidden_edges(import_graph(_tree(tmp_path, files))) == []
