"""A folder of checked, atomically written cache entries, bounded in size.

One file per key, ``<hex key>.entry``: a header (magic, format version,
payload length, SHA-256 of the payload) and the payload bytes. Writers fill
a temporary file in the same folder and ``os.replace`` it over the entry, so
a reader (another rank, another test worker) sees the old entry, the new
one, or none, never half of one. A reader checks the header and the
checksum: a corrupt or truncated entry is removed with a warning, and the
caller rebuilds it. A hit refreshes the entry's mtime; when the folder grows
past its limit the least recently used entries go first.

``lock(key)`` lets one process build a missing entry while the others that
need it wait and then read it (ranks of one job on one machine compile each
group once, not once per rank). It is an ``flock`` on ``<hex key>.lock``:
the kernel releases it when its holder exits, so a crashed builder leaves
no stale lock, only an empty file that ``trim`` removes later.
"""
from __future__ import annotations

import contextlib
import fcntl
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
LOCK_SUFFIX = ".lock"
LIBRARY_SUFFIX = ".so"  # a native library (compile_cache.store_native)
# A temporary file this old belongs to a writer that died (a lock file this
# old is no longer held: no compile takes an hour).
_STALE_TEMP_SECONDS = 3600


class CorruptEntry(ValueError):
    pass


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

    def remove(self, key: str) -> None:
        """Removes an entry (gone already: nothing to do)."""
        _remove_quietly(self.path(key))

    @contextlib.contextmanager
    def lock(self, key: str, on_wait=None):
        """Holds ``key``'s lock across processes for the block; calls ``on_wait()``
        first when another process holds it. A folder that cannot be written
        gives no lock (the block runs unlocked: a cache failure never fails a step)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(os.path.join(self.directory, key + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.utime(fd)  # mtime = last use: trim leaves recent lock files alone
            yield
        finally:
            os.close(fd)  # releases the lock

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

    def library(self, digest: str, data: bytes) -> str | None:
        """The path of a shared library holding ``data`` (named by its
        ``digest``), written into the folder unless there already; counted
        and trimmed like the entries. None when it cannot be written."""
        path = os.path.join(self.directory, digest + LIBRARY_SUFFIX)
        try:
            if os.path.getsize(path) == len(data):
                os.utime(path)
                return path
        except OSError:
            pass  # not there yet
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.directory, prefix=f".{digest[:16]}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, path)  # a process that loaded the old file keeps its mapping
        except OSError as exc:
            warnings.warn(f"lazy_mlir: cannot write a library into {self.directory} ({exc})",
                          RuntimeWarning, stacklevel=2)
            return None
        return path

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
                    if e.name.endswith((".tmp", LOCK_SUFFIX)) and now - st.st_mtime > _STALE_TEMP_SECONDS:
                        _remove_quietly(e.path)
                    elif e.name.endswith((SUFFIX, LIBRARY_SUFFIX)):
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
                    if e.name.endswith((SUFFIX, LIBRARY_SUFFIX)):
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
