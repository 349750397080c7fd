"""Generate the op definitions of a TensorFlow release from that release's own package:

    python -m components.evaluate.serving_ops.generate 2.6.2      (make serving-ops VERSION=2.6.2)

downloads the `tensorflow-cpu` wheel of that release (pip, for whichever Python it was built for), takes its shared
libraries out, asks them for every registered op (TensorFlow's C API, `TF_GetAllOpList`, in a separate process:
the release's libraries, not the installed TensorFlow's), and writes `tensorflow-<version>.json` beside this file:
each op's name and attributes, what a SavedModel's graph is checked against before it is promoted for a TF Serving
of that version. Needs the package registry; nothing of the release is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
PYTHONS = ("3.11", "3.10", "3.9", "3.8", "3.7")
PLATFORMS = ("manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64")
# The libraries that register ops and export the C API, in the order they must be loaded.
LIBRARIES = (
    "tensorflow/libtensorflow_framework.so.2",
    "tensorflow/libtensorflow_cc.so.2",
    "tensorflow/python/_pywrap_tensorflow_internal.so",
)
LOADER = """
import ctypes, os, sys
folder, output, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in names:  # in order, until one exports the C API (older: the Python wrapper; newer: libtensorflow_cc)
    library = ctypes.CDLL(os.path.join(folder, name), mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)
    if hasattr(library, "TF_GetAllOpList"):
        break
class Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t), ("deallocator", ctypes.c_void_p)]
get_all = library.TF_GetAllOpList
get_all.restype = ctypes.POINTER(Buffer)
buffer = get_all().contents
open(output, "wb").write(ctypes.string_at(buffer.data, buffer.length))
"""


def download_wheel(version: str, folder: Path) -> Path:
    for python in PYTHONS:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, "-d", str(folder), f"tensorflow-cpu=={version}"]  # fmt: skip
        for platform in PLATFORMS:
            command += ["--platform", platform]
        if subprocess.run(command, capture_output=True, text=True).returncode == 0:
            (wheel,) = folder.glob("tensorflow_cpu-*.whl")
            return wheel
    raise SystemExit(f"no tensorflow-cpu=={version} wheel for Python {', '.join(PYTHONS)} on manylinux x86_64")


def op_list_bytes(wheel: Path, folder: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:  # reader: the TensorFlow Serving wheel pip fetched, by its index
        present = [name for name in LIBRARIES if name in archive.namelist()]
        for name in present:
            archive.extract(name, folder)
    output = folder / "ops.pb"
    subprocess.run([sys.executable, "-c", LOADER, str(folder), str(output), *present], check=True)
    return output.read_bytes()  # reader: what the loader subprocess just wrote


def _name(op) -> str:
    return op.name


def definitions(version: str) -> dict:
    from tensorflow.core.framework import op_def_pb2

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        wheel = download_wheel(version, folder)
        ops = op_def_pb2.OpList.FromString(op_list_bytes(wheel, folder))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()  # reader: the wheel pip just downloaded
    return {
        "tensorflow": version,
        "source": {"wheel": wheel.name, "sha256": digest},
        "ops": {
            op.name: sorted(attribute.name for attribute in op.attr) for op in sorted(ops.op, key=lambda o: o.name)
        },
    }


def to_text(result: dict) -> str:
    """JSON with one op a line, so that a regenerated file's diff shows which ops and attributes changed."""
    head = {key: value for key, value in result.items() if key != "ops"}
    lines = [f"{json.dumps(name)}: {json.dumps(attributes)}" for name, attributes in result["ops"].items()]
    return json.dumps(head, sort_keys=True)[:-1] + ', "ops": {\n' + ",\n".join(lines) + "\n}}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.evaluate.serving_ops.generate", description=__doc__)
    parser.add_argument("versions", nargs="+", help="TensorFlow releases, e.g. 2.6.2 2.21.0")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    for version in arguments.versions:
        result = definitions(version)
        path = HERE / f"tensorflow-{version}.json"
        path.write_text(to_text(result))  # writer: a development tool's own package file
        logger.info("%s: %d ops from %s", path, len(result["ops"]), result["source"]["wheel"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
