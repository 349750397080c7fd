"""Which TensorFlow Serving releases can load an exported SavedModel: its graph's ops and their attributes checked
against the op definitions of a release, generated from that release's own package (`generate.py`, kept beside
this module with the files it wrote: `tensorflow-<version>.json`).

A server of an older release fails to load a graph that uses an op it does not register ("Op type not registered
'DisableCopyOnRead'") or gives a registered op an attribute it does not know ("NodeDef mentions attr 'debug_name'
not in Op"). Attributes whose names start with "_" are the runtime's own and are ignored, as TensorFlow does.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from components.common import filesystem

MAX_SAVED_MODEL_BYTES = 2 << 30  # protobuf's own limit on a message


class UnknownServingVersionError(ValueError):
    """No op definitions were generated for the requested TensorFlow Serving release."""


def known_versions() -> list[str]:
    """The releases whose op definitions ship with the project, oldest first."""
    names = [path.name for path in resources.files(__name__).iterdir() if path.name.startswith("tensorflow-")]
    versions = [name.removeprefix("tensorflow-").removesuffix(".json") for name in names]
    return sorted(versions, key=lambda version: tuple(int(part) for part in version.split(".")))


@functools.cache
def op_definitions(version: str) -> dict[str, frozenset[str]]:
    """{op name: its attribute names} of TensorFlow `version`."""
    path = resources.files(__name__).joinpath(f"tensorflow-{version}.json")
    if not path.is_file():
        raise UnknownServingVersionError(
            f"serving_version: no op definitions of TensorFlow {version} ship with this project (known: "
            f"{', '.join(known_versions())}); generate them with `make serving-ops VERSION={version}`"
        )
    content = path.read_text()  # reader: a JSON list shipped in this package, kilobytes
    return {name: frozenset(attributes) for name, attributes in json.loads(content)["ops"].items()}  # reader: that file


@dataclass(frozen=True)
class Incompatibility:
    op: str
    attribute: str | None  # None: the op itself is unknown
    node: str  # a node that uses it, for the message

    def describe(self, version: str) -> str:
        if self.attribute is None:
            return f"op {self.op} (node {self.node}) is not registered in TensorFlow {version}"
        return f"op {self.op} has no attribute {self.attribute!r} in TensorFlow {version} (node {self.node})"


def graph_nodes(saved_model_dir: str | Path):
    """Every node of the SavedModel's graphs and of their functions, and the functions' own names."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel.FromString(
        filesystem.read_regular_file(Path(saved_model_dir, "saved_model.pb"), MAX_SAVED_MODEL_BYTES)
    )
    nodes, functions = [], set()
    for meta_graph in saved_model.meta_graphs:
        nodes += list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            functions.add(function.signature.name)
            nodes += list(function.node_def)
    return nodes, functions


def incompatibilities(saved_model_dir: str | Path, version: str) -> list[Incompatibility]:
    """What in the exported graph TensorFlow `version` does not know: each unknown op, and each unknown attribute of
    a known op, once."""
    definitions = op_definitions(version)
    nodes, functions = graph_nodes(saved_model_dir)
    found: dict[tuple[str, str | None], Incompatibility] = {}
    for node in nodes:
        if node.op in functions:
            continue  # a call of a function the graph defines
        if node.op not in definitions:
            found.setdefault((node.op, None), Incompatibility(node.op, None, node.name))
            continue
        for attribute in node.attr:
            if not attribute.startswith("_") and attribute not in definitions[node.op]:
                found.setdefault((node.op, attribute), Incompatibility(node.op, attribute, node.name))
    return sorted(found.values(), key=lambda item: (item.op, item.attribute or ""))


def loadable_in(saved_model_dir: str | Path) -> dict[str, list[str]]:
    """For every release with op definitions: what stops it loading the SavedModel (empty: it loads)."""
    return {
        version: [item.describe(version) for item in incompatibilities(saved_model_dir, version)]
        for version in known_versions()
    }
