"""Reading untrusted sources safely: archives without extracting them, folders without leaving them, and
pickles that may only rebuild numpy arrays.

Archives are decompressed in memory and their members read directly; nothing is ever written to disk
from an archive, and every member is first checked with the standard library's `data` extraction
filter, so absolute paths, `..`, links leaving the archive and device files are refused.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import importlib
import io
import logging
import lzma
import pickle
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PureWindowsPath

logger = logging.getLogger(__name__)

_VIRTUAL_ROOT = "/nonexistent-archive-root"


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

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def sha256(self) -> str:
        raise NotImplementedError

    def describe(self, name: str) -> str:
        return f"{self.origin}:{name}"


def _gzip_decompress(content: bytes) -> bytes:
    """gzip through ISA-L when installed (about 3x faster than zlib on CIFAR-10), else the standard library."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.decompress(content)
    return igzip.decompress(content)


def _decompress(content: bytes, origin: str) -> bytes:
    try:
        if content[:2] == b"\x1f\x8b":
            return _gzip_decompress(content)
        if content[:3] == b"BZh":
            return bz2.decompress(content)
        if content[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(content)
    except (EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as error:
        raise SourceError(f"{origin}: archive is truncated or corrupt ({error})") from error
    return content


def _normalized(member_name: str) -> str:
    name = member_name[2:] if member_name.startswith("./") else member_name
    return name.rstrip("/")


def check_member(member: tarfile.TarInfo, origin: str) -> None:
    """Refuse absolute paths, `..`, links leaving the archive, and device files (the stdlib `data` filter)."""
    if member.name.startswith(("/", "\\")) or PureWindowsPath(member.name).drive:
        raise SourceError(f"{origin}: refusing unsafe archive member {member.name!r}: absolute path")
    try:
        tarfile.data_filter(member, _VIRTUAL_ROOT)
    except tarfile.FilterError as error:
        raise SourceError(f"{origin}: refusing unsafe archive member {member.name!r}: {error}") from error


class TarTree(FileTree):
    """The regular files of a tar archive (optionally gzip/bzip2/xz compressed), decompressed in memory.

    Every member is checked before any is read; links are followed only inside the archive.
    """

    def __init__(self, path: str | Path, content: bytes | None = None):
        self.origin = str(path)
        raw = Path(path).read_bytes() if content is None else content
        self._raw = raw
        self._sha256: str | None = None
        try:
            self._archive = tarfile.open(fileobj=io.BytesIO(_decompress(raw, self.origin)), mode="r:")  # noqa: SIM115 (in memory; lives as long as the tree)
            members = self._archive.getmembers()
        except (tarfile.TarError, EOFError) as error:
            raise SourceError(f"{self.origin}: not a readable tar archive, or truncated ({error})") from error
        for member in members:
            check_member(member, self.origin)
        self._members = {_normalized(m.name): m for m in members if m.isfile() or m.islnk() or m.issym()}
        self._order = [_normalized(m.name) for m in members if m.isfile() or m.islnk() or m.issym()]
        self._directories = {_normalized(member.name) for member in members if member.isdir()}

    def names(self) -> list[str]:
        return sorted(self._members)

    def iterate(self) -> Iterator[str]:
        return iter(self._order)

    def directories(self) -> set[str]:
        return self._directories

    def read(self, name: str) -> bytes:
        member = self._members.get(name)
        if member is None:
            raise SourceError(f"{self.origin}: archive has no file {name!r}")
        try:
            handle = self._archive.extractfile(member)  # follows links, only to members inside the archive
            if handle is None:
                raise SourceError(f"{self.origin}: member {name!r} is not a regular file")
            content = handle.read()
        except (tarfile.TarError, EOFError, KeyError) as error:
            raise SourceError(f"{self.origin}: member {name!r} is truncated or unreadable ({error})") from error
        if member.isfile() and len(content) != member.size:
            raise SourceError(f"{self.origin}: member {name!r} is truncated ({len(content)} of {member.size} bytes)")
        return content

    def sha256(self) -> str:
        """The archive file's SHA-256, computed when first asked (callers that hashed it already need not)."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self._raw).hexdigest()
        return self._sha256


class DirTree(FileTree):
    """The regular files below a local folder; links that resolve outside it are refused."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.origin = str(root)
        resolved_root = self.root.resolve()
        self._names = []
        self._directories = set()
        for path in sorted(self.root.rglob("*")):
            relative = path.relative_to(self.root).as_posix()
            resolved = path.resolve()
            if resolved != resolved_root and resolved_root not in resolved.parents:
                raise SourceError(f"{path}: link leads outside the source folder {self.root} (to {resolved})")
            if path.is_dir():
                self._directories.add(relative)
            elif path.is_file():
                self._names.append(relative)
        self._sha256: str | None = None

    def names(self) -> list[str]:
        return list(self._names)

    def directories(self) -> set[str]:
        return self._directories

    def read(self, name: str) -> bytes:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError as error:
            raise SourceError(f"{self.root / name}: file does not exist") from error

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def sha256(self) -> str:
        """A digest of the folder: SHA-256 over its sorted relative paths and their contents' SHA-256."""
        if self._sha256 is None:
            digest = hashlib.sha256()
            for name in self._names:
                digest.update(name.encode() + b"\0" + hashlib.sha256(self.read(name)).digest())
            self._sha256 = digest.hexdigest()
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
    Besides these, one stand-in is allowed: Python 3 writes `bytes` in protocol 2 as
    `_codecs.encode(text, "latin1")`, which maps to a function that only does that.
    """

    def __init__(self, file, origin: str):
        super().__init__(file, encoding="bytes")
        self.origin = origin
        self._array_type = _ArrayType(origin)

    def find_class(self, module: str, name: str):
        if name == "_reconstruct" and module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            return self._reconstruct_empty
        if (module, name) == ("numpy", "ndarray"):
            return self._array_type
        if (module, name) == ("numpy", "dtype"):
            return self._integer_dtype
        if (module, name) == ("_codecs", "encode"):
            return functools.partial(_latin1_bytes, origin=self.origin)
        raise SourceError(
            f"{self.origin}: pickle references {module}.{name}; only numpy arrays are allowed in a CIFAR batch, "
            "so the file was not loaded"
        )

    def _reconstruct_empty(self, subtype, shape, dtype_code):
        import numpy

        if subtype is not self._array_type or tuple(shape) != (0,) or dtype_code != b"b":
            raise SourceError(
                f"{self.origin}: pickle builds an array ({shape!r}) without its data; only arrays whose bytes are "
                "in the file are allowed"
            )
        return _numpy_reconstruct()(numpy.ndarray, (0,), b"b")

    def _integer_dtype(self, spec, align=False, copy=True):
        import numpy

        text = spec.decode("latin-1") if isinstance(spec, bytes) else spec
        if not isinstance(text, str) or text not in ALLOWED_DTYPES:
            raise SourceError(
                f"{self.origin}: pickle asks for an array of dtype {spec!r}; a CIFAR batch holds integers only"
            )
        return numpy.dtype(text)


def load_numpy_pickle(content: bytes, origin: str):
    """Unpickle a CIFAR "python version" batch, allowing nothing but numpy array reconstruction."""
    try:
        return _NumpyOnlyUnpickler(io.BytesIO(content), origin).load()
    except SourceError:
        raise
    except Exception as error:  # a malformed pickle can raise almost anything
        raise SourceError(f"{origin}: not a readable pickle ({type(error).__name__}: {error})") from error
