"""Reading untrusted sources safely: archives without extracting them, folders without leaving them, and
pickles that may only rebuild numpy arrays.

An archive file is decompressed as a stream into one unnamed scratch file (an uncompressed one is read in place), so
its size costs disk, not memory; its members are read from there, never extracted, and every member is first checked
as the standard library's `data` extraction filter checks it (by its name), so absolute paths, `..`, links leaving
the archive and device files are refused.

Nothing is read without a bound: a source may unpack to at most `max_bytes` (and a compressed one to at most
`MAX_EXPANSION` times its size, past a small floor: image data barely compresses, decompression bombs expand a
thousandfold), sparse members (holes that would be filled with zeros) are refused, every file is read with the
largest size its format allows, and pickles are scanned before they are loaded.

It owns every bound on hostile input (sizes, decompression ratio, archive members, pickles, image headers), in one
place.
"""

from __future__ import annotations

import bisect
import bz2
import functools
import hashlib
import importlib
import io
import logging
import lzma
import os
import pickle
import pickletools
import posixpath
import re
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from components.common import filesystem
from components.common.compression import gzip_stream_pieces
from components.common.filesystem import file_kind
from components.common.values import shown
from components.prepare_data.config import MEMORY_PER_SOURCE_MEGABYTE

logger = logging.getLogger(__name__)

MAX_LINKS = 32  # links one read may go through (a chain, or a loop)

MEGABYTE = 1 << 20
_CHUNK_BYTES = 16 * MEGABYTE
MAX_EXPANSION = 20  # CIFAR batches and image files unpack to about 1.1x; a decompression bomb to 1000x
EXPANSION_FLOOR = 64 * MEGABYTE  # below this, any ratio is harmless


class SourceError(ValueError):
    """The source data is unsafe, malformed or not what was expected; nothing was published."""


class FileTree:
    """Regular files under a root, addressed by relative POSIX paths."""

    origin: str

    def names(self) -> list[str]:
        raise NotImplementedError

    def iterate(self) -> Iterator[str]:
        """File names as they become readable (all at once for a folder)."""
        return iter(self.names())

    def directories(self) -> set[str]:
        raise NotImplementedError

    def read(self, name: str, max_bytes: int, what: str = "a file") -> bytes:
        """The file's bytes; refused, before reading, when they are more than `what` can hold (`max_bytes`)."""
        raise NotImplementedError

    def describe(self, name: str) -> str:
        return f"{self.origin}:{name}"

    def close(self) -> None:
        """Let go of the index of the files (and an archive's scratch file), once nothing more is read."""

    def _too_large(self, name: str, size: int, max_bytes: int, what: str) -> SourceError:
        return SourceError(
            f"{self.describe(name)}: {size:,} bytes is more than {what} can be ({max_bytes:,} bytes); not read"
        )


# How to let a larger source in, from the command line and in a pipeline (whose prepare step's memory goes with it)
RAISE_THE_LIMIT = (
    "raise --max-source-megabytes if the source really is that large; in a pipeline, the max_source_megabytes "
    f"parameter, with prepare_step_memory at {MEMORY_PER_SOURCE_MEGABYTE} MB for each MB"
)


def _too_large_source(origin: str, max_bytes: int) -> SourceError:
    return SourceError(f"{origin}: unpacks to more than {max_bytes // MEGABYTE:,} MB, the limit ({RAISE_THE_LIMIT})")


def _stream_pieces(stream: io.BufferedIOBase) -> Iterator[bytes]:
    with stream:
        while piece := stream.read(_CHUNK_BYTES):
            yield piece


class HashingReader(io.RawIOBase):
    """A file's bytes as read, each hashed on the way: what is hashed is exactly what the reader was given."""

    def __init__(self, handle):
        self.handle = handle
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self.handle.readinto(buffer)
        self.digest.update(memoryview(buffer)[:count])
        return count

    def rest(self) -> None:
        """Hash what the reader left unread (bytes after a compressed stream's end)."""
        while piece := self.handle.read(_CHUNK_BYTES):
            self.digest.update(piece)


def _file_pieces(reader, magic: bytes) -> tuple[Iterator[bytes], bool]:
    """The archive's bytes as `reader` gives them, decompressed piece by piece when its `magic` says so; and whether
    it was compressed."""
    if magic[:2] == b"\x1f\x8b":
        return gzip_stream_pieces(reader.read), True
    if magic[:3] == b"BZh":
        return _stream_pieces(bz2.BZ2File(reader)), True
    if magic[:6] == b"\xfd7zXZ\x00":
        return _stream_pieces(lzma.LZMAFile(reader)), True
    return iter(lambda: reader.read(_CHUNK_BYTES), b""), False


def unpacked_file(path: Path, origin: str, max_bytes: int):
    """(the archive at `path` as a private scratch file of its tar bytes, the SHA-256 of the file's bytes): one read
    of the file, hashed as it is decompressed (or copied), so that what is converted is what was hashed, whatever
    happens to the file meanwhile. An unnamed scratch file: gone when closed or the process ends; under the same
    bounds as in memory. A file that changed while it was read (its size or time of change moved) is refused."""
    handle = filesystem.open_regular(path)
    before = os.fstat(handle.fileno())
    magic = handle.read(6)
    handle.seek(0)
    compressed = before.st_size
    reader = HashingReader(handle)
    pieces, was_compressed = _file_pieces(io.BufferedReader(reader, _CHUNK_BYTES), magic)
    bound = min(max_bytes, max(EXPANSION_FLOOR, MAX_EXPANSION * compressed)) if was_compressed else max_bytes
    unpacked = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the tree that reads it)
    produced = 0
    try:
        with handle:
            for piece in pieces:
                produced += len(piece)
                if produced > max_bytes:
                    raise _too_large_source(origin, max_bytes)
                if produced > bound:
                    raise SourceError(
                        f"{origin}: unpacks to more than {MAX_EXPANSION} times its {compressed:,} bytes; refusing a "
                        "likely decompression bomb (image data barely compresses)"
                    )
                unpacked.write(piece)
            reader.rest()
            after = os.fstat(handle.fileno())
    except SourceError:
        unpacked.close()
        raise
    except (EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as error:
        unpacked.close()
        raise SourceError(f"{origin}: archive is truncated or corrupt ({error})") from error
    if [(stats.st_size, stats.st_mtime_ns, stats.st_ctime_ns) for stats in (before, after)] != [
        (before.st_size, before.st_mtime_ns, before.st_ctime_ns)
    ] * 2:
        unpacked.close()
        raise SourceError(
            f"{origin}: the file changed while it was read; nothing was published: run again once it is still"
        )
    unpacked.seek(0)
    return unpacked, reader.digest.hexdigest()


def check_source_size(path: Path, max_bytes: int) -> None:
    """Refuse a source file larger than the limit before reading it."""
    size = path.stat().st_size
    if size > max_bytes:
        raise SourceError(
            f"{path}: {size / MEGABYTE:,.1f} MB is more than the limit of {max_bytes // MEGABYTE:,} MB "
            f"({RAISE_THE_LIMIT})"
        )


def _normalized(member_name: str) -> str:
    name = member_name[2:] if member_name.startswith("./") else member_name
    return name.rstrip("/")


def check_member(name: str, kind: str, linkname: str, origin: str) -> None:
    """Refuse what the stdlib's `data` extraction filter refuses: absolute paths, paths or links that lead out of
    the archive's root, and special files (devices, FIFOs). Decided from the names alone, as the archive is never
    unpacked to a folder (the stdlib filter resolves them against the disk: 100 us a member, most of the time of
    reading a source of small images). `kind`: file, directory, hardlink, symlink, special."""
    if _absolute(name):
        raise SourceError(f"{origin}: refusing unsafe archive member {name!r}: absolute path")
    if _leaves_root(name):
        raise SourceError(f"{origin}: refusing unsafe archive member {name!r}: its path leads out of the archive")
    if kind == "special":
        raise SourceError(f"{origin}: refusing unsafe archive member {name!r}: a special file (device or FIFO)")
    if kind in ("symlink", "hardlink"):
        target = posixpath.join(posixpath.dirname(name), linkname) if kind == "symlink" else linkname
        if _absolute(linkname) or _leaves_root(target):
            raise SourceError(
                f"{origin}: refusing unsafe archive member {name!r}: a link to {linkname!r}, outside the archive"
            )


# Every tar header is read here, by the project, bounded and checked before anything is taken from it: no header
# reaches the stdlib's tarfile, whose behaviour on a hostile header depends on the Python release (a negative size
# loops for ever before 3.11.14, a long pax record is quadratic, a huge base-256 number ends in OSError).
_BLOCK = tarfile.BLOCKSIZE
_KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"5": "directory", b"1": "hardlink", b"2": "symlink",
          b"3": "special", b"4": "special", b"6": "special"}  # fmt: skip
_EXTENSIONS = {b"x": "pax", b"g": "global pax", b"L": "GNU long name", b"K": "GNU long link"}
MAX_EXTENSION_BYTES = 1 << 20  # a pax or GNU long-name record: names of at most a few KB, and a few fields
_PAX_RECORD = re.compile(rb"([1-9][0-9]{0,6}) ")  # a record's length: at most 7 digits, within MAX_EXTENSION_BYTES
_SIZE_BITS = 48  # a member's offset and size in one int: offset << _SIZE_BITS | size (a size is within the file)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")


class _Header:
    """One 512-byte tar header, its fields read with the bounds of the file it is in."""

    def __init__(self, block: bytes, offset: int, file_size: int, origin: str):
        self.block, self.offset, self.origin = block, offset, origin
        self.name = _text(block[0:100])
        self.typeflag = block[156:157]
        outside = block[:148] + block[156:]
        unsigned = sum(outside) + 8 * ord(" ")
        signed = unsigned - 256 * sum(1 for byte in outside if byte > 127)  # as some old tars summed them
        digits = block[148:156].split(b"\0", 1)[0].strip(b" ")
        if not (re.fullmatch(rb"[0-7]{1,8}", digits) and int(digits, 8) in (unsigned, signed)):
            if offset == 0:  # nothing of it reads as tar
                raise SourceError(f"{origin}: not a readable tar archive (its first block is no tar header)")
            raise self.refused("its header's checksum does not hold (a damaged or truncated archive)")
        for start, end, field in ((100, 108, "mode"), (108, 116, "uid"), (116, 124, "gid"), (136, 148, "mtime")):
            self.number(start, end, field, 1 << 63)  # not used, but a field that is not a number is damage
        self.size = self.number(124, 136, "size", file_size)
        if offset + _BLOCK + _padded(self.size) > file_size:
            raise self.refused(f"its data ({self.size:,} bytes) runs past the end of the archive (truncated)")

    def refused(self, reason: str) -> SourceError:
        named = f"member {shown(self.name)}" if self.name else "a member"
        return SourceError(f"{self.origin}: {named} at byte {self.offset:,}: {reason}")

    def number(self, start: int, end: int, field: str, limit: int) -> int:
        """A numeric field: octal digits (spaces and NULs around them), or base-256 (the first byte 0x80), at most
        `limit`; a negative one (0xff), or any other form, is refused."""
        raw = self.block[start:end]
        if raw[:1] == b"\x80":
            value = int.from_bytes(raw[1:], "big")
        elif raw[:1] == b"\xff":
            raise self.refused(f"its {field} is negative")
        else:
            digits = raw.split(b"\0", 1)[0].strip(b" ")
            if not re.fullmatch(rb"[0-7]*", digits):
                raise self.refused(f"its {field} field {raw!r} is not an octal number")
            value = int(digits or b"0", 8)
        if value > limit:
            raise self.refused(f"its {field} {value:,} is more than {limit:,} (beyond the archive)")
        return value


def _sparse(origin: str, name: str) -> SourceError:
    return SourceError(
        f"{origin}: refusing sparse archive member {name!r} (mostly holes); an image dataset has no sparse files"
    )


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def _pax_records(data: bytes, header: _Header) -> dict[str, str]:
    """A pax extended header's records (`<length> <key>=<value>\n`), each checked: the length a short decimal that
    fits the data, the key and value in it."""
    records, position = {}, 0
    while position < len(data):
        if data[position:].strip(b"\0") == b"":
            break  # padding
        match = _PAX_RECORD.match(data, position)
        if match is None:
            raise header.refused(f"its pax record at byte {position} has no valid length")
        length = int(match.group(1))
        record = data[position : position + length]
        if length < len(match.group(0)) + 2 or position + length > len(data) or not record.endswith(b"\n"):
            raise header.refused(f"its pax record at byte {position} does not fit its length {length}")
        key, equals, value = record[len(match.group(0)) : -1].partition(b"=")
        if not equals:
            raise header.refused(f"its pax record at byte {position} has no '='")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _pax_size(value: str, header: _Header, file_size: int) -> int:
    if not re.fullmatch(r"[0-9]{1,20}", value):
        raise header.refused(f"its pax size {value[:40]!r} is not a decimal size")
    size = int(value)
    if size > file_size:
        raise header.refused(f"its pax size {size:,} is more than the archive holds")
    return size


def _members(descriptor: int, file_size: int, origin: str) -> Iterator[tuple[str, str, int, int, str]]:
    """(name, kind, offset of the data, size, link target) of each member, every header read and checked here
    (ustar, GNU and v7 headers, pax and GNU long-name records, base-256 sizes; 600,000 members in about 9 s). A
    block of zeros ends the archive; sparse members, unknown kinds and anything damaged are refused in one line
    naming the member and the archive."""
    offset, extended, long_name, long_link = 0, {}, None, None
    while True:
        block = os.pread(descriptor, _BLOCK, offset)
        if len(block) < _BLOCK:
            if block.count(0) == len(block):
                return  # no (whole) end-of-archive blocks: as the stdlib, the members read are the archive
            if offset == 0:
                raise SourceError(f"{origin}: not a readable tar archive, or truncated ({len(block)} bytes)")
            raise SourceError(f"{origin}: the archive ends inside a header at byte {offset:,} (truncated)")
        if block.count(0) == _BLOCK:
            return
        header = _Header(block, offset, file_size, origin)
        data_offset, following = offset + _BLOCK, offset + _BLOCK + _padded(header.size)
        if header.typeflag in _EXTENSIONS:
            if header.size > MAX_EXTENSION_BYTES:
                raise header.refused(
                    f"its {_EXTENSIONS[header.typeflag]} record of {header.size:,} bytes is more than "
                    f"{MAX_EXTENSION_BYTES:,} (no image archive has one)"
                )
            data = os.pread(descriptor, header.size, data_offset)
            if header.typeflag in (b"x", b"g"):
                records = _pax_records(data, header)
                if any(key.startswith("GNU.sparse") for key in records):
                    name = records.get("GNU.sparse.name") or records.get("path") or header.name
                    raise _sparse(origin, name)
                if header.typeflag == b"x":
                    extended = records
            elif header.typeflag == b"L":
                long_name = _text(data)
            else:
                long_link = _text(data)
            offset = following
            continue
        if header.typeflag == b"S":
            raise _sparse(origin, long_name or header.name)
        kind = _KINDS.get(header.typeflag)
        if kind is None:
            raise header.refused(f"its kind {header.typeflag!r} is not a file, folder or link")
        name = extended.get("path") or long_name or header.name
        if "path" not in extended and long_name is None:
            prefix = _text(block[345:500])
            if prefix:
                name = prefix + "/" + name
        linkname = extended.get("linkpath") or long_link or _text(block[157:257])
        size = _pax_size(extended["size"], header, file_size) if "size" in extended else header.size
        if kind == "file" and header.typeflag == b"\0" and name.endswith("/"):
            kind = "directory"
        if kind == "directory":
            name = name.rstrip("/")
        if kind == "file":
            following = data_offset + _padded(size)
            if following > file_size:
                raise header.refused(f"its data ({size:,} bytes) runs past the end of the archive (truncated)")
        yield name, kind, data_offset, size if kind == "file" else 0, linkname
        offset, extended, long_name, long_link = following, {}, None, None


def _absolute(path: str) -> bool:
    """A path from a root, or with a Windows drive ("C:...")."""
    return path.startswith(("/", "\\")) or (
        len(path) >= 2 and path[1] == ":" and path[0].isascii() and path[0].isalpha()
    )


def _leaves_root(path: str) -> bool:
    normal = posixpath.normpath(path.replace("\\", "/"))
    return normal == ".." or normal.startswith("../")


class TarTree(FileTree):
    """The regular files of a tar archive (optionally gzip/bzip2/xz compressed), decompressed to a scratch file.

    Every member is checked before any is read; links are followed only inside the archive. The archive
    unpacks to at most `max_bytes`, and no member is sparse, so no read can take more than that. What is kept of each
    member is its name, where its bytes start and how many, in one integer (a link: its target), not the archive's
    record of it: 150 bytes a member, a tenth of the record's, for sources of millions of files.
    """

    def __init__(self, path: str | Path, max_bytes: int, origin: str | None = None, expected_sha256: str | None = None):
        self.origin = origin or str(path)  # what the messages name: the source as given (a URL, not its download)
        check_source_size(Path(path), max_bytes)
        self._file, self.sha256 = unpacked_file(Path(path), self.origin, max_bytes)  # one read: hashed and copied
        if expected_sha256 is not None and self.sha256 != expected_sha256.lower():
            self._file.close()
            raise SourceError(
                f"{self.origin}: SHA-256 is {self.sha256}, expected {expected_sha256.lower()}; the file is damaged"
            )
        if os.fstat(self._file.fileno()).st_size > max_bytes:
            raise _too_large_source(self.origin, max_bytes)
        beginning = self._file.read(512)
        self._file.seek(0)
        self._files: dict[str, int] = {}  # name: the offset of its bytes and its size, in one int (`_SIZE_BITS`)
        self._links: dict[str, str] = {}  # name: the name it leads to
        self._order: list[str] = []
        self._directories: set[str] = set()
        if beginning.lstrip().startswith(b"<"):  # what a proxy or a web server answers instead
            raise SourceError(
                f"{self.origin}: not a tar archive but an HTML or XML page (a login or error page where the archive "
                "should be?)"
            )
        if beginning[:4] == b"PK\x03\x04":
            raise SourceError(
                f"{self.origin}: a ZIP archive; give a tar archive (tar czf data.tar.gz FOLDER) or a folder"
            )
        for member in _members(self._file.fileno(), os.fstat(self._file.fileno()).st_size, self.origin):
            self._take(*member)

    def _take(self, member_name: str, kind: str, offset: int, size: int, linkname: str) -> None:
        check_member(member_name, kind, linkname, self.origin)
        name = _normalized(member_name)
        if kind == "directory":
            self._directories.add(name)
        elif kind == "file":
            self._files[name] = offset << _SIZE_BITS | size
            self._order.append(name)
        elif kind in ("hardlink", "symlink"):  # a hard link names a member; a symbolic one a path from its folder
            target = linkname if kind == "hardlink" else posixpath.join(posixpath.dirname(name), linkname)
            self._links[name] = _normalized(posixpath.normpath(target))
            self._order.append(name)

    def names(self) -> list[str]:
        return sorted({*self._files, *self._links})

    def iterate(self) -> Iterator[str]:
        return iter(self._order)

    def directories(self) -> set[str]:
        return self._directories

    def _resolved(self, name: str) -> tuple[int, int]:
        """(offset, size) of the file `name` is or leads to, through links that stay inside the archive."""
        target = name
        for _ in range(MAX_LINKS):
            if target in self._files:
                return divmod(self._files[target], 1 << _SIZE_BITS)
            if target not in self._links:
                if target in self._directories:
                    raise SourceError(f"{self.origin}: member {name!r} is not a regular file")
                raise SourceError(
                    f"{self.origin}: member {name!r} is a link to {target!r}, which the archive does not hold"
                )
            target = self._links[target]
        raise SourceError(f"{self.origin}: member {name!r}: links lead through more than {MAX_LINKS} others")

    def close(self) -> None:
        self._files, self._links, self._order = {}, {}, []
        self._file.close()

    def read(self, name: str, max_bytes: int, what: str = "a file") -> bytes:
        if name not in self._files and name not in self._links:
            raise SourceError(f"{self.origin}: archive has no file {name!r}")
        offset, size = self._resolved(name)
        if size > max_bytes:
            raise self._too_large(name, size, max_bytes, what)
        content = os.pread(self._file.fileno(), size, offset)
        if len(content) != size:
            raise SourceError(f"{self.origin}: member {name!r} is truncated ({len(content)} of {size} bytes)")
        return content


class DirTree(FileTree):
    """The regular files below a local folder; links that resolve outside it, and anything that is neither a file
    nor a folder (a FIFO, a socket, a device), are refused. With `max_bytes`, the files may hold that much in all."""

    def __init__(self, root: str | Path, max_bytes: int | None = None):
        self.root = Path(root)
        self.origin = str(root)
        resolved_root = self.root.resolve()
        self._names = []
        self._directories = set()
        total = 0
        for path in sorted(self.root.rglob("*")):
            relative = path.relative_to(self.root).as_posix()
            resolved = path.resolve()
            if resolved != resolved_root and resolved_root not in resolved.parents:
                raise SourceError(f"{path}: link leads outside the source folder {self.root} (to {resolved})")
            try:
                mode = path.stat().st_mode
            except OSError as error:
                raise SourceError(f"{path}: cannot be read ({error.strerror}; a broken link?)") from error
            if stat.S_ISDIR(mode) and path.is_symlink():
                raise SourceError(
                    f"{path}: a link to a folder ({resolved}); links to folders are not followed: copy the folder, or "
                    "link each file"
                )
            if stat.S_ISDIR(mode):
                self._directories.add(relative)
            elif stat.S_ISREG(mode):
                self._names.append(relative)
                total += path.stat().st_size
            else:
                raise SourceError(f"{path}: not a regular file ({file_kind(mode)}); a source folder holds only files")
        if max_bytes is not None and total > max_bytes:
            raise _too_large_source(self.origin, max_bytes)
        self._sha256: str | None = None
        self._digests: bytearray | None = None  # each file's SHA-256 (32 bytes), in the order of `_names`
        self._sorted: list[str] | None = None
        self._order: list[int] = []

    def names(self) -> list[str]:
        return list(self._names)

    def directories(self) -> set[str]:
        return self._directories

    def read(self, name: str, max_bytes: int, what: str = "a file") -> bytes:
        path = self.root / name
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size > max_bytes:
                    raise self._too_large(name, size, max_bytes, what)
                content = handle.read(max_bytes + 1)  # the file may have grown since
        except FileNotFoundError as error:
            raise SourceError(f"{path}: file does not exist") from error
        if len(content) > max_bytes:
            raise self._too_large(name, len(content), max_bytes, what)
        self._check_unchanged(name, content)
        return content

    def _check_unchanged(self, name: str, content: bytes) -> None:
        """Once the folder is hashed, a file is read only as it was hashed: else the folder changed while read, and
        the dataset would carry the digest of one version over the pixels of another (refused)."""
        if self._digests is None:
            return
        if self._sorted is None:  # the names in string order, and where each is in the folder's order
            self._order = sorted(range(len(self._names)), key=self._names.__getitem__)
            self._sorted = [self._names[index] for index in self._order]
        found = bisect.bisect_left(self._sorted, name)
        if found < len(self._sorted) and self._sorted[found] == name:
            index = self._order[found]
            if hashlib.sha256(content).digest() != bytes(self._digests[32 * index : 32 * index + 32]):
                raise SourceError(
                    f"{self.root / name}: changed since the source folder was hashed; nothing was published: run "
                    "again once the folder is still"
                )

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def sha256(self) -> str:
        """A digest of the folder: SHA-256 over its sorted relative paths and their contents' SHA-256 (each kept, so
        that every later read is checked against it)."""
        if self._sha256 is None:
            digest, digests = hashlib.sha256(), bytearray()
            for name in self._names:
                with open(self.root / name, "rb") as handle:
                    file_digest = hashlib.file_digest(handle, "sha256").digest()
                digests += file_digest
                digest.update(name.encode() + b"\0" + file_digest)
            self._sha256, self._digests = digest.hexdigest(), digests
        return self._sha256


def _numpy_reconstruct():
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return importlib.import_module(module_name)._reconstruct
        except (ImportError, AttributeError):
            continue
    raise ImportError("numpy has no multiarray._reconstruct")


def _latin1_bytes(text: str, encoding: str, origin: str) -> bytes:
    """What `_codecs.encode` does for a protocol-2 pickle of `bytes` written by Python 3; nothing else."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise SourceError(
            f"{origin}: pickle calls _codecs.encode with encoding {encoding!r}; only latin1 (bytes) is allowed"
        )
    return text.encode("latin-1")


# dtypes a CIFAR "python version" batch can hold: uint8 pixels, integer labels. Nothing structured, no objects.
ALLOWED_DTYPES = frozenset(
    f"{order}{kind}" for order in ("", "<", "|") for kind in ("u1", "i1", "i2", "i4", "i8", "u2", "u4", "u8")
)


class _ArrayType:
    """What the unpickler hands out for `numpy.ndarray`: calling it is refused, so no pickle allocates an array."""

    def __init__(self, origin: str):
        self.origin = origin

    def __call__(self, *arguments, **keywords):
        raise SourceError(
            f"{self.origin}: pickle builds an array ({arguments[0] if arguments else ''}) without its data; only "
            "arrays whose bytes are in the file are allowed"
        )


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Resolves only what rebuilding a numpy array needs; any other global is refused before it is loaded.

    Arrays are rebuilt the way numpy pickles them: an empty array (`_reconstruct(ndarray, (0,), b"b")`) whose
    state then brings the shape, an integer dtype and the raw bytes, which numpy checks against the shape. So an
    array's bytes are always in the file: calling `ndarray(shape, dtype)` or `_reconstruct` with another shape
    (uninitialised memory of any size) is refused, and so are dtypes other than the integer ones a batch holds.
    Besides these, two stand-ins are allowed: Python 3 writes `bytes` in protocol 2 as
    `_codecs.encode(text, "latin1")`, which maps to a function that only does that, and `b""` as `bytes()`.

    Nothing `find_class` hands out refers back to the unpickler: a cycle through its memo would keep every
    intermediate object of a batch (about 80 MB) alive until the garbage collector happened to run.
    """

    def __init__(self, file, origin: str):
        super().__init__(file, encoding="bytes")
        self.origin = origin
        array_type = _ArrayType(origin)
        self._allowed = {
            ("numpy.core.multiarray", "_reconstruct"): functools.partial(
                _reconstruct_empty, array_type=array_type, origin=origin
            ),
            ("numpy._core.multiarray", "_reconstruct"): functools.partial(
                _reconstruct_empty, array_type=array_type, origin=origin
            ),
            ("numpy", "ndarray"): array_type,
            ("numpy", "dtype"): functools.partial(_integer_dtype, origin=origin),
            ("_codecs", "encode"): functools.partial(_latin1_bytes, origin=origin),
            ("__builtin__", "bytes"): functools.partial(_empty_bytes, origin=origin),  # how b"" is pickled
            ("builtins", "bytes"): functools.partial(_empty_bytes, origin=origin),
        }

    def find_class(self, module: str, name: str):
        allowed = self._allowed.get((module, name))
        if allowed is None:
            raise SourceError(
                f"{self.origin}: pickle references {module}.{name}; only numpy arrays are allowed in a CIFAR batch, "
                "so the file was not loaded"
            )
        return allowed


def _empty_bytes(*arguments, origin: str) -> bytes:
    """Protocol 2 writes b"" as `bytes()`: allowed with no arguments, and nothing else."""
    if arguments:
        raise SourceError(f"{origin}: pickle calls bytes{arguments!r}; only bytes() (empty) is allowed")
    return b""


def _reconstruct_empty(subtype, shape, dtype_code, *, array_type: _ArrayType, origin: str):
    import numpy

    if subtype is not array_type or tuple(shape) != (0,) or dtype_code != b"b":
        raise SourceError(
            f"{origin}: pickle builds an array ({shape!r}) without its data; only arrays whose bytes are in the file "
            "are allowed"
        )
    return _numpy_reconstruct()(numpy.ndarray, (0,), b"b")


def _integer_dtype(spec, align=False, copy=True, *, origin: str):
    import numpy

    text = spec.decode("latin-1") if isinstance(spec, bytes) else spec
    if not isinstance(text, str) or text not in ALLOWED_DTYPES:
        raise SourceError(f"{origin}: pickle asks for an array of dtype {spec!r}; a CIFAR batch holds integers only")
    return numpy.dtype(text, False, True)  # a copy: the pickle's state is then set on it, never on numpy's own


_FIXED, _LINES, _COUNTED, _END = range(4)


def _argument_layout_table() -> list[tuple[int, int]]:
    """Per opcode byte, how its argument is laid out: (_FIXED, n bytes), (_LINES, k lines), (_COUNTED, width of
    the length that precedes it), or (_END, 0) for STOP and bytes that are no opcode."""
    counted_widths = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
                      pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}  # fmt: skip
    table = [(_END, 0)] * 256
    for opcode in pickletools.opcodes:
        argument = opcode.arg
        if opcode.name == "STOP":
            continue
        if argument is None:
            table[ord(opcode.code)] = (_FIXED, 0)
        elif argument.n >= 0:
            table[ord(opcode.code)] = (_FIXED, argument.n)
        elif argument.n == pickletools.UP_TO_NEWLINE:
            table[ord(opcode.code)] = (_LINES, 2 if argument.name.endswith("_pair") else 1)
        else:
            table[ord(opcode.code)] = (_COUNTED, counted_widths[argument.n])
    return table


_ARGUMENT_LAYOUT_TABLE = _argument_layout_table()
_MEMO_STORES = (ord(b"p"), ord(b"r"))  # PUT, LONG_BINPUT (BINPUT's one-byte index cannot ask for much)


def _check_memo(content: bytes, origin: str) -> None:
    """Scan the pickle's opcodes before loading it: the C unpickler grows its memo table to whatever index a PUT
    names, so a few bytes asking for entry 2**30 would take gigabytes. Indexes are given out in order, one per
    stored object, so none can exceed the number of opcodes before it. The scan skips over arguments without
    decoding them (a batch's pixels are one 30 MB argument); a malformed pickle is left to the unpickler."""
    layouts, find, end = _ARGUMENT_LAYOUT_TABLE, content.find, len(content)
    position, count = 0, 0
    while position < end:
        code = content[position]
        kind, size = layouts[code]
        start = position + 1
        if kind == _FIXED:
            position = start + size
        elif kind == _COUNTED:
            position = start + size + int.from_bytes(content[start : start + size], "little")
        elif kind == _LINES:
            position = find(b"\n", start) + 1
            if size == 2 and position:
                position = find(b"\n", position) + 1
            if not position:
                return
        else:  # STOP, or an unknown opcode, which the unpickler reports
            return
        if code in _MEMO_STORES:
            index = _memo_index(code, content[start:position])
            if index > count:
                raise SourceError(f"{origin}: pickle stores into memo entry {index} after {count} opcodes; not loaded")
        count += 1


def _memo_index(code: int, argument: bytes) -> int:
    if code == _MEMO_STORES[0]:  # PUT: a decimal line
        text = argument.strip()
        return int(text) if text.isdigit() else 0
    return int.from_bytes(argument, "little")


def load_numpy_pickle(content: bytes, origin: str):
    """Unpickle a CIFAR "python version" batch, allowing nothing but numpy array reconstruction."""
    try:
        _check_memo(content, origin)
        return _NumpyOnlyUnpickler(io.BytesIO(content), origin).load()
    except SourceError:
        raise
    except Exception as error:  # a malformed pickle can raise almost anything
        raise SourceError(f"{origin}: not a readable pickle ({type(error).__name__}: {error})") from error
