"""No import cycle inside ``node_agent``: its modules' own imports form a graph without loops."""

from __future__ import annotations

import ast
from pathlib import Path

import node_agent

ROOT = Path(node_agent.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (``from x import y``
    counts ``x.y`` when that is a module, else ``x``)."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t if t in modules else node.module for t in targets]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``graph``, if it has any (a depth-first search)."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            if (loop := visit(target, [*path, module])) is not None:
                return loop
        done.add(module)
        return None

    return next((loop for m in sorted(graph) if (loop := visit(m, [])) is not None), None)


def test_node_agent_has_no_import_cycle() -> None:
    assert _cycle(_graph()) is None


def test_the_cycle_check_finds_a_loop() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
