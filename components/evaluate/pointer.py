"""The promotion root's pointer (`current.json`) and serving declaration (`serving.json`) as every reader reads them
back: through components/common/documents.py, each field checked. No TensorFlow here: local-run, the launcher and
the serving side read the pointer too."""

from __future__ import annotations

from components.common import documents, storage

POINTER = "current.json"
SERVING_DECLARATION = "serving.json"

_VERSION = documents.Number("[1, 1000000000]", integer=True)
POINTER_SCHEMA = documents.Fields(
    {
        "version": _VERSION,
        "state": documents.Text(choices=("ready",)),
        "saved_model": documents.Location(),
        "warm_start": documents.Location(nullable=True),
        "checkpoint": documents.Text(nullable=True),
        "weights_sha256": documents.Text(max_length=64),
        "metrics": documents.Fields({"accuracy": documents.Number("[0, 1]")}, required=("accuracy",)),
        "label_names": documents.Items(documents.Text(), max_items=100_000),
        "synthetic_data": documents.Flag(nullable=True),
        "promoting": documents.Fields(
            {
                "version": _VERSION,
                "holder": documents.Text(max_length=512),
                "claimed_at": documents.Number("[0, inf)"),
                "checkpoint": documents.Text(nullable=True),
                "staging": documents.Text(max_length=128),
                "host": documents.Text(max_length=256, nullable=True),
                "pid": documents.Number("[1, 4194304]", integer=True, nullable=True),
            },
            required=("version", "claimed_at", "staging"),
        ),
    }
)
READY_FIELDS = ("version", "state", "saved_model", "metrics")
SERVING_SCHEMA = documents.Fields({"tensorflow_serving": documents.Text(max_length=32)}, closed=True)
DAMAGED = "the pointer is damaged: restore it (the version folders are untouched) or remove it to start the root again"


def parse_pointer(content: bytes, root: str) -> dict:
    """The pointer in `content`, checked: each field in its interval, its paths inside the root, a ready version
    whole, a claim above it. A damaged pointer is a DocumentError (exit 2), never a baseline or a warm start."""
    uri = storage.publisher_for(root).uri(POINTER)
    try:
        documents.check_size(content, uri, "promotion pointer")
        pointer = documents.parse(content, uri, POINTER_SCHEMA, "promotion pointer", root=root)
    except documents.DocumentError as error:
        raise documents.DocumentError(f"{error}; {DAMAGED}") from error
    given = [name for name in READY_FIELDS if name in pointer]
    if given and len(given) != len(READY_FIELDS):
        missing = next(name for name in READY_FIELDS if name not in pointer)
        raise documents.DocumentError(f"{uri}: not a valid promotion pointer: {missing}: missing; {DAMAGED}")
    claim = pointer.get("promoting")
    if claim is not None and "version" in pointer and claim["version"] <= pointer["version"]:
        raise documents.DocumentError(
            f"{uri}: not a valid promotion pointer: promoting.version: {claim['version']} is not above the ready "
            f"version {pointer['version']}; {DAMAGED}"
        )
    if not given and claim is None:
        raise documents.DocumentError(f"{uri}: not a valid promotion pointer: neither a version nor a claim; {DAMAGED}")
    return pointer


def ready_version(pointer: dict | None) -> dict | None:
    """The last ready version's record: the pointer's own fields, unless nothing is ready yet (or the pointer was
    left at "exporting" by a promotion of an older release, which did not keep the last ready one)."""
    if pointer is None or pointer.get("state") != "ready":
        return None
    return {key: value for key, value in pointer.items() if key != "promoting"}


def read_pointer(root: str) -> tuple[dict | None, str]:
    """The pointer as stored (None when nothing was promoted yet) and its version, for the compare-and-swap."""
    content, version = storage.publisher_for(root).read_document(POINTER)
    return (parse_pointer(content, root) if content is not None else None), version


def read_ready(root: str) -> dict | None:
    return ready_version(read_pointer(root)[0])
