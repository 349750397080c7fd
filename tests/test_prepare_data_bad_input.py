"""prepare_data on bad input: a clear error naming the file and the problem, and nothing published."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
from components.prepare_data.safe_io import SourceError
from tests import builders


def assert_rejected(tmp_path, source, match, **options):
    output = tmp_path / "out"
    with pytest.raises(SourceError, match=match) as raised:
        prepare_data(PrepareDataConfig(output=str(output), source=str(source), **options))
    published = sorted(path.relative_to(output).as_posix() for path in output.rglob("*")) if output.exists() else []
    assert published == [], f"something was published despite the error: {published}"
    return str(raised.value)


@pytest.fixture
def official():
    return builders.official_data(per_batch=10)


def _member(name, content=b"x", kind=tarfile.REGTYPE, link=""):
    def add(archive):
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(content) if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)

    return add


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        (_member("../evil.txt"), r"\.\./evil\.txt"),
        (_member("/etc/cron.d/evil"), r"/etc/cron\.d/evil"),
        (_member("cifar-10-batches-py/link", kind=tarfile.SYMTYPE, link="../../../etc/passwd"), r"link"),
        (_member("cifar-10-batches-py/abs", kind=tarfile.SYMTYPE, link="/etc/passwd"), r"abs"),
        (_member("cifar-10-batches-py/hard", kind=tarfile.LNKTYPE, link="../outside"), r"hard"),
        (_member("cifar-10-batches-py/a/../../../evil.txt"), r"leads out of the archive"),
        (_member("cifar-10-batches-py/sub/link", kind=tarfile.SYMTYPE, link="../../.."), r"outside the archive"),
        (_member("cifar-10-batches-py/hard", kind=tarfile.LNKTYPE, link="/etc/passwd"), r"outside the archive"),
        (_member("cifar-10-batches-py/tty", kind=tarfile.CHRTYPE), r"special file"),
        (_member("cifar-10-batches-py/pipe", kind=tarfile.FIFOTYPE), r"special file"),
    ],
    ids=[
        "dot-dot",
        "absolute",
        "symlink-out",
        "absolute-symlink",
        "hardlink-out",
        "dot-dot-inside",
        "symlink-up-from-a-folder",
        "absolute-hardlink",
        "device",
        "fifo",
    ],
)
def test_unsafe_archive_members_are_refused(tmp_path, official, member, problem):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, extra=[member])
    assert_rejected(tmp_path, archive, rf"cifar\.tar\.gz: refusing unsafe archive member .*{problem}")
    assert not (tmp_path.parent / "evil.txt").exists()


class _Gadget:
    """Unpickling this would run `touch MARKER`: the classic pickle exploit."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_gadget_is_refused_and_never_runs(tmp_path, official):
    marker = tmp_path / "gadget-ran"
    evil = pickle.dumps({b"data": official.data["data_batch_2"], b"labels": [0] * 10, b"x": _Gadget(marker)}, 2)
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_2": evil})
    assert_rejected(tmp_path, archive, r"data_batch_2: pickle references (posix|os)\.system; only numpy arrays")
    assert not marker.exists()


def test_pickle_codecs_with_another_encoding_is_refused(tmp_path, official):
    class Encoded:
        def __reduce__(self):
            import _codecs

            return (_codecs.encode, ("x", "rot13"))

    evil = pickle.dumps({b"data": official.data["test_batch"], b"labels": [0] * 10, b"x": Encoded()}, 2)
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"test_batch": evil})
    assert_rejected(tmp_path, archive, r"test_batch: pickle calls _codecs.encode with encoding 'rot13'; only latin1")


class _Reduced:
    """Pickles as `function(*arguments)`: how a crafted batch calls what the unpickler resolves."""

    def __init__(self, function, arguments):
        self.function, self.arguments = function, arguments

    def __reduce__(self):
        return (self.function, self.arguments)


def _reconstruct():
    from components.prepare_data.safe_io import _numpy_reconstruct

    return _numpy_reconstruct()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # 613 MB of uninitialised memory from a 200-byte pickle: the array's bytes are not in the file.
        (_Reduced(np.ndarray, ((200_000, 3072), "u1")), r"pickle builds an array|only arrays whose bytes"),
        (_Reduced(_reconstruct(), (np.ndarray, (200_000, 3072), b"b")), r"pickle builds an array .* without its data"),
        (
            np.zeros((10, 3072), dtype=[("r", "u1"), ("x", "f8")]),
            r"pickle asks for an array of dtype .*a CIFAR batch holds integers only",
        ),
        (
            np.zeros((10, 3072), dtype=np.float64),
            r"pickle asks for an array of dtype .f8.; a CIFAR batch holds integers only",
        ),
    ],
    ids=["ndarray-constructor", "reconstruct-without-data", "structured-dtype", "float-dtype"],
)
def test_pickled_arrays_must_carry_their_bytes_and_an_integer_dtype(tmp_path, official, data, problem):
    evil = pickle.dumps({b"data": data, b"labels": [0] * 10}, 2)
    assert len(evil) < 600_000
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_3": evil})
    assert_rejected(tmp_path, archive, rf"data_batch_3: {problem}")


def test_wrong_checksum(tmp_path, official):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)
    assert_rejected(
        tmp_path, archive, r"cifar\.tar\.gz: SHA-256 is [0-9a-f]{64}, expected 0{64}", source_sha256="0" * 64
    )


def test_truncated_archive(tmp_path, official):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert_rejected(tmp_path, archive, r"cifar\.tar\.gz: archive is truncated or corrupt")


def test_truncated_uncompressed_tar(tmp_path, official):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)
    import gzip

    plain = gzip.decompress(archive.read_bytes())
    truncated = tmp_path / "cifar.tar"
    truncated.write_bytes(plain[: len(plain) - 30000])
    assert_rejected(tmp_path, truncated, r"cifar\.tar: .*truncated")


def test_wrong_image_size(tmp_path, official):
    small = builders.python_batch_bytes(np.zeros((10, 3000), np.uint8), official.labels["data_batch_3"])
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_3": small})
    assert_rejected(tmp_path, archive, r"data_batch_3: images have 3000 values, expected 3072")


def test_label_out_of_range(tmp_path, official):
    labels = official.labels["data_batch_4"].copy()
    labels[3] = 10
    bad = builders.python_batch_bytes(official.data["data_batch_4"], labels)
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_4": bad})
    assert_rejected(tmp_path, archive, r"data_batch_4: label 10 is out of range; labels must be in \[0, 9\]")


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        (1 << 70, r"label 3 is 1180591620717411303424, out of range; labels are class indexes"),
        (-(1 << 64), r"label 3 is -18446744073709551616, out of range"),
        (2.0, r"label 3 is 2\.0 \(float\), not an integer class index"),
        (2.7, r"label 3 is 2\.7 \(float\), not an integer class index"),
        ("2", r"label 3 is '2' \(str\), not an integer class index"),
        (True, r"label 3 is True \(bool\), not an integer class index"),
        (None, r"label 3 is None \(NoneType\), not an integer class index"),
    ],
    ids=["beyond int64", "below int64", "float", "fraction", "text", "bool", "none"],
)
def test_labels_must_be_integer_class_indexes_exactly(tmp_path, official, label, problem):
    labels = list(official.labels["data_batch_2"])
    labels[3] = label
    bad = builders.python_batch_bytes(official.data["data_batch_2"], labels)
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_2": bad})
    assert_rejected(tmp_path, archive, rf"data_batch_2: {problem}")


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["cat", "dog", "cat"], r"classes 0 and 2 \('cat', 'cat'\) are the same name"),
        (["caf\u00e9", "dog", "cafe\u0301"], r"classes 0 and 2 \(.*\) are equal after Unicode normalisation"),
        (["cat", "", "dog"], r"class 1 has no name"),
        (["cat", "do\ng", "frog"], r"class 1 name 'do\\ng' holds control characters"),
    ],
    ids=["duplicate", "normalisation", "empty", "control character"],
)
def test_class_names_are_distinct_after_normalisation(tmp_path, names, problem):
    official = builders.official_data(per_batch=10, num_classes=3)
    archive = tmp_path / "cifar.tar.gz"
    builders.write_python_archive(archive, official, {"batches.meta": builders.python_meta_bytes(names)})
    assert_rejected(tmp_path, archive, rf"batches\.meta: {problem}")


def test_class_folders_equal_after_normalisation_are_refused(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1}, classes=("caf\u00e9", "cafe\u0301"))
    match = r"the train/ class folders\): classes 0 and 1 .* are equal after Unicode"
    assert_rejected(tmp_path, tmp_path / "images", match)


def test_label_and_data_length_mismatch(tmp_path, official):
    bad = builders.python_batch_bytes(official.data["data_batch_1"], official.labels["data_batch_1"][:7])
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_1": bad})
    assert_rejected(tmp_path, archive, r"data_batch_1: 7 labels for 10 images")


def test_empty_class(tmp_path):
    official = builders.official_data(per_batch=10, num_classes=9)  # class 9 ("truck") never appears
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)
    assert_rejected(tmp_path, archive, r"cifar\.tar\.gz: class\(es\) \['truck'\] have no training images")


def test_missing_batch(tmp_path, official):
    archive = tmp_path / "cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        builders.add_member(handle, "cifar-10-batches-py/batches.meta", builders.python_meta_bytes())
        builders.add_member(
            handle,
            "cifar-10-batches-py/data_batch_1",
            builders.python_batch_bytes(official.data["data_batch_1"], official.labels["data_batch_1"]),
        )
    assert_rejected(tmp_path, archive, r"missing \['data_batch_2', .*'test_batch'\]", source_format="python")


def test_binary_batch_of_wrong_length(tmp_path, official):
    archive = builders.write_binary_archive(tmp_path / "cifar-bin.tar.gz", official, truncate="data_batch_2")
    assert_rejected(tmp_path, archive, r"data_batch_2\.bin: 30630 bytes is not a whole number of 3073-byte records")


def test_empty_class_folder(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "train" / "horse").mkdir()
    assert_rejected(tmp_path, tmp_path / "images", r"images/train/horse: class folder is empty")


def test_non_image_file_in_class_folder(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "train" / "dog" / "notes.txt").write_text("not an image")
    assert_rejected(tmp_path, tmp_path / "images", r"images/train/dog/notes\.txt: not a JPEG or PNG image")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"GIF89a" + bytes(40), "a GIF image; only JPEG and PNG are read (convert it to PNG)"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(40), "a WebP image; only JPEG and PNG are read"),
        (b"\x00\x00\x00\x18ftypheic" + bytes(40), "a HEIC image; only JPEG and PNG are read"),
        (b"", "an empty file, not a JPEG or PNG image"),
    ],
    ids=["gif", "webp", "heic", "empty"],
)
def test_an_image_of_another_format_is_named_as_what_it_is(tmp_path, content, said):
    """A phone's HEIC or a GIF saved as .jpg among the images: the line says what the file is."""
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "train" / "dog" / "photo.jpg").write_bytes(content)
    assert_rejected(tmp_path, tmp_path / "images", rf"images/train/dog/photo\.jpg: {re.escape(said)}")


def test_a_split_spelled_twice_and_a_link_to_a_folder_are_refused_in_one_line(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "Train" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "Train" / "cat" / "x.png").write_bytes((tmp_path / "images/train/cat/0000.png").read_bytes())
    assert_rejected(tmp_path, tmp_path / "images", r"images: Train/, train/ hold the same split \(train\); keep one")
    builders.write_class_folders(tmp_path / "linked", {"train": 2, "test": 1})
    (tmp_path / "linked" / "train" / "lion").symlink_to(tmp_path / "linked" / "train" / "dog", target_is_directory=True)
    assert_rejected(tmp_path, tmp_path / "linked", r"linked/train/lion: a link to a folder .*links to folders are not "
                    "followed")  # fmt: skip


def test_a_class_spelled_with_other_unicode_characters_in_test_is_said_as_such(tmp_path):
    """train/ written on a Mac (names decomposed: 'e' + combining accent), test/ on Linux (composed): both show as
    'café'; the line says why they differ instead of 'have no train/ folder'."""
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "train" / "cat").rename(tmp_path / "images" / "train" / "cafe\u0301")
    (tmp_path / "images" / "test" / "cat").rename(tmp_path / "images" / "test" / "caf\u00e9")
    said = "test/ class 'caf\u00e9' is written with other Unicode characters than train/'s 'cafe\u0301'"
    assert_rejected(tmp_path, tmp_path / "images", re.escape(said))


def test_two_class_folders_differing_only_in_case_are_refused(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    builders.write_class_folders(tmp_path / "images", {"train": 2}, classes=("Cat",), seed=1)
    assert_rejected(tmp_path, tmp_path / "images", r"train/ classes 'Cat' and 'cat' differ only in case: merge")


def test_corrupt_image_in_class_folder(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    good = (tmp_path / "images" / "train" / "cat" / "0000.png").read_bytes()
    (tmp_path / "images" / "train" / "cat" / "0001.png").write_bytes(good[:60])
    message = assert_rejected(
        tmp_path, tmp_path / "images", r"images/train/cat/0001\.png: could not decode the PNG image"
    )
    assert "function_node" not in message and "[Op:" not in message  # the decoder's words, not TensorFlow's wrapping


def test_wrong_size_image_in_class_folder(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    large = builders.encode_png(np.zeros((40, 48, 3), np.uint8))
    (tmp_path / "images" / "test" / "frog" / "big.png").write_bytes(large)
    assert_rejected(tmp_path, tmp_path / "images", r"images/test/frog/big\.png: image is 48x40 \(width x height\), "
                    r"the others 32x32; give --resize HEIGHTxWIDTH")  # fmt: skip


def test_eval_class_without_training_folder(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "test" / "yak").mkdir()
    (tmp_path / "images" / "test" / "yak" / "0.png").write_bytes(builders.encode_png(np.zeros((32, 32, 3), np.uint8)))
    assert_rejected(tmp_path, tmp_path / "images", r"test/ classes \['yak'\] have no train/ folder")


def test_folder_link_leaving_the_source(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "secret.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "images" / "train" / "cat" / "escape.png").symlink_to(tmp_path / "secret.png")
    assert_rejected(tmp_path, tmp_path / "images", r"escape\.png: link leads outside the source folder")


def test_missing_local_source(tmp_path):
    assert_rejected(tmp_path, tmp_path / "nope.tar.gz", r"nope\.tar\.gz: no such file or folder")


def test_unreachable_url_says_how_to_pass_a_local_file(tmp_path):
    url = f"http://127.0.0.1:{builders.refused_port()}/cifar-10-python.tar.gz"
    assert_rejected(tmp_path, url, rf"could not download {url}: .*--source /path/to/cifar-10-python\.tar\.gz")


def test_not_an_archive(tmp_path):
    junk = tmp_path / "cifar.tar.gz"
    junk.write_bytes(b"<html>Not found</html>")
    assert_rejected(tmp_path, junk, r"cifar\.tar\.gz: not a tar archive but an HTML or XML page")
    junk.write_bytes(b"\x00\x01 not a tar archive at all")
    assert_rejected(tmp_path, junk, r"cifar\.tar\.gz: not a readable tar archive")


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match=r"validation_fraction: 1\.5 is not in \[0, 1\)"):
        PrepareDataConfig(output="x", validation_fraction=1.5)
    with pytest.raises(ValueError, match=r"examples_per_shard: 0 is not in \[1, "):
        PrepareDataConfig(output="x", examples_per_shard=0)


# -- bounds: no source takes more memory than its format allows ---------------------------------------------------

MEMORY_BUDGET_MB = 700  # the interpreter, numpy and TensorFlow's decoders take about 400 MB before any data
# CPU time to refuse a small hostile source: starting takes a few seconds; linear reads of a few MB, well under one.
# (A bound on behaviour, not a speed measurement: a read quadratic in its input takes minutes here.)
CPU_BUDGET_SECONDS = 30


# Runs the stage's CLI, and at exit prints the process's own peak resident memory (VmHWM: of this program
# alone; a child's ru_maxrss would include the pytest process it was forked from) and CPU time.
_MEASURED = """
import atexit, re, resource, runpy, sys
def report():
    peak = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
    print(f"peak-memory-kb {peak}", file=sys.stderr)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"cpu-seconds {usage.ru_utime + usage.ru_stime:.2f}", file=sys.stderr)
atexit.register(report)
sys.argv = ["python -m components.prepare_data", *sys.argv[1:]]
runpy.run_module("components.prepare_data", run_name="__main__")
"""


def run_prepare_data(source, output, *options) -> tuple[int, str, int, float]:
    """Run the stage's CLI as a user would: (exit code, stderr, peak resident memory in MB, CPU seconds)."""
    import subprocess
    import sys

    command = [sys.executable, "-c", _MEASURED, "--source", str(source), "--output", str(output), *options]
    completed = subprocess.run(command, cwd=builders.REPOSITORY, capture_output=True, text=True, timeout=300)
    peak_kb = int(re.search(r"peak-memory-kb (\d+)", completed.stderr).group(1))
    cpu_seconds = float(re.search(r"cpu-seconds ([\d.]+)", completed.stderr).group(1))
    return completed.returncode, completed.stderr, peak_kb // 1024, cpu_seconds


def assert_refused_within_budget(tmp_path, source, match, *options):
    code, stderr, peak_mb, cpu_seconds = run_prepare_data(source, tmp_path / "out", *options)
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert code == 2 and len(errors) == 1 and re.search(match, errors[0]), stderr[-3000:]
    assert "Traceback" not in stderr
    assert peak_mb < MEMORY_BUDGET_MB, f"took {peak_mb} MB to refuse it"
    assert cpu_seconds < CPU_BUDGET_SECONDS, f"took {cpu_seconds:.0f} s of CPU to refuse it"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_decompression_bomb_is_refused_without_unpacking_it(tmp_path):
    bomb = builders.write_gzip_bomb(tmp_path / "cifar.tar.gz", unpacked_bytes=1200 << 20)
    assert bomb.stat().st_size < 2 << 20
    assert_refused_within_budget(tmp_path, bomb, r"cifar\.tar\.gz: unpacks to more than 20 times its .* bytes")
    limited = r"cifar\.tar\.gz: unpacks to more than 50 MB, the limit \(raise --max-source-megabytes"
    assert_refused_within_budget(tmp_path, bomb, limited, "--max-source-megabytes", "50")


def test_many_tiny_gzip_members_are_read_in_time_linear_in_their_size(tmp_path):
    """gzip allows any number of members; each used to cost a copy of the rest of the input (2 MB: 96 s)."""
    import gzip

    content = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    members = tmp_path / "cifar.tar.gz"
    members.write_bytes(b"".join(gzip.compress(content[index : index + 1], mtime=0) for index in range(len(content))))
    assert members.stat().st_size > 2 << 20
    assert_refused_within_budget(tmp_path, members, r"cifar\.tar\.gz: not a readable tar archive")


def test_a_source_larger_than_the_limit_is_refused_naming_the_option(tmp_path, official):
    padding = _member("cifar-10-batches-py/padding", bytes(3 << 20))
    plain = builders.write_python_archive(tmp_path / "plain.tar", official, extra=[padding], mode="w")
    assert_rejected(tmp_path, plain, r"plain\.tar: 3\.3 MB is more than the limit of 2 MB .*--max-source-megabytes",
                    max_source_megabytes=2)  # fmt: skip


def _flat_images(root, per_split: dict[str, int], side: int = 256):
    """Class folders a and b of one-colour PNGs: a few hundred bytes each, `side`x`side`x3 bytes decoded."""
    for split, count in per_split.items():
        for class_name in ("a", "b"):
            (root / split / class_name).mkdir(parents=True)
            for index in range(count):
                image = np.full((side, side, 3), 40 * index, np.uint8)
                (root / split / class_name / f"{index}.png").write_bytes(builders.encode_png(image))


def test_images_whose_pixels_exceed_the_bound_are_refused_before_they_are_decoded(tmp_path, monkeypatch):
    """The bound on a source is also a bound on its images decoded (what the step's memory is sized for): PNGs of
    a few hundred bytes that decode to more than it are refused, counting the splits already read, before a split's
    images are decoded, and the line says both ways out (a smaller --resize, a larger bound)."""
    from components.prepare_data import sources

    decoded = []
    decode_image = sources.decode_image
    monkeypatch.setattr(sources, "decode_image", lambda *args: decoded.append(args[1]) or decode_image(*args))
    train_only = tmp_path / "train-only"
    _flat_images(train_only, {"test": 3, "train": 1})  # test/, read first: 6 images of 192 KB, 1.1 MB
    assert sum(path.stat().st_size for path in train_only.rglob("*.png")) < 20_000
    message = assert_rejected(tmp_path, train_only, r"test/a/0\.png: 6 images of 256x256 take 1\.1 MB decoded more "
                              r"than the source's bound of 1 MB; give --resize with a smaller size, or raise "
                              r"--max-source-megabytes", max_source_megabytes=1)  # fmt: skip
    assert "in a pipeline, the max_source_megabytes parameter, with prepare_step_memory" in message
    assert decoded == []  # none: the first image's header gives every image's size
    both = tmp_path / "both"
    _flat_images(both, {"test": 1, "train": 2})  # test 0.4 MB, then train 0.8 MB more
    assert_rejected(tmp_path, both, r"train/a/0\.png: 4 images of 256x256 take 0\.8 MB decoded, and the splits "
                    r"before it 0\.4 MB, more than the source's bound of 1 MB", max_source_megabytes=1)  # fmt: skip
    prepare_data(PrepareDataConfig(output=str(tmp_path / "resized"), source=str(both), resize="64",
                                   max_source_megabytes=1))  # fmt: skip
    prepare_data(PrepareDataConfig(output=str(tmp_path / "raised"), source=str(both), max_source_megabytes=2))


def test_a_sparse_archive_member_is_refused_before_it_is_read(tmp_path):
    sparse = builders.write_sparse_tar(tmp_path / "cifar.tar", apparent_bytes=8 << 30)
    assert sparse.stat().st_size < 10_000
    assert_refused_within_budget(tmp_path, sparse, r"cifar\.tar: refusing sparse archive member .*data_batch_1")


def test_a_batch_larger_than_its_format_allows_is_not_read(tmp_path, official):
    big = pickle.dumps({b"data": np.zeros((22_000, 3072), np.uint8), b"labels": [0] * 22_000}, protocol=4)
    archive = builders.write_python_archive(tmp_path / "cifar.tar", official, {"data_batch_4": big}, mode="w")
    assert_rejected(tmp_path, archive, r"data_batch_4: 67,[\d,]+ bytes is more than a CIFAR-10 batch can be")


def test_a_pickle_asking_for_a_huge_memo_is_refused_before_loading(tmp_path, official):
    # BINUNICODE "x", LONG_BINPUT 2**28 (the C unpickler would grow its memo table to 2**29 entries), STOP
    evil = b"\x80\x02X\x01\x00\x00\x00xr" + (1 << 28).to_bytes(4, "little") + b"."
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official, {"data_batch_1": evil})
    assert_refused_within_budget(tmp_path, archive, r"data_batch_1: pickle stores into memo entry 268435456")


def test_an_image_is_refused_from_its_header_before_it_is_decoded(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    (tmp_path / "images" / "train" / "cat" / "huge.png").write_bytes(builders.png_bomb(20_000, 20_000))
    images = tmp_path / "images"
    assert_refused_within_budget(tmp_path, images, r"train/cat/huge\.png: image is 20000x20000 \(width x height\), the "
                                 r"others 32x32")  # fmt: skip
    resized = r"train/cat/huge\.png: image is 20000x20000; sides above 4096 are refused"
    assert_refused_within_budget(tmp_path, images, resized, "--resize", "32x32")
    (tmp_path / "images" / "train" / "cat" / "huge.png").unlink()
    (tmp_path / "images" / "train" / "dog" / "huge.jpg").write_bytes(builders.jpeg_claiming_size(30_000, 20_000))
    assert_refused_within_budget(tmp_path, images, r"train/dog/huge\.jpg: image is 30000x20000 \(width x height\)")
    resized = r"train/dog/huge\.jpg: image is 30000x20000; sides above 4096 are refused"
    assert_refused_within_budget(tmp_path, images, resized, "--resize", "32x32")


def test_an_image_file_larger_than_a_small_image_can_be_is_not_read(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    padded = builders.encode_png(np.zeros((32, 32, 3), np.uint8)) + bytes(2 << 20)
    (tmp_path / "images" / "test" / "frog" / "padded.png").write_bytes(padded)
    assert_rejected(tmp_path, tmp_path / "images", r"test/frog/padded\.png: [\d,]+ bytes is more than an image can be")


def test_a_fifo_in_a_class_folder_is_refused_naming_it(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    os.mkfifo(tmp_path / "images" / "train" / "cat" / "pipe.png")
    assert_rejected(tmp_path, tmp_path / "images", r"train/cat/pipe\.png: not a regular file \(a FIFO\)")


def test_grayscale_and_rgba_images_are_converted_and_said_so(tmp_path, caplog):
    import tensorflow as tf

    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    gray = np.full((32, 32, 1), 77, np.uint8)
    rgba = np.concatenate([np.full((32, 32, 3), 9, np.uint8), np.zeros((32, 32, 1), np.uint8)], axis=-1)
    (tmp_path / "images" / "train" / "cat" / "gray.png").write_bytes(tf.io.encode_png(gray).numpy())
    (tmp_path / "images" / "train" / "dog" / "clear.png").write_bytes(tf.io.encode_png(rgba).numpy())
    with caplog.at_level("WARNING"):
        result = prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=str(tmp_path / "images")))
    assert sum(result.manifest.splits[name].num_examples for name in ("train", "validation")) == 8
    logged = caplog.text
    assert re.search(r"1 grayscale image\(s\) converted to RGB \(the gray value copied .*train/cat/gray\.png", logged)
    assert re.search(r"1 RGBA image\(s\) converted to RGB \(transparency dropped\), e\.g\. .*clear\.png", logged)


def test_an_empty_train_split_is_refused_naming_it(tmp_path, official):
    for name in builders.BATCH_NAMES[:5]:
        official.data[name], official.labels[name] = official.data[name][:0], official.labels[name][:0]
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)
    assert_rejected(tmp_path, archive, r"cifar\.tar\.gz: the train split is empty \(no training images")


def test_control_characters_in_file_names_cannot_forge_log_lines(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1})
    forged = "x\n2026-01-01 00:00:00,000 ERROR components.train: forged\x1b[2J\u202egnp.png"
    (tmp_path / "images" / "train" / "dog" / forged).write_text("not an image")
    code, stderr, _peak, _cpu = run_prepare_data(tmp_path / "images", tmp_path / "out")
    assert code == 2
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, stderr[-3000:]
    escaped = "x\\n2026-01-01 00:00:00,000 ERROR components.train: forged\\x1b[2J\\u202egnp.png"
    assert f"{escaped}: not a JPEG or PNG" in errors[0]
    assert "\x1b" not in stderr and "\u202e" not in stderr


def test_resizing_to_a_large_size_holds_one_shard_not_the_dataset(tmp_path):
    """--resize resizes each shard's images as the shard is written, in bounded batches: 2,400 images at 224x224
    (360 MB as uint8, 1.4 GB as float32) in shards of 200 stay near the interpreter's own memory (the whole-dataset
    resize this replaced took 4.6 GB for 3,600)."""
    code, stderr, peak_mb, _cpu = run_prepare_data(
        "synthetic", tmp_path / "out", "--synthetic-train-per-class", "200", "--synthetic-eval-per-class", "40",
        "--resize", "224", "--examples-per-shard", "200",
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert peak_mb < MEMORY_BUDGET_MB + 800, f"took {peak_mb} MB"


def test_class_folders_without_split_folders_are_named_with_the_layout_that_works(tmp_path):
    """The layout many tools make (cat/1.jpg, dog/2.jpg) is one level short of <split>/<class>/<image>: said so,
    naming the class folders found, not "no files found"."""
    for name in ("cat", "dog", "frog", "ship"):
        (tmp_path / "images" / name).mkdir(parents=True)
        (tmp_path / "images" / name / "0.png").write_bytes(builders.encode_png(np.zeros((32, 32, 3), np.uint8)))
    expected = (
        r"holds class folders \(cat/, dog/, frog/, \.\.\.\) but no split folders above them: put them under train/"
    )
    message = assert_rejected(tmp_path, tmp_path / "images", expected)
    assert "\n" not in message


def _header(name: bytes, size_field: bytes, typeflag: bytes = b"0") -> bytes:
    """A ustar header with `size_field` written as given (12 bytes: octal, base-256, or anything), its checksum
    right, so that only the field is hostile."""
    block = bytearray(512)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = size_field.ljust(12, b"\0")[:12]
    block[136:148] = b"00000000000\0"
    block[156:157] = typeflag
    block[257:263] = b"ustar\0"
    block[263:265] = b"00"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _record(key: bytes, value: bytes) -> bytes:
    """A pax record with its length right: `<length> <key>=<value>\\n`."""
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length).encode() + body) != length:
        length += 1
    return str(length).encode() + body


def _pax(records: bytes, name: bytes = b"data_batch_1") -> bytes:
    padded = records + b"\0" * (-len(records) % 512)
    return _header(b"PaxHeader/" + name, b"%011o" % len(records), b"x") + padded


HOSTILE_HEADERS = {
    "negative-base-256": _header(b"data_batch_1", b"\xff" + b"\xff" * 10 + b"\x00"),  # -512
    "pax-negative-size": _pax(_record(b"size", b"-1536")) + _header(b"data_batch_1", b"%011o" % 0),
    "pax-400000-digits": _pax(b"9" * 400_000 + b" path=x\n"),
    "base-256-2-to-60": _header(b"data_batch_1", b"\x80" + (1 << 60).to_bytes(11, "big")),
    "base-256-bit-48": _header(b"data_batch_1", b"\x80" + (1 << 48).to_bytes(11, "big")),
    "pax-size-10-to-30": _pax(_record(b"size", b"1" + b"0" * 30)) + _header(b"data_batch_1", b"0" * 11),
    "gnu-long-name-negative": _header(b"././@LongLink", b"\xff" * 11 + b"\x00", b"L"),
    "sparse-map-cut-short": _pax(_record(b"GNU.sparse.major", b"1") + _record(b"GNU.sparse.map", b"0,512,10"))
    + _header(b"data_batch_1", b"%011o" % 0),
    "pax-path-outside": _pax(_record(b"path", b"../../etc/passwd")) + _header(b"data_batch_1", b"%011o" % 0),
    "sparse-40000-digits": _header(b"data_batch_1", b"%011o" % 0, b"S"),
    "size-not-a-number": _header(b"data_batch_1", b"12a45\0"),
}


@pytest.mark.parametrize("case", HOSTILE_HEADERS)
def test_a_hostile_tar_header_is_refused_at_once_in_one_line_naming_the_file(tmp_path, case):
    """The headers an outside test gave the stdlib's tarfile (a loop for ever, quadratic time, OSError) are read by
    the project's own reader: each refused in a second, in one line naming the archive, exit 2, nothing published."""
    import time

    archive = tmp_path / "cifar.tar"
    archive.write_bytes(HOSTILE_HEADERS[case] + b"\0" * 1024)
    started = time.monotonic()
    command = [sys.executable, "-m", "components.prepare_data", "--source", str(archive), "--output",
               str(tmp_path / "out")]  # fmt: skip
    ended = subprocess.run(command, cwd=builders.REPOSITORY, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 2, ended.stderr[-2000:]
    assert time.monotonic() - started < 60
    errors = [line for line in ended.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and str(archive) in errors[0] and "Traceback" not in ended.stderr, ended.stderr[-2000:]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_image_that_decodes_to_hundreds_of_times_its_size_is_refused_before_decoding(tmp_path):
    """With --resize any side up to 4096 is read: a small PNG of 4000x4000 flat pixels (a decompression bomb) is
    refused from its header, naming the file, before it is decoded."""
    import zlib

    def png(width: int, height: int) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

        rows = zlib.compress(b"".join(b"\0" + b"\0" * (3 * width) for _ in range(height)), 9)
        header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")

    root = tmp_path / "images"
    builders.write_class_folders(root, {"train": 4, "test": 2}, seed=4)
    bomb = root / "train" / "cat" / "bomb.png"
    bomb.write_bytes(png(4000, 4000))
    assert bomb.stat().st_size < 200_000
    config = PrepareDataConfig(source=str(root), output=str(tmp_path / "out"), resize="32x32")
    with pytest.raises(SourceError, match=r"bomb\.png: a [\d,]+-byte image that decodes to 4000x4000 .*bomb"):
        prepare_data(config)
