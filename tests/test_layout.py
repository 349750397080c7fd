"""The code's layout, as a reader relies on it: imports inside the pipeline package run one way."""

from __future__ import annotations

import ast
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def imports_of(path: Path, package: str) -> set[str]:
    """The modules of `package` that a file imports anywhere (at its top or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(package + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(package + ".")}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the path that closes it."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_pipeline_packages_imports_form_no_circle():
    modules = {f"pipeline.{path.stem}": path for path in (REPOSITORY / "pipeline").glob("*.py")}
    graph = {name: imports_of(path, "pipeline") & set(modules) for name, path in modules.items()}
    assert cycles(graph) == []
    # the command line stands apart: no pipeline definition imports it
    assert not [name for name, targets in graph.items() if "pipeline.pipeline" in targets]


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
