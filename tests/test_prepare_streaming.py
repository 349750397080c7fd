"""prepare_data streams: the source is unpacked to disk and its pixels kept in a scratch file, so the step's memory
does not grow with the dataset, and what it publishes is byte for byte what reading everything into memory gives."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from components.prepare_data import sources
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.pixel_file import PixelFile
from components.prepare_data.prepare import prepare_data
from tests.builders import BATCH_NAMES, add_member, official_data, python_batch_bytes, python_meta_bytes

REPOSITORY = Path(__file__).resolve().parents[1]

# The step's own peak: VmHWM, which starts again at exec (getrusage's ru_maxrss keeps the parent's, here pytest's).
PEAK = """
import re, sys
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
prepare_data(PrepareDataConfig(source=sys.argv[1], output=sys.argv[2], cache_dir=sys.argv[3], examples_per_shard=1000))
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def python_archive(path: Path, per_batch: int, seed: int = 0) -> Path:
    """The official python layout, gzip at its fastest (random pixels do not compress anyway)."""
    official = official_data(per_batch, seed)
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        for name in BATCH_NAMES:
            add_member(
                archive, f"cifar-10-batches-py/{name}", python_batch_bytes(official.data[name], official.labels[name])
            )
        add_member(archive, "cifar-10-batches-py/batches.meta", python_meta_bytes())
    return path


def peak_bytes(archive: Path, tmp_path: Path) -> int:
    output = subprocess.run(
        [sys.executable, "-c", PEAK, str(archive), str(tmp_path / f"out-{archive.stem}"), str(tmp_path / "cache")],
        cwd=REPOSITORY, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(output.stdout.split()[-1])


def test_peak_memory_does_not_grow_with_the_source(tmp_path):
    small, large = 1_000, 5_000  # images per batch: 6,000 and 30,000 images, 18 MB and 92 MB of pixels
    archives = {count: python_archive(tmp_path / f"{count}.tar.gz", count) for count in (small, large)}
    peaks = {count: peak_bytes(archive, tmp_path) for count, archive in archives.items()}
    more_pixels, larger_batch = 6 * (large - small) * 3072, (large - small) * 3072
    # The python layout is six batches whatever its size, each read and unpickled whole (at most 64 MB: its own bound):
    # memory holds one batch twice and a shard. Held in memory instead, the archive, its unpacked bytes and the images
    # would each add all the pixels again (3x); streamed, only the per-image records grow (ids, labels, digests,
    # descriptors: a few hundred bytes an image).
    allowed = 2 * larger_batch + 0.15 * more_pixels
    assert peaks[large] - peaks[small] < allowed, {count: peak >> 20 for count, peak in peaks.items()}


def published(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("leakage", ["keep", "drop_from_train"])
def test_streamed_and_in_memory_publish_the_same_bytes(tmp_path, monkeypatch, leakage):
    archive = python_archive(tmp_path / "source.tar.gz", 300, seed=3)
    config = {
        "source": str(archive),
        "cache_dir": str(tmp_path / "cache"),
        "leakage": leakage,
        "examples_per_shard": 256,
    }
    prepare_data(PrepareDataConfig(output=str(tmp_path / "streamed"), **config))
    with monkeypatch.context() as patch:  # the batches' pixels held in memory, as arrays, as before they streamed
        patch.setattr(sources, "on_disk", lambda planar: planar.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        prepare_data(PrepareDataConfig(output=str(tmp_path / "in-memory"), **config))
    streamed, in_memory = published(tmp_path / "streamed"), published(tmp_path / "in-memory")
    assert sorted(streamed) == sorted(in_memory)
    assert [name for name in streamed if streamed[name] != in_memory[name]] == []


def test_a_pixel_file_gives_back_any_images_in_any_order():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50, 4, 5, 3), dtype=np.uint8)
    pixels = PixelFile((4, 5, 3))
    pixels.append(images[:20])
    pixels.append(images[20:])
    assert pixels.shape == (50, 4, 5, 3)
    for wanted in (np.arange(50), rng.permutation(50), np.array([7, 8, 9, 3, 4, 49, 0]), np.array([5, 5, 6]), []):
        assert np.array_equal(pixels.gather(np.asarray(wanted, np.int64)), images[np.asarray(wanted, np.int64)])
    with pytest.raises(IndexError, match=r"positions 3\.\.50 of 50 images"):
        pixels.gather(np.array([3, 50]))
    with pytest.raises(ValueError, match=r"appended to uint8 \(4, 5, 3\)"):
        pixels.append(np.zeros((1, 5, 4, 3), np.uint8))


def test_links_inside_an_archive_lead_to_their_files_and_loops_and_dangling_ones_are_one_line(tmp_path):
    from components.prepare_data.safe_io import SourceError, TarTree

    def link(archive, name, target, kind):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        archive.addfile(info)

    path = tmp_path / "links.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        add_member(archive, "data/a.bin", b"the bytes of a")
        folder = tarfile.TarInfo("data/folder")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        link(archive, "data/folder/symbolic", "../a.bin", tarfile.SYMTYPE)
        link(archive, "data/hard", "data/a.bin", tarfile.LNKTYPE)
        link(archive, "data/chain", "folder/symbolic", tarfile.SYMTYPE)
        link(archive, "data/loop-1", "loop-2", tarfile.SYMTYPE)
        link(archive, "data/loop-2", "loop-1", tarfile.SYMTYPE)
        link(archive, "data/dangling", "missing.bin", tarfile.SYMTYPE)
        link(archive, "data/to-a-folder", "folder", tarfile.SYMTYPE)
    tree = TarTree(path, 1 << 20)
    for name in ("data/a.bin", "data/folder/symbolic", "data/hard", "data/chain"):
        assert tree.read(name, 100) == b"the bytes of a"
    with pytest.raises(SourceError, match=r"data/chain: 14 bytes is more than a file can be \(4 bytes\); not read"):
        tree.read("data/chain", 4)
    with pytest.raises(SourceError, match=r"'data/loop-1': links lead through more than 32 others"):
        tree.read("data/loop-1", 100)
    with pytest.raises(SourceError, match=r"'data/dangling' is a link to 'data/missing.bin', which the archive does"):
        tree.read("data/dangling", 100)
    with pytest.raises(SourceError, match=r"'data/to-a-folder' is not a regular file"):
        tree.read("data/to-a-folder", 100)
    assert tree.names() == sorted(["data/a.bin", "data/folder/symbolic", "data/hard", "data/chain", "data/loop-1",
                                   "data/loop-2", "data/dangling", "data/to-a-folder"])  # fmt: skip


def _archive_of_every_kind(path: Path, tar_format: int, damage=None) -> Path:
    """Members of every kind a source holds, in `tar_format`: short and long (prefix, or extension record) names,
    non-ASCII ones, empty files, folders, links, a v7 folder (a file whose name ends in '/')."""
    with tarfile.open(path, "w", format=tar_format) as archive:
        add_member(archive, "data/train/cat/0001.png", b"a cat")
        add_member(archive, "data/train/empty.png", b"")
        add_member(archive, "data/" + "deep/" * 25 + "dog.png", b"a dog in a deep folder" * 40)
        add_member(archive, "data/" + "x" * 120 + "/long.png", b"a long name")
        add_member(archive, "data/train/caf\u00e9/0002.png", b"coffee")
        folder = tarfile.TarInfo("data/train/bird")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, target, kind in (("data/link", "train/cat/0001.png", tarfile.SYMTYPE),
                                   ("data/hard", "data/train/cat/0001.png", tarfile.LNKTYPE)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            archive.addfile(info)
        add_member(archive, "data/last.png", b"the last" * 100)
    if damage is not None:
        content = bytearray(path.read_bytes())
        damage(content)
        path.write_bytes(bytes(content))
    return path


def _index(tree) -> tuple:
    return tree._files, tree._links, tree._directories, tree._order


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("damage", [None, "checksum", "octal", "truncated", "v7-folder", "trailing"])
def test_the_archive_index_is_what_the_standard_library_reads(tmp_path, tar_format, damage):
    """The project's own header reader (no header reaches the stdlib's tarfile) gives the stdlib's members on every
    format (ustar, GNU long names, pax records); a damaged archive is refused in one line naming the archive and
    where, as the stdlib refuses it."""
    from components.prepare_data import safe_io

    def v7_folder(content):  # the first member made a folder the v7 way: type NUL, name ending in '/'
        content[156] = 0
        content[22:23] = b"/"
        content[148:156] = b"%06o\0 " % (sum(content[:148]) + 256 + sum(content[156:512]))

    damages = {
        "checksum": lambda content: content.__setitem__(slice(1100, 1101), b"Z"),  # a later header's name
        "octal": lambda content: content.__setitem__(slice(100, 108), b"0 0644 \0"),  # a space inside the mode
        "truncated": lambda content: content.__delitem__(slice(len(content) - 11_000, None)),
        "v7-folder": v7_folder,
        "trailing": lambda content: content.extend(b"after the end " * 100),
    }
    archive = _archive_of_every_kind(tmp_path / "every.tar", tar_format, damages.get(damage))

    def stdlib_index():
        tree = safe_io.TarTree.__new__(safe_io.TarTree)  # the same bookkeeping, fed by tarfile
        tree.origin, tree._files, tree._links, tree._directories, tree._order = str(archive), {}, {}, set(), []
        with tarfile.open(archive) as opened:
            for member in opened:
                kind = ("directory" if member.isdir() else "symlink" if member.issym() else
                        "hardlink" if member.islnk() else "file")  # fmt: skip
                tree._take(member.name, kind, member.offset_data, member.size, member.linkname)
        return _index(tree)

    try:
        read_whole = stdlib_index()[3][-1:] == ["data/last.png"]  # the stdlib may stop at a cut header silently
    except (tarfile.TarError, EOFError, OSError):
        read_whole = False
    cut_in_padding = damage == "truncated" and read_whole  # only the end's zero padding was cut
    if damage in ("checksum", "octal", "truncated") and not cut_in_padding:  # the stdlib may stop without a word
        with pytest.raises(safe_io.SourceError) as refused:
            safe_io.TarTree(archive, 1 << 20)
        assert str(refused.value).startswith(f"{archive}: ") and "\n" not in str(refused.value)
        assert re.search(r"at byte [\d,]+: |truncated|not a readable tar archive", str(refused.value))
        return
    fast = _index(safe_io.TarTree(archive, 1 << 20))
    if damage == "v7-folder":  # a folder with data: skipped as GNU tar does (the stdlib reads no member after it)
        assert "data/train/cat/0001.pn" in fast[2] and "data/last.png" in fast[0]
        return
    assert fast == stdlib_index()
    if damage in (None, "trailing"):
        assert "data/" + "deep/" * 25 + "dog.png" in fast[0] and "data/train/caf\u00e9/0002.png" in fast[0]


def test_spooled_descriptors_read_back_as_written_from_threads_and_a_forked_worker():
    """The descriptors wait in one scratch file: batches put from several threads read back as they were, and a
    forked worker puts its own in a file of its own while reading its parent's."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    from components.prepare_data import statistics as data_statistics

    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((int(size), 63)).astype(np.float16) for size in rng.integers(1, 500, 40)]
    with ThreadPoolExecutor(4) as pool:
        spooled = list(pool.map(data_statistics.spooled, batches))
    assert all(np.array_equal(item.array(), batch) for item, batch in zip(spooled, batches, strict=True))

    def child(queue):
        mine = data_statistics.spooled(batches[0] + 1)
        queue.put((mine.spool is not spooled[0].spool, np.array_equal(spooled[5].array(), batches[5]),
                   np.array_equal(mine.array(), batches[0] + 1)))  # fmt: skip

    queue = multiprocessing.get_context("fork").Queue()
    worker = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
    worker.start()
    assert queue.get(timeout=60) == (True, True, True)
    worker.join(60)
    assert np.array_equal(spooled[5].array(), batches[5])  # the parent's, untouched by the worker's
