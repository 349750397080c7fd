"""The promotion root's pointer (`current.json`) and serving declaration (`serving.json`) as every reader reads them
back: through components/common/documents.py, each field checked. No TensorFlow here: local-run, the launcher and
the serving side read the pointer too.

The pointer names what it points at relative to its root (`"saved_model": "3"`, `"warm_start":
"3/checkpoint/ckpt-500"`), so a root that is moved or copied (`mv`, a backup restored elsewhere, a volume mounted at
another path, a bucket prefix copied) still reads, promotes and warm-starts; readers get them as locations under the
root they read. A pointer of an earlier release names absolute locations: those inside the root are taken as they
are, and those of the root's old place are mapped to its new one when the version folder is there (else refused in
one line that says how to make it whole)."""

from __future__ import annotations

from components.common import documents, filesystem, storage

POINTER = "current.json"
SERVING_DECLARATION = "serving.json"

_VERSION = documents.Number("[1, 1000000000]", integer=True)
POINTER_SCHEMA = documents.Fields(
    {
        "version": _VERSION,
        "state": documents.Text(choices=("ready",)),
        "saved_model": documents.Text(),
        "warm_start": documents.Text(nullable=True),
        "checkpoint": documents.Text(nullable=True),
        "weights_sha256": documents.Text(max_length=64),
        "metrics": documents.Fields({"accuracy": documents.Number("[0, 1]")}, required=("accuracy",)),
        "label_names": documents.Items(documents.Text(), max_items=100_000),
        "num_classes": documents.Number("[1, 100000]", integer=True),
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
                "renewals": documents.Number("[0, inf)", integer=True),  # the claim's renewals while it stages
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
    names, count = pointer.get("label_names"), pointer.get("num_classes")
    if names is not None and count is not None and len(names) != count:
        raise documents.DocumentError(
            f"{uri}: not a valid promotion pointer: label_names: {len(names)} names, but num_classes is {count}; "
            f"{DAMAGED}"
        )
    if not given and claim is None:
        raise documents.DocumentError(f"{uri}: not a valid promotion pointer: neither a version nor a claim; {DAMAGED}")
    return located(pointer, root, uri)


LOCATIONS = ("saved_model", "warm_start")  # what the pointer names inside its root


def located(pointer: dict, root: str, uri: str) -> dict:
    """The pointer with its locations as URIs under `root` (see the module's description)."""
    found = dict(pointer)
    for name in LOCATIONS:
        value = pointer.get(name)
        if value:
            found[name] = _location(value, name, pointer, root, uri)
    return found


def stored(pointer: dict, root: str) -> dict:
    """The pointer as it is written: its locations relative to `root`."""
    written = dict(pointer)
    base = filesystem.normalize_uri(root).rstrip("/") + "/"
    for name in LOCATIONS:
        value = pointer.get(name)
        if value and filesystem.normalize_uri(value).startswith(base):
            written[name] = filesystem.normalize_uri(value)[len(base) :]
    return written


def _relative_inside(value: str) -> bool:
    parts = value.split("/")
    return "://" not in value and not value.startswith("/") and ".." not in parts and value.strip() != ""


def _location(value: str, name: str, pointer: dict, root: str, uri: str) -> str:
    if _relative_inside(value):
        return filesystem.join(root, value)
    if documents.confined(value, root):
        return value
    version = pointer.get("version")
    # an earlier release's absolute location, of the root's old place: the same version's folder in this root
    parts = filesystem.normalize_uri(value).rstrip("/").split("/")
    tail = {"saved_model": 1, "warm_start": 3}[name]  # N, or N/checkpoint/<name>
    earlier = version is not None and len(parts) > tail and parts[-tail] == str(version)
    if earlier and (name == "saved_model" or parts[-2] == "checkpoint"):
        moved = filesystem.join(root, "/".join(parts[-tail:]))
        if _exists(moved, name):
            return moved
        folder = "/".join(parts[: len(parts) - tail + 1])
        raise documents.DocumentError(
            f"{uri}: not a valid promotion pointer for this root: {name} {value} is outside this root ({root}) and "
            f"version {version}'s folder is not in it: the root was moved or copied without that version's folder; "
            f"copy {folder} to {filesystem.join(root, str(version))} (or point KServe and the pipeline at the root's "
            "old place)"
        )
    raise documents.DocumentError(
        f"{uri}: not a valid promotion pointer: {name}: {value} is not inside {root}; {DAMAGED}"
    )


def _exists(location: str, name: str) -> bool:
    """Whether a version folder (saved_model) or a checkpoint (warm_start) is at `location`."""
    marker = "saved_model.pb" if name == "saved_model" else None
    if marker is None:
        parent, prefix = filesystem.parent_and_name(location)
        target = f"{prefix}.index"
    else:
        parent, target = location, marker
    try:
        return storage.publisher_for(parent).checksum(target) is not None
    except (OSError, filesystem.StorageError):
        return False


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
