"""The static check of `make lint` that every read and write of a file, a document or an HTTP answer goes through
its owner, where the bounds, the checks and the one-line errors are.

The owners (OWNERS below) may call the readers and writers of QUALIFIED (`open`, `io.open`, `codecs.open`,
`os.open`, `json.load(s)`, `yaml.*load`, `pickle.load(s)`, `numpy.load`, `tarfile.open`, `gzip.open`,
`shutil.copyfile`, `PIL.Image.open`, `tf.io.read_file`, `tf.io.gfile.GFile`, `urlopen`, `requests`, ...) and a Path's
`read_text/read_bytes/write_text/write_bytes`; any other module of the shipped code (components/, pipeline/, images/)
that does is reported, whatever it imported them as (`import json as j`, `from json import loads`), unless the call
carries a reason on its line or the line above that says what bounds it: `# reader: <why this read needs no owner>`
(or `# writer: ...`), e.g. a file shipped in the package, the kernel's /proc, a child process's answer. Exit 1 and
one line per call (path:line: what) when any is found; `python tools/check_readers.py [ROOT]`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SCANNED = ("components", "pipeline", "images")
OWNERS = {
    "components/common/documents.py",  # every document: size, depth, values
    "components/common/filesystem.py",  # every local file: regular files, bounded reads, atomic writes
    "components/common/stores.py",  # a local folder as a store
    "components/common/storage.py",  # every location: bounded reads of objects, documents at a location
    "components/common/object_stores.py",  # storage's S3 side
    "components/common/outputs.py",  # every file written for a user
    "components/common/secrets.py",  # token files
    "components/common/replies.py",  # every HTTP answer
    "components/prepare_data/safe_io.py",  # images and archives of a user's
}
OWNER_MODULES = {Path(owner).stem for owner in OWNERS}
FILE_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}  # on any object: a Path's; and its open()
# Readers and writers by their qualified names, whatever a module imports them as (`import json as j`, `from json
# import loads`, `from PIL import Image`): the standard library's and the project's libraries'.
QUALIFIED = {
    "builtins.open", "io.open", "io.FileIO", "codecs.open", "os.open", "os.fdopen", "os.read",
    "json.load", "json.loads", "pickle.load", "pickle.loads", "marshal.load", "marshal.loads", "shelve.open",
    "yaml.load", "yaml.safe_load", "yaml.load_all", "yaml.safe_load_all", "yaml.unsafe_load", "yaml.full_load",
    "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt", "numpy.memmap",
    "tarfile.open", "tarfile.TarFile", "zipfile.ZipFile", "gzip.open", "gzip.GzipFile", "bz2.open", "bz2.BZ2File",
    "lzma.open", "lzma.LZMAFile", "shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.copyfileobj",
    "shutil.copytree", "PIL.Image.open", "csv.reader",
    "tensorflow.io.read_file", "tensorflow.io.write_file", "tensorflow.io.gfile.GFile",
    "tensorflow.io.gfile.Open", "tensorflow.io.gfile.copy", "tensorflow.gfile.GFile",
    "urllib.request.urlopen", "http.client.HTTPConnection", "http.client.HTTPSConnection",
    *(f"requests.{verb}" for verb in ("get", "post", "put", "patch", "delete", "head", "request", "Session")),
}  # fmt: skip
REASONS = ("# reader:", "# writer:")
MIN_REASON_WORDS = 3  # distinct words of three letters or more, none of them filler
FILLER = {"ok", "okay", "fine", "safe", "yes", "todo", "fixme", "none", "n/a", "trusted", "whatever", "reason", "read",
          "reader", "write", "writer", "file", "this", "that", "the", "and", "here"}  # fmt: skip


def imported_names(tree: ast.Module) -> dict[str, str]:
    """What each name a module binds by import stands for: `j` -> `json`, `loads` -> `json.loads`,
    `Image` -> `PIL.Image`, `tf` -> `tensorflow`, `np` -> `numpy`."""
    names: dict[str, str] = {"open": "builtins.open"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                names[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def qualified(call: ast.Call, names: dict[str, str]) -> str | None:
    """The call's function as a qualified name, its first part resolved through the module's imports."""
    dotted = _dotted(call.func)
    if dotted is None:
        return None
    first, _, rest = dotted.partition(".")
    resolved = names.get(first)
    if resolved is None:
        return None
    return f"{resolved}.{rest}" if rest else resolved


def flagged(call: ast.Call, names: dict[str, str]) -> str | None:
    """What `call` does that needs an owner, or None."""
    name = qualified(call, names)
    if name is not None:
        module = name.split(".")[-2] if "." in name else ""
        if name.startswith("components.") and module in OWNER_MODULES:
            return None  # storage.read_bytes(...), storage.document_bytes(...): the owners' own functions
        if name in QUALIFIED:
            return f"{_dotted(call.func)}()"
    function = call.func
    if isinstance(function, ast.Attribute) and function.attr in FILE_METHODS:
        return f".{function.attr}()"
    if isinstance(function, ast.Attribute) and function.attr == "open" and name is None:
        return ".open()"  # a Path's (or any file-like object's) open: not a module's function, which QUALIFIED names
    return None


def _reasoned(lines: list[str], first: int, last: int) -> bool:
    """Whether a `# reader:`/`# writer:` reason is on the call's lines or the line above: words that say what
    bounds the read (three distinct words of three letters or more that are not filler), not "ok ok ok"."""
    for number in range(max(first - 1, 1), last + 1):
        text = lines[number - 1]
        for marker in REASONS:
            if marker not in text:
                continue
            words = {word.strip(".,;:()'\"").lower() for word in text.split(marker, 1)[1].split()}
            if len({word for word in words if len(word) >= 3 and word not in FILLER}) >= MIN_REASON_WORDS:
                return True
    return False


def findings(root: Path) -> list[str]:
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in OWNERS:
                continue
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            tree = ast.parse(source, filename=relative)
            names = imported_names(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    what = flagged(node, names)
                    if what and not _reasoned(lines, node.lineno, node.end_lineno or node.lineno):
                        found.append(f"{relative}:{node.lineno}: {what} outside the owners")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    found = findings(root)
    for line in found:
        print(line)
    if found:
        owners = ", ".join(sorted(OWNERS))
        print(
            f"{len(found)} reads or writes outside their owners ({owners}): go through one, or give the reason "
            "on the line: '# reader: ...' / '# writer: ...'",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
