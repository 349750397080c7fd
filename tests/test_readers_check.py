"""`make lint`'s check that reads and writes go through their owners: clean on this repository, and failing, naming
the file and line, when a read, a write or an HTTP call is added outside the owners without a reason."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
CHECK = REPOSITORY / "tools" / "check_readers.py"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def scratch_copy(tmp_path_factory) -> Path:
    """The shipped code's Python files, copied."""
    root = tmp_path_factory.mktemp("copy")
    for folder in ("components", "pipeline", "images"):
        shutil.copytree(REPOSITORY / folder, root / folder, ignore=shutil.ignore_patterns("*.json", "*.pyc", "*.whl"))
    return root


def test_this_repository_reads_and_writes_only_through_its_owners():
    result = check(REPOSITORY)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("settings = json.loads(open(path).read())", "open()"),
        ("settings = yaml.safe_load(Path(path).read_text())", ".read_text()"),
        ("Path(path).write_bytes(b'x')", ".write_bytes()"),
        ("answer = requests.get(url, timeout=5).json()", "requests.get()"),
        ("body = urllib.request.urlopen(url).read()", "urllib.request.urlopen()"),
        ("handle = os.open(path, os.O_RDONLY)", "os.open()"),
        ("data = np.load(path)", "np.load()"),
        ("settings = json.loads(text)  # reader: ok", "json.loads()"),  # a reason of fewer than three words
        ("settings = json.loads(text)  # reader: ok ok ok", "json.loads()"),  # three words, none a reason
        ("handle = io.open(path)", "io.open()"),
        ("handle = Path(path).open()", ".open()"),
        ("handle = codecs.open(path)", "codecs.open()"),
        ("archive = tarfile.open(path)", "tarfile.open()"),
        ("handle = gzip.open(path)", "gzip.open()"),
        ("shutil.copyfile(path, url)", "shutil.copyfile()"),
        ("image = Image.open(path)", "Image.open()"),
        ("data = tf.io.read_file(path)", "tf.io.read_file()"),
        ("settings = j.loads(text)", "j.loads()"),  # import json as j
        ("settings = loads(text)", "loads()"),  # from json import loads
    ],
)
def test_a_read_added_outside_the_owners_fails_naming_its_file_and_line(scratch_copy, code, what):
    added = scratch_copy / "components" / "predict" / "added.py"
    imports = (
        "import codecs, gzip, io, json, os, shutil, tarfile, urllib.request, requests, yaml\nimport numpy as np\n"
        "import json as j\nimport tensorflow as tf\nfrom json import loads\nfrom pathlib import Path\n"
        "from PIL import Image\n"
    )
    added.write_text(f"{imports}\n\ndef read(path, url, text):\n    {code}\n")
    try:
        result = check(scratch_copy)
    finally:
        added.unlink()
    assert result.returncode == 1
    assert f"components/predict/added.py:11: {what} outside the owners" in result.stdout, result.stdout
    assert "go through one, or give the reason" in result.stderr


def test_a_read_with_its_reason_or_through_an_owner_passes(scratch_copy):
    added = scratch_copy / "pipeline" / "added.py"
    added.write_text(
        "from components.common import documents, storage\nfrom pathlib import Path\n\n\n"
        "def read(path):\n"
        "    # reader: the kernel's own file, a few bytes\n"
        "    first = Path('/proc/self/stat').read_text()\n"
        "    return first, documents.load(filesystem.read_regular_file(path, 1024), path, 'settings')\n"
    )
    try:
        result = check(scratch_copy)
    finally:
        added.unlink()
    assert result.returncode == 0, result.stdout
