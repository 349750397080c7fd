"""The static check of `make lint` that every read and write of a file, a document or an HTTP answer goes through
its owner, where the bounds, the checks and the one-line errors are.

The owners (OWNERS below) may call `open`, `os.open`, `Path.read_text/read_bytes/write_text/write_bytes`,
`json.load(s)`, `yaml.*load`, `pickle.load(s)`, `numpy.load`, `gfile.GFile`, `urlopen` and `requests`; any other
module of the shipped code (components/, pipeline/, images/) that does is reported, unless the call carries a reason
on its line or the line above: `# reader: <why this read needs no owner>` (or `# writer: ...`), e.g. a file shipped
in the package, the kernel's /proc, a child process's answer. Exit 1 and one line per call (path:line: what) when
any is found; `python tools/check_readers.py [ROOT]`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SCANNED = ("components", "pipeline", "images")
OWNERS = {
    "components/common/documents.py",  # every document: size, depth, values
    "components/common/storage.py",  # every file and object: regular files, bounded reads, atomic writes
    "components/common/object_stores.py",  # storage's S3 side
    "components/common/outputs.py",  # every file written for a user
    "components/common/secrets.py",  # token files
    "components/common/replies.py",  # every HTTP answer
    "components/prepare_data/safe_io.py",  # images and archives of a user's
}
OWNER_MODULES = {Path(owner).stem for owner in OWNERS}
FILE_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}
MODULE_CALLS = {
    "json": {"load", "loads"},
    "yaml": {"load", "safe_load", "load_all", "safe_load_all", "unsafe_load", "full_load"},
    "pickle": {"load", "loads"},
    "np": {"load", "fromfile"},
    "numpy": {"load", "fromfile"},
    "os": {"open", "fdopen"},
    "gfile": {"GFile", "Open"},
    "requests": {"get", "post", "put", "patch", "delete", "head", "request", "Session"},
}
REASONS = ("# reader:", "# writer:")
MIN_REASON_WORDS = 3


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def flagged(call: ast.Call) -> str | None:
    """What `call` does that needs an owner, or None."""
    function = call.func
    if isinstance(function, ast.Name):
        if function.id == "open":
            return "open()"
        if function.id == "urlopen":
            return "urlopen()"
        return None
    if not isinstance(function, ast.Attribute):
        return None
    receiver = _dotted(function.value) or ""
    module = receiver.rsplit(".", 1)[-1]
    if module in OWNER_MODULES:
        return None  # storage.read_bytes(...), documents.read_bytes(...): the owners' own functions
    if function.attr == "urlopen":
        return "urlopen()"
    if function.attr in FILE_METHODS:
        return f".{function.attr}()"
    if function.attr in MODULE_CALLS.get(module, ()):
        return f"{module}.{function.attr}()"
    return None


def _reasoned(lines: list[str], first: int, last: int) -> bool:
    """Whether a `# reader:`/`# writer:` reason of a few words is on the call's lines or the line above."""
    for number in range(max(first - 1, 1), last + 1):
        text = lines[number - 1]
        for marker in REASONS:
            if marker in text and len(text.split(marker, 1)[1].split()) >= MIN_REASON_WORDS:
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
            for node in ast.walk(ast.parse(source, filename=relative)):
                if isinstance(node, ast.Call):
                    what = flagged(node)
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
