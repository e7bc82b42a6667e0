"""Where data lives: a local path or an object-storage URL (``msc://PROFILE/PATH``), read through
Energon's path layer (``EPath``, backed by the multi-storage-client) so that the start-up checks
read an object store as Energon itself does.

:func:`data_location` classifies what a config names (``file://`` is a local path; ``msc://`` is
kept as the URL, never joined to a config's folder; another scheme is refused by name).
:class:`RemotePath` gives an ``msc://`` location the few ``pathlib`` operations the checks use
(join, name, existence, reads, sizes, ranged reads), so one code path checks local and remote
datasets alike; :func:`as_data_path` picks the type.
"""

from __future__ import annotations

import io
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

from energon_nemotron.errors import ConfigError

__all__ = ["READ_SCHEMES", "data_location", "is_url", "as_data_path", "RemotePath", "DataPath", "object_size",
           "read_range", "open_binary", "data_signature", "energon_path", "listed"]

#: URL schemes whose data the library reads (through Energon's EPath)
READ_SCHEMES = ("msc",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)


def is_url(value: Any) -> bool:
    """Whether ``value`` (a str, a path or a :class:`RemotePath`) names an object-storage URL."""
    return isinstance(value, RemotePath) or (isinstance(value, str) and _SCHEME.match(value) is not None)


def data_location(value: Union[str, Path]) -> Union[str, Path]:
    """What a config's data path names: an ``msc://`` URL (kept as the string), or a local ``Path``
    (``file://PATH`` is the local ``PATH``). Raises ``ValueError`` naming another scheme."""
    if isinstance(value, Path):
        return value
    match = _SCHEME.match(str(value))
    if match is None:
        return Path(value)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return Path(rest)
    if scheme in READ_SCHEMES:
        if not rest.split("/", 1)[0]:
            raise ValueError(f"{value!r}: an msc:// URL names a profile first: msc://PROFILE/PATH")
        return f"{scheme}://{rest}"
    raise ValueError(f"{value!r}: the scheme {scheme}:// is not read here; name object storage as "
                     "msc://PROFILE/PATH (a multi-storage-client profile names the bucket, its endpoint and "
                     "credentials), or a local path")


class RemotePath:
    """An ``msc://`` location with the ``pathlib`` operations the start-up checks use, read through
    Energon's ``EPath`` (metadata objects and sizes; :func:`read_range` for index entries)."""

    def __init__(self, url: str) -> None:
        scheme, rest = str(url).split("://", 1)
        self.url = f"{scheme}://{rest.rstrip('/')}"

    def _epath(self) -> Any:
        from megatron.energon.epathlib import EPath

        return EPath(self.url)

    def __truediv__(self, part: Union[str, Path]) -> "RemotePath":
        return RemotePath(f"{self.url.rstrip('/')}/{str(part).lstrip('/')}")

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: "RemotePath") -> bool:
        return self.url < other.url

    @property
    def name(self) -> str:
        return PurePosixPath(self.url.split("://", 1)[1]).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> "RemotePath":
        scheme, rest = self.url.split("://", 1)
        return RemotePath(f"{scheme}://{PurePosixPath(rest).parent}")

    def with_name(self, name: str) -> "RemotePath":
        return self.parent / name

    def resolve(self) -> "RemotePath":
        return self

    def is_absolute(self) -> bool:
        return True

    @property
    def profile(self) -> str:
        return self.url.split("://", 1)[1].split("/", 1)[0]

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """``fn(EPath)``; a failure of the store (unreachable endpoint, refused credentials, no such
        profile) is a one-line ``ConfigError`` naming the URL, the profile and the cause. A missing
        object stays ``FileNotFoundError``."""
        try:
            return fn(self._epath())
        except FileNotFoundError:
            raise
        except Exception as e:
            config = os.environ.get("MSC_CONFIG") or "~/.msc_config.yaml"
            cause = " ".join(f"{type(e).__name__}: {e}".split())[:400]
            raise ConfigError(f"{self.url}: the object store cannot be read ({what}: {cause}); check the profile "
                              f"{self.profile!r} in the multi-storage-client config {config} (its endpoint and "
                              "credentials)") from None

    def is_dir(self) -> bool:
        known = _LISTED.get()
        if known is not None and (self.url + "/").startswith(known[0] + "/"):
            return any(url.startswith(self.url + "/") for url in known[1])
        return bool(self._call("a listing", lambda p: p.is_dir()))

    def _listed_size(self) -> Union[int, None, bool]:
        """The object's size from the listing of :func:`listed` (None: no such object there; False:
        not below a listed folder)."""
        known = _LISTED.get()
        if known is None or not self.url.startswith(known[0] + "/"):
            return False
        return known[1].get(self.url)

    def is_file(self) -> bool:
        size = self._listed_size()
        if size is not False:
            return size is not None
        return bool(self._call("a metadata request", lambda p: p.is_file()))

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def read_bytes(self) -> bytes:
        if not self.is_file():
            raise FileNotFoundError(f"{self.url}: no such object")
        known = _LISTED.get()
        cache = known[2] if known is not None and self._listed_size() is not False else None
        if cache is not None and self.url in cache:
            return cache[self.url]
        data = self._call("a read", lambda p: p.read_bytes())
        if cache is not None:
            cache[self.url] = data
        return data

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def size(self) -> int:
        size = self._listed_size()
        if size is None:
            raise FileNotFoundError(f"{self.url}: no such object")
        if size is not False:
            return int(size)
        return int(self._call("a metadata request", lambda p: p.size()))

    # -- writes (pack-megatron's output on the store) -----------------------------------------------
    def upload(self, local: Path, attributes: dict[str, str]) -> None:
        """Put the local file ``local`` here (one atomic object), with ``attributes`` as its metadata."""
        self._call("an upload", lambda p: p.fs.upload_file(p._internal_str_path, str(local), attributes=attributes))

    def download(self, local: Path) -> None:
        """Copy the object to the local file ``local`` (streamed)."""
        self._call("a download", lambda p: p.fs.download_file(p._internal_str_path, str(local)))

    def glob(self, pattern: str) -> list["RemotePath"]:
        """The objects below this location whose relative path matches ``pattern`` (one listing)."""
        def found(p: Any) -> list[str]:
            return [q.relative_to(p) for q in p.glob(pattern)]

        return [self / name for name in self._call("a listing", found)]

    def write_bytes(self, data: bytes) -> None:
        self._call("a write", lambda p: p.fs.write(p._internal_str_path, data))

    def create_exclusive(self, data: bytes) -> bool:
        """Create the object with ``data`` only if there is none (a conditional put, ``If-None-Match:
        *``); False when one exists already (the store answered 412)."""
        return self._conditional_put(data, if_none_match="*")

    def replace_if(self, data: bytes, etag: str) -> bool:
        """Replace the object only if its ETag is still ``etag`` (``If-Match``); False when it changed."""
        return self._conditional_put(data, if_match=etag)

    def _conditional_put(self, data: bytes, **condition: str) -> bool:
        from multistorageclient.types import PreconditionFailedError

        def put(p: Any) -> bool:
            try:
                p.fs._storage_provider.put_object(p._internal_str_path, data, **condition)
            except PreconditionFailedError:
                return False
            return True

        return bool(self._call("a conditional write", put))

    def delete(self) -> None:
        """Remove the object (nothing when there is none)."""
        def delete(p: Any) -> None:
            try:
                p.fs.delete(p._internal_str_path)
            except FileNotFoundError:
                pass

        self._call("a delete", delete)

    def info(self) -> tuple[int, str, dict]:
        """(size, ETag, metadata attributes) of the object; ``FileNotFoundError`` when there is none."""
        found = self._call("a metadata request", lambda p: p.stat())
        return int(found.content_length), str(found.etag or ""), dict(found.metadata or {})

    def signature(self) -> tuple:
        """(size, ETag) of the object: what changes when it is written again."""
        size, etag, _ = self.info()
        return size, etag

    def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset``: one ranged GET through the profile's client (opening
        the object instead would download all of it)."""
        from multistorageclient.types import Range

        def read(p: Any) -> bytes:
            if length <= 0:
                return b""
            return bytes(p.fs.read(p._internal_str_path, byte_range=Range(offset=offset, size=length)))

        return self._call("a ranged read", read)


DataPath = Union[Path, RemotePath]

#: (folder URL, {object URL: size}, {object URL: bytes read}) of the listing a :func:`listed` block
#: reads sizes from, and the whole objects it has read (metadata files, read once)
_LISTED: ContextVar[Optional[tuple[str, dict[str, int], dict[str, bytes]]]] = ContextVar("energon_nemotron_listed",
                                                                                         default=None)


@contextmanager
def listed(folder: DataPath) -> Iterator[None]:
    """Within the block, whether an object or a folder below ``folder`` (on object storage) exists
    and an object's size come from one recursive listing of ``folder``, made here, instead of a
    request each, and an object read whole is read once. A local folder: nothing changes."""
    outer = _LISTED.get()
    if not isinstance(folder, RemotePath) or (outer is not None and (folder.url + "/").startswith(outer[0] + "/")):
        yield                                   # local, or listed already by an enclosing block
        return

    def listing(p: Any) -> dict[str, int]:
        prefix = p._internal_str_path.strip("/") + "/"
        return {f"msc://{folder.profile}/{o.key.lstrip('/')}": int(o.content_length)
                for o in p.fs.list_recursive(p._internal_str_path) if o.key.lstrip("/").startswith(prefix)}

    token = _LISTED.set((folder.url, folder._call("a listing", listing), {}))
    try:
        yield
    finally:
        _LISTED.reset(token)


def as_data_path(value: Union[str, "os.PathLike[str]", RemotePath]) -> DataPath:
    """A :class:`RemotePath` for a URL (``scheme://``), else a local ``Path``."""
    if isinstance(value, (RemotePath, Path)):
        return value
    text = value if isinstance(value, str) else os.fspath(value)
    return RemotePath(text) if is_url(text) else Path(text)


def object_size(path: DataPath) -> int:
    """The size in bytes of a file or an object; ``FileNotFoundError`` when there is none."""
    if isinstance(path, RemotePath):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such object")
        return path.size()
    return Path(path).stat().st_size


def read_range(path: DataPath, offset: int, length: int) -> bytes:
    """``length`` bytes of a file or an object from ``offset`` (fewer at its end): one ranged read."""
    if isinstance(path, RemotePath):
        return path.read_range(offset, length)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


class _RangedObject(io.RawIOBase):
    """A read-only, seekable raw file over an object: each read one ranged GET at the position
    (wrapped in an ``io.BufferedReader``, whose buffer sets the GET size)."""

    def __init__(self, path: RemotePath) -> None:
        super().__init__()
        self.path, self.position, self.length = path, 0, object_size(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.length - self.position)
        if want <= 0:
            return 0
        data = self.path.read_range(self.position, want)
        if len(data) != want:
            raise OSError(f"{self.path}: a ranged read at byte {self.position} returned {len(data)} of {want} bytes "
                          "(the object changed while it was read?)")
        buffer[:want] = data
        self.position += want
        return want


#: bytes fetched per ranged GET when an object is read as a stream
STREAM_CHUNK = 8 << 20


def open_binary(path: DataPath, chunk: int = STREAM_CHUNK) -> BinaryIO:
    """A file or an object opened for binary reading (lines, ``seek``, ``read``): an object is
    read in ranged GETs of ``chunk`` bytes, never downloaded whole. ``FileNotFoundError`` when
    there is none."""
    if isinstance(path, RemotePath):
        return io.BufferedReader(_RangedObject(path), buffer_size=chunk)
    return open(path, "rb")


def data_signature(path: DataPath) -> tuple:
    """What changes when a file or an object is written again: (size, mtime) or (size, ETag)."""
    if isinstance(path, RemotePath):
        return path.signature()
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def energon_path(path: DataPath) -> Any:
    """What Energon's own functions take for ``path``: its ``EPath`` of a URL, else the local path."""
    if isinstance(path, RemotePath):
        from megatron.energon.epathlib import EPath

        return EPath(path.url)
    return path
