"""The docs are tests: every command block of README.md and docs/*.md that a user is meant to run is run here, as
written, in a scratch copy of the repository, page after page as a new user would; what a page shows a command
printing is checked against what it printed (the lines that matter: times, numbers and run names aside).

What cannot run here runs against the stand-ins, or small, by rules every page shares (and says so in its failure):
- the KFP endpoint of the examples (https://kubeflow.example.com/pipeline, $KFP_HOST) is the strict stand-in
  (tests/fake_kfp_api.py) playing a multi-user Kubeflow, `<your profile namespace>` and `<ns>` its profile `team-a`,
  and the token files the pages make (`kubectl ... create token`) hold a token it accepts;
- the official archive (its URL, or a downloaded copy) is a small archive in the official format, and a folder of
  your own images (~/my-images, new-images/, cat.png) a few images made here;
- "hours" become seconds: EPOCHS=N is one epoch, TRIALS=N one trial, and a local-run or sweep without a length
  trains TRAIN_STEPS=3 (the quickstart's demo runs as written: its output is on the page);
- commands that need a Kubernetes cluster (kubectl, curl to a cluster's service) or set up a machine (apt-get, a
  container engine's daemon) are not run: tests/test_manifests.py validates what the cluster would be given;
- commands that need a container engine (make images, push, test-images, RUNNER=docker) run, and where no engine
  answers (as in CI) must refuse in one line saying so;
- `make install` and `make test` are CI's own: .ci/run must run them;
- `make local-run RESUME=last` follows a run stopped with Ctrl-C; a server (make tensorboard) is started, asked for
  its page and stopped; a command ending in `&` runs in the background until its block is done.

A page's block may say more in a comment before it: `<!-- docs-test: replace A => B -->` (a substitution),
`<!-- docs-test: skip: why -->`, and `<!-- docs-test: output -->` before a block that shows the previous block's output.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/prepare_data.md", "docs/train.md", "docs/evaluate.md", "docs/predict.md",
         "docs/serving.md", "docs/sweep.md", "docs/cluster.md", "docs/containers.md", "docs/development.md",
         "docs/faults.md", "docs/benchmarks.md"]  # fmt: skip
OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
KUBEFLOW = "https://kubeflow.example.com/pipeline"
NAMESPACE = "team-a"
TOKEN = "docs-test-token"
COMMAND_SECONDS = 600
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("docs")]


# -- the pages' blocks ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Block:
    page: str
    line: int  # of the first line inside the fence
    language: str
    text: str
    directives: list[str]

    def commands(self) -> list[tuple[int, str]]:
        """(line number, command) for each command: continuation lines joined, comments and blank lines left out."""
        found, pending, start = [], "", 0
        for offset, raw in enumerate(self.text.splitlines()):
            if not pending:
                start = self.line + offset
            pending += raw
            if raw.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            command = _without_comment(pending).strip()
            if command:
                found.append((start, command))
            pending = ""
        return found


def _without_comment(line: str) -> str:
    """The line without a trailing shell comment (a # outside quotes, after a space)."""
    quote = None
    for index, character in enumerate(line):
        if character in "'\"" and quote in (None, character):
            quote = None if quote else character
        elif character == "#" and quote is None and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def blocks_of(page: str, text: str) -> list[Block]:
    found, directives, lines = [], [], text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = re.fullmatch(r"<!-- docs-test: (.*) -->", line.strip())
        if marker:
            directives.append(marker.group(1))
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if fence:
            indent, language = fence.group(1), fence.group(2)
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            body = "\n".join(text_line[len(indent) :] for text_line in lines[index + 1 : end])
            found.append(Block(page, index + 2, language, body, directives))
            directives, index = [], end
        elif line.strip() and not marker:
            directives = [] if not line.startswith("<!--") else directives
        index += 1
    return found


# -- the rules every page shares ----------------------------------------------------------------------------------


NOT_RUN = [  # (what a command starts with or holds, why it is not run here)
    (r"^kubectl |\| kubectl ", "needs a Kubernetes cluster (tests/test_manifests.py validates what it applies)"),
    (r"^curl .*svc\.cluster\.local", "asks a service inside a cluster"),
    (r"^(apt-get|dockerd|podman system service|export CONTAINERS_CONF|export BUILDAH_ISOLATION)",
     "sets up a machine's container engine (make test-images runs the images)"),
    (r"^NS=", "a shell variable of the cluster commands around it"),
    (r"^make test-images\b", "builds the images and runs the pipeline in them: its own target, not make test's"),
]  # fmt: skip
NEEDS_ENGINE = re.compile(r"^(make (images|push|test-images)\b|make local-run .*RUNNER=docker|DOCKER_HOST=)")
ENGINE_REFUSALS = ("needs a running Docker engine", "no container engine", "Docker or podman", "neither")


@dataclasses.dataclass
class Scratch:
    root: Path
    environment: dict[str, str]
    kfp_url: str
    archive: Path
    port: int  # the port the examples' own stand-in listens on (8888 on the page)
    background: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def adapted(self, command: str, block: Block) -> str:
        """The command as it runs here (the rules of the module's description, then the block's own)."""
        command = command.replace(KUBEFLOW, self.kfp_url).replace("<your profile namespace>", NAMESPACE)
        command = command.replace("<ns>", NAMESPACE).replace(OFFICIAL_URL, str(self.archive))
        command = re.sub(r"\b8888\b", str(self.port), command)
        for directive in block.directives:
            if directive.startswith("replace "):
                old, new = directive.removeprefix("replace ").split(" => ", 1)
                command = command.replace(old, new)
        if re.match(r"^make (local-run|sweep)\b", command) and not is_quickstart(block, command):
            command = re.sub(r"\bEPOCHS=\d+(\.\d+)?", "EPOCHS=1", command)
            command = re.sub(r"\bTRIALS=\d+", "TRIALS=1", command)
            words = shlex.split(command)
            if not any(word.startswith(("EPOCHS=", "TRAIN_STEPS=", "RESUME=")) for word in words):
                command += " TRAIN_STEPS=3"
        return command


def is_quickstart(block: Block, command: str) -> bool:
    return block.page == "README.md" and command == "make local-run"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the repository (what git tracks) with the environment make install made, a home of its own, and
    the KFP stand-in the cluster pages' commands talk to."""
    from tests.builders import official_data, write_python_archive
    from tests.fake_kfp_api import FakeKfpApi

    root = tmp_path_factory.mktemp("docs") / "cifar10-pipeline"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPOSITORY, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():
        if (REPOSITORY / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPOSITORY / name, root / name)
    (root / ".venv").symlink_to(sys.prefix)
    home = root.parent / "home"
    (home / "Downloads").mkdir(parents=True)
    archive = write_python_archive(home / "Downloads" / "cifar-10-python.tar.gz", official_data(per_batch=20))
    (home / ".kfp-token").write_text(TOKEN)
    _images(home / "my-images", sizes=(40, 28))
    _images(root / "new-images" / "cat", sizes=(32,))
    _png(root / "cat.png", 32)
    environment = {
        **{name: value for name, value in os.environ.items()
           if not name.startswith(("KFP_", "KF_", "CIFAR10_", "MAKE", "MFLAGS"))},  # as a new user's shell has it
        "HOME": str(home), "XDG_CACHE_HOME": str(root.parent / "cache"), "PYTHONDONTWRITEBYTECODE": "1",
        "PATH": f"{sys.prefix}/bin:{os.environ['PATH']}",
        "KF_PIPELINES_SA_TOKEN_PATH": str(home / ".kfp-token"),  # your identity, as docs/cluster.md makes it
    }  # fmt: skip
    with FakeKfpApi(multi_user=True, prefix="/pipeline", tokens={TOKEN: {NAMESPACE}}, instant=True) as api:
        environment["KFP_HOST"] = api.url + "/pipeline"
        state = Scratch(root, environment, api.url + "/pipeline", archive, free_port())
        yield state
        for process in state.background:
            os.killpg(process.pid, signal.SIGKILL)


def _png(path: Path, size: int, seed: int = 0) -> None:
    import numpy as np

    from tests.builders import encode_png

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_png(np.random.default_rng(seed).integers(0, 256, (size, size, 3), np.uint8)))


def _images(folder: Path, sizes: tuple[int, ...]) -> None:
    """<split>/<class>/<image> folders (a folder of classes when `sizes` has one size: images to score)."""
    if len(sizes) == 1:
        for index in range(3):
            _png(folder / f"{index}.png", sizes[0], index)
        return
    for split, count in (("train", 6), ("test", 2)):
        for label in ("cat", "dog"):
            for index in range(count):
                _png(folder / split / label / f"{index}.png", sizes[index % len(sizes)], index)


# -- running a page -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    command: str
    code: int
    output: str


def run_command(scratch: Scratch, block: Block, number: int, written: str, exported: str = "") -> Ran | None:
    """Run one command of a page as the rules say; None when it is not run here. Fails naming the page and line."""
    where = f"{block.page}:{number}: {written}"
    for pattern, _why in NOT_RUN:
        if re.search(pattern, written):
            return None
    if re.fullmatch(r"make (install|test)", written):
        ci = (REPOSITORY / ".ci" / "run").read_text()
        assert re.search(rf"^{written}$", ci, re.MULTILINE), f"{where}: .ci/run does not run it as the page says"
        return None
    command = scratch.adapted(written, block)
    if re.match(r"^make tensorboard\b", command):
        return _serve(scratch, command, where)
    if command.endswith("&"):
        process = subprocess.Popen(["bash", "-c", exported + "exec " + command[:-1]], cwd=scratch.root,
                                   env=scratch.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)  # fmt: skip
        scratch.background.append(process)
        time.sleep(3)
        assert process.poll() is None, f"{where}: ended at once: {process.stdout.read()[-2000:]}"
        return Ran(command, 0, "")
    if re.match(r"^make local-run RESUME=", command):
        _interrupted_run(scratch, where)
    ran = subprocess.run(
        ["bash", "-c", exported + command], cwd=scratch.root, env=scratch.environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=COMMAND_SECONDS,
    )  # fmt: skip
    output = ran.stdout
    if NEEDS_ENGINE.search(written) and ran.returncode != 0:
        lines = [line for line in output.splitlines() if line.strip() and not line.startswith("make: ***")]
        assert ran.returncode == 2 and any(refusal in output for refusal in ENGINE_REFUSALS), (
            f"{where}: without a container engine it must refuse in one line saying so; it printed:\n{output[-3000:]}"
        )
        assert len(lines) <= 2, f"{where}: more than one line to say there is no engine:\n{output[-3000:]}"
        return Ran(command, ran.returncode, output)
    assert ran.returncode == 0, f"{where} (run as: {command}) exited {ran.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, f"{where}: a traceback:\n{output[-4000:]}"
    return Ran(command, ran.returncode, output)


def _interrupted_run(scratch: Scratch, where: str) -> None:
    """A run stopped with Ctrl-C during training, as `RESUME=last` expects to find one."""
    from tests.builders import interrupted_when

    _code, output = interrupted_when(["make", "local-run", "TRAIN_STEPS=40"], r"train: step \d+/40 ", scratch.root,
                                     scratch.environment)  # fmt: skip
    assert "continue with: make local-run RESUME=" in output, f"{where}: the stopped run did not say how:\n{output}"


def _serve(scratch: Scratch, command: str, where: str) -> Ran:
    port = free_port()
    server = subprocess.Popen(["bash", "-c", f"exec {command} PORT={port}"], cwd=scratch.root,
                              env=scratch.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert server.poll() is None, f"{where}: the server ended: {server.stdout.read()[-3000:]}"
                assert time.monotonic() < deadline, f"{where}: no answer on port {port} within 120 s"
                time.sleep(1)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    return Ran(command, 0, "")


# -- what a page shows a command printing -----------------------------------------------------------------------------


def normalized(line: str, root: Path) -> str:
    line = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", "", line.strip())
    line = re.sub(r"^\d\d:\d\d:\d\d ", "", line)
    line = line.replace(str(root) + "/", "").replace(str(root.parent) + "/", "")
    line = re.sub(r"cifar10-(pipeline|sweep)-[\d-]+", r"cifar10-\1-RUN", line)
    line = re.sub(r"[0-9a-f]{12}\b", "HASH", line)
    line = re.sub(r"\d+(\.\d+)?", "#", line.replace(",", ""))
    return re.sub(r"\s+", " ", line)


def check_output(shown: Block, ran: Ran, root: Path) -> None:
    """Each line the page shows (but `...`) is printed, in the same order."""
    printed = [normalized(line, root) for line in ran.output.splitlines()]
    position = 0
    for offset, line in enumerate(shown.text.splitlines()):
        if not line.strip() or line.strip().startswith("..."):
            continue
        wanted = normalized(line, root)
        found = next((index for index in range(position, len(printed)) if printed[index] == wanted), None)
        assert found is not None, (
            f"{shown.page}:{shown.line + offset}: the page shows\n  {line}\nbut `{ran.command}` printed, from there "
            "on:\n" + "\n".join(printed[position : position + 60])
        )
        position = found + 1


def test_every_command_of_every_page_runs_as_written_and_prints_what_it_shows(scratch):
    """The pages in the order a new user reads them (later pages use what earlier ones made); a page that fails is
    said with its line, and the pages after it still run."""
    failures = []
    for page in PAGES:
        try:
            run_page(scratch, page)
        except AssertionError as failure:
            failures.append(str(failure))
    assert not failures, "\n\n".join(failures)


def run_page(scratch: Scratch, page: str) -> None:
    blocks = blocks_of(page, (REPOSITORY / page).read_text())
    last: Ran | None = None
    python = ""
    for block in blocks:
        if any(directive.startswith("skip") for directive in block.directives):
            continue
        if "output" in block.directives:
            assert last is not None, f"{page}:{block.line}: an output block with no command block before it"
            check_output(block, last, scratch.root)
            continue
        if block.language == "python":  # a page's Python examples build on each other
            code = block.text
            for directive in block.directives:
                if directive.startswith("replace "):
                    old, new = directive.removeprefix("replace ").split(" => ", 1)
                    code = code.replace(old, new)
            python += "\n" + code
            ran = subprocess.run([sys.executable, "-c", python], cwd=scratch.root, env=scratch.environment,
                                 capture_output=True, text=True, timeout=COMMAND_SECONDS)  # fmt: skip
            assert ran.returncode == 0, f"{page}:{block.line}: the Python example fails:\n{ran.stderr[-3000:]}"
            continue
        if block.language != "sh":
            continue
        outputs, exported = [], ""
        for number, command in block.commands():
            if command.startswith("export "):  # the block's later commands run with it, as in one shell
                exported += scratch.adapted(command, block) + "; "
                continue
            started = time.monotonic()
            ran = run_command(scratch, block, number, command, exported)
            print(f"{page}:{number}: {time.monotonic() - started:.0f} s {'(not run here)' if ran is None else ''}")
            if ran is not None:
                outputs.append(ran)
        last = Ran(" ; ".join(item.command for item in outputs), 0, "".join(item.output for item in outputs))
        time.sleep(1.0 if scratch.background else 0)  # what they were last asked is printed first
        for process in scratch.background:  # a block's background commands end with it; what they printed counts
            os.killpg(process.pid, signal.SIGTERM)
            last.output += process.communicate(timeout=30)[0]
        scratch.background.clear()


def test_a_broken_example_fails_naming_its_page_and_line(scratch):
    """The check itself: a command that fails, and an output that differs, are each one failure naming the line."""
    page = "docs/broken.md"
    text = "Intro.\n\n```sh\nmake local-run EPOCH=2\n```\n\n<!-- docs-test: output -->\n```\nnot printed\n```\n"
    (command_block, output_block) = blocks_of(page, text)
    (number, command) = command_block.commands()[0]
    with pytest.raises(AssertionError, match=r"docs/broken\.md:4: make local-run EPOCH=2 .*exited 2"):
        run_command(scratch, command_block, number, command)
    with pytest.raises(AssertionError, match=r"docs/broken\.md:9: the page shows\s+not printed"):
        check_output(output_block, Ran("make help", 0, "help  list the targets\n"), scratch.root)
