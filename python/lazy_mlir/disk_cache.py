"""A folder of checked, atomically written cache entries, bounded in size.

One file per key, ``<hex key>.entry``: a header (magic, format version,
payload length, SHA-256 of the payload) and the payload bytes. Writers fill
a temporary file in the same folder and ``os.replace`` it over the entry, so
a reader (another rank, another test worker) sees the old entry, the new
one, or none, never half of one. A reader checks the header and the
checksum: a corrupt or truncated entry is removed with a warning, and the
caller rebuilds it. A hit refreshes the entry's mtime; when the folder grows
past its limit the least recently used entries go first.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import time
import warnings

MAGIC = b"LZMLIRC\0"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQ32s")  # magic, format version, payload length, sha256
SUFFIX = ".entry"
# A temporary file this old belongs to a writer that died.
_STALE_TEMP_SECONDS = 3600


class CorruptEntry(ValueError):
    pass


def default_dir() -> str:
    """$XDG_CACHE_HOME/lazy_mlir, else ~/.cache/lazy_mlir."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lazy_mlir")


def encode(payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes) -> bytes:
    """The payload, or CorruptEntry saying what is wrong."""
    if len(data) < _HEADER.size:
        raise CorruptEntry(f"truncated header ({len(data)} bytes)")
    magic, version, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry("not a lazy_mlir cache entry")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format version {version}, expected {FORMAT_VERSION}")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise CorruptEntry(f"truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    return payload


class DiskCache:
    def __init__(self, directory: str, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key + SUFFIX)

    def read(self, key: str) -> bytes | None:
        """The entry's payload; None when absent or unusable (then it is removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(f"lazy_mlir: cannot read cache entry {path} ({exc}); compiling instead",
                          RuntimeWarning, stacklevel=2)
            return None
        try:
            payload = decode(data)
        except CorruptEntry as exc:
            self.discard(key, f"{exc}")
            return None
        try:
            os.utime(path)  # mtime = last use, for the LRU bound (atime is often not kept)
        except OSError:
            pass  # removed by another process's trim meanwhile: we already have it
        return payload

    def discard(self, key: str, why: str) -> None:
        """Removes an entry that cannot be used, with a warning."""
        path = self.path(key)
        warnings.warn(f"lazy_mlir: cache entry {path} is unusable ({why}); it is rebuilt",
                      RuntimeWarning, stacklevel=3)
        try:
            os.remove(path)
        except OSError:
            pass

    def write(self, key: str, payload: bytes) -> bool:
        """Atomically replaces the entry; False (with a warning) when the folder
        cannot be written: a cache failure never fails a step."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.directory, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(encode(payload))
                    f.flush()
                    os.fsync(f.fileno())  # the rename must not land before the data
                os.replace(temp, self.path(key))
            except BaseException:
                try:
                    os.remove(temp)
                except OSError:
                    pass
                raise
        except OSError as exc:
            warnings.warn(f"lazy_mlir: cannot write cache entry in {self.directory} ({exc})",
                          RuntimeWarning, stacklevel=2)
            return False
        self.trim()
        return True

    def trim(self) -> None:
        """Removes least recently used entries until the folder fits its limit,
        and temporary files left by writers that died."""
        entries, total, now = [], 0, time.time()
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    try:
                        st = e.stat()
                    except OSError:
                        continue  # removed meanwhile
                    if e.name.endswith(".tmp") and now - st.st_mtime > _STALE_TEMP_SECONDS:
                        _remove_quietly(e.path)
                    elif e.name.endswith(SUFFIX):
                        entries.append((st.st_mtime, st.st_size, e.path))
                        total += st.st_size
        except OSError:
            return
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            _remove_quietly(path)
            total -= size

    def size(self) -> int:
        total = 0
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    if e.name.endswith(SUFFIX):
                        try:
                            total += e.stat().st_size
                        except OSError:
                            pass  # trimmed by another process meanwhile
        except OSError:
            pass
        return total


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # another process trimmed it first
