"""What a TensorFlow error says, without its wrapping: the graph's and op's names, the stack-trace notice and the
node lines, which name nothing a person gave."""

from __future__ import annotations

import re

_WRAPPING = (re.compile(r"\{\{function_node [^}]*\}\}\s*"), re.compile(r"\s*\[Op:[^\]]*\]( name:\s*\S*)?\s*$"))
_NOT_SAID = ("Graph execution error:", "Detected at node", "<stack traces unavailable>", "[[")


def what_tensorflow_said(message: str, otherwise: str = "TensorFlow refused it") -> str:
    """The last line of `message` that says something ("Invalid GIF data (size 6), ..."), or `otherwise`."""
    said = []
    for line in message.splitlines():
        line = line.strip()
        if not line or line.startswith(_NOT_SAID):
            continue
        for pattern in _WRAPPING:
            line = pattern.sub("", line).strip()
        if line:
            said.append(line)
    return said[-1] if said else otherwise
