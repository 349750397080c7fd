"""The code's layout, as a reader relies on it: imports inside the pipeline package run one way."""

from __future__ import annotations

import ast
import shutil
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


# The storage layer, floor by floor: a reader walks down from the top and never meets an import that runs up. A module
# outside the layer that a floor imports (values, secrets, access, pod) must not lead up either: what is checked is
# everything a floor reaches.
STORAGE_FLOORS = (
    ("filesystem",),  # locations, the storage errors, local files: bounded reads, atomic writes, temporaries
    ("documents",),  # parsing and schemas
    ("stores", "object_stores", "coordination", "kfp_launcher"),  # a folder, gs:// and s3://, the Kubernetes API
    ("storage",),  # any location: its publisher, its bounded reads, a document at it
    ("writer_claim", "model_directory"),  # claims and publishing
)


def common_graph(folder: Path) -> dict[str, set[str]]:
    """components.common's modules and the modules of it each imports, anywhere in the file."""
    prefix = "components.common."
    modules = {path.stem for path in folder.glob("*.py")}
    return {
        path.stem: {name.removeprefix(prefix) for name in imports_of(path, "components.common")} & modules - {path.stem}
        for path in folder.glob("*.py")
    }


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def upward_imports(folder: Path) -> list[str]:
    """Each storage floor's module that reaches a module of a higher floor, as "module -> module"."""
    graph = common_graph(folder)
    floor_of = {module: number for number, floor in enumerate(STORAGE_FLOORS) for module in floor}
    return [
        f"{module} -> {target}"
        for module, floor in floor_of.items()
        for target in sorted(reached(graph, module))
        if floor_of.get(target, -1) > floor
    ]


def test_components_common_imports_form_no_circle():
    assert cycles(common_graph(REPOSITORY / "components" / "common")) == []


def test_the_storage_layer_is_walked_down_floor_by_floor():
    folder = REPOSITORY / "components" / "common"
    assert upward_imports(folder) == []
    assert common_graph(folder)["filesystem"] <= {"values"}  # the ground floor stands on nothing of the project
    assert {module for floor in STORAGE_FLOORS for module in floor} <= set(common_graph(folder))


def test_an_import_running_up_is_found_even_inside_a_function(tmp_path):
    folder = tmp_path / "common"
    ignored = shutil.ignore_patterns("__pycache__", "kernels")
    shutil.copytree(REPOSITORY / "components" / "common", folder, ignore=ignored)
    secrets = folder / "secrets.py"  # not of the layer, but the stores import it
    secrets.write_text(secrets.read_text() + "\n\ndef later():\n    from components.common.storage import read_bytes\n")
    found = upward_imports(folder)
    assert "object_stores -> storage" in found
    assert not [line for line in found if line.startswith("storage ->")]
    assert cycles(common_graph(folder))
