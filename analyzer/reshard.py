"""Reshard TFRecord files into N balanced, distinct shards, all-or-nothing.

Rule source: "Shard your input data" in the Cerebras document "Performance Optimization
Practices": "you split your dataset into multiple, shorter, distinct files and allocate
them across the worker nodes so that different workers have different slices of the
dataset" — when the files are too few or too large for the input workers, reshard them.

How it works:

* The sources (files, directories, globs) are read in order; every record's raw frame
  (header, data, CRCs) is copied verbatim to the shard with the fewest bytes so far
  (ties: lowest index). This interleaves the sources over all shards and keeps shard
  sizes within one record frame of each other (max − min <= the largest frame).
* Shards are written into a hidden temporary directory
  ``.<name>.reshard-<host>-<pid>-<random>`` beside the output, fsync'ed, re-read and
  checked, then renamed into place with ``renameat2(RENAME_NOREPLACE)`` (an existing
  output is never overwritten, not even one appearing meanwhile).
* Verification: the multiset of records must be unchanged: same count, same total
  bytes, and the same order-independent checksum (sum mod 2**128 of the BLAKE2b-128
  digests of the records).
* Interruption: an exception, Ctrl-C, SIGTERM or SIGHUP removes the temporary
  directory before the process ends; a SIGKILL is covered by a small watchdog process
  that removes it when the resharder's pipe closes; a leftover of a dead process on
  this host (e.g. a whole process group killed) is removed by the next reshard of the
  same output. Inputs are only ever opened read-only.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import heapq
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from csrun_common import tfrecord

from .datafiles import expand_sources

__all__ = ["MultisetDigest", "ReshardResult", "ReshardVerificationError", "reshard", "shard_name",
           "temp_prefix"]


class ReshardVerificationError(RuntimeError):
    """The shards written do not hold the same multiset of records as the sources."""


class MultisetDigest:
    """Order-independent digest of a multiset of byte strings.

    ``count`` (records), ``data_bytes`` (sum of lengths, bytes) and ``hash_sum`` (sum
    mod 2**128 of each record's BLAKE2b-128 digest). Two multisets with equal digests
    are equal except with probability about ``count² / 2**128``.
    """

    __slots__ = ("count", "data_bytes", "_sum")

    def __init__(self) -> None:
        self.count = 0
        self.data_bytes = 0
        self._sum = 0

    def add(self, data: bytes) -> None:
        self.count += 1
        self.data_bytes += len(data)
        self._sum += int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "little")

    @property
    def hash_sum(self) -> int:
        return self._sum % (1 << 128)

    def hexdigest(self) -> str:
        return f"{self.hash_sum:032x}"

    def key(self) -> tuple[int, int, int]:
        return (self.count, self.data_bytes, self.hash_sum)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultisetDigest) and self.key() == other.key()

    def __repr__(self) -> str:
        return f"MultisetDigest(count={self.count}, data_bytes={self.data_bytes}, sum={self.hexdigest()})"


@dataclass
class ReshardResult:
    """What :func:`reshard` did: ``output`` (directory), ``shard_paths`` (N paths),
    ``shard_records`` / ``shard_bytes`` (per shard: records; bytes incl. framing),
    ``records`` and ``bytes`` (totals), ``checksum`` (hex, order-independent),
    ``verified`` (True: multiset unchanged), ``seconds`` (wall time), ``sources``
    (files read), ``watchdog`` (a SIGKILL watchdog guarded the temporary directory),
    ``removed_stale`` (leftover temporary directories removed)."""

    output: str
    shard_paths: list[str]
    shard_records: list[int]
    shard_bytes: list[int]
    records: int
    bytes: int
    checksum: str
    verified: bool
    seconds: float
    sources: int
    watchdog: bool
    removed_stale: list[str] = field(default_factory=list)

    @property
    def num_shards(self) -> int:
        return len(self.shard_paths)

    @property
    def imbalance_bytes(self) -> float:
        """max/mean of the shard sizes (bytes)."""
        mean = sum(self.shard_bytes) / max(1, len(self.shard_bytes))
        return max(self.shard_bytes) / mean if mean else 1.0

    def to_dict(self) -> dict:
        return {"output": self.output, "num_shards": self.num_shards, "records": self.records,
                "bytes": self.bytes, "checksum": self.checksum, "verified": self.verified,
                "imbalance_bytes": round(self.imbalance_bytes, 6), "seconds": round(self.seconds, 3),
                "sources": self.sources, "watchdog": self.watchdog,
                "removed_stale": self.removed_stale,
                "shards": [{"path": p, "records": r, "bytes": b} for p, r, b in
                           zip(self.shard_paths, self.shard_records, self.shard_bytes, strict=True)]}


def shard_name(prefix: str, index: int, num_shards: int) -> str:
    """``shard-00003-of-00016.tfrecord`` (at least 5 digits)."""
    width = max(5, len(str(num_shards)))
    return f"{prefix}-{index:0{width}d}-of-{num_shards:0{width}d}.tfrecord"


def temp_prefix(output: str) -> str:
    """Name prefix of this host's temporary directories for ``output`` (in its parent)."""
    return f".{os.path.basename(os.path.abspath(output))}.reshard-{socket.gethostname()}-"


def _remove_stale(output: str) -> list[str]:
    parent = os.path.dirname(os.path.abspath(output))
    pre = temp_prefix(output)
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for n in names:
        if not n.startswith(pre):
            continue
        pid_text = n[len(pre):].split("-", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not psutil.pid_exists(int(pid_text)):
            path = os.path.join(parent, n)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


_WATCHDOG = (
    "import shutil,sys\n"
    "try:\n"
    "    while sys.stdin.buffer.read(65536): pass\n"
    "except BaseException: pass\n"
    "shutil.rmtree(sys.argv[1], ignore_errors=True)\n"
)


def _start_watchdog(path: str) -> subprocess.Popen | None:
    """A child that removes ``path`` once our end of its stdin pipe closes (also when
    this process is SIGKILLed). Own session: a terminal's Ctrl-C does not reach it."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG, path],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except (OSError, ValueError):
        return None


def _stop_watchdog(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    try:
        proc.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - never seen
        proc.kill()
        proc.wait()


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; raise ``FileExistsError`` if ``dst`` exists (atomic with
    renameat2 where the C library and file system have it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        fn = None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", dst)
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), dst)
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    os.rename(src, dst)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _ensure_fd_limit(need: int, num_shards: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise ValueError(f"--num-shards {num_shards}: needs {need} open files but the limit is {hard} "
                     f"(ulimit -Hn); use fewer shards or raise the limit")


class _Progress:
    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        self.pending = 0
        if enabled:
            try:
                from tqdm import tqdm  # only with --progress: not at the CLI's start-up
            except ImportError:  # pragma: no cover - tqdm is a declared dependency
                return
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                            file=sys.stderr, leave=True)

    def add(self, n: int) -> None:
        if self.bar is not None:
            self.pending += n
            if self.pending >= 1 << 20:
                self.bar.update(self.pending)
                self.pending = 0

    def close(self) -> None:
        if self.bar is not None:
            if self.pending:
                self.bar.update(self.pending)
            self.bar.close()


def reshard(sources: Sequence[str], num_shards: int, output: str, *, prefix: str = "shard",
            verify_crc: bool = False, progress: bool = False, pattern: str | None = None,
            on_record: Callable[[int], None] | None = None) -> ReshardResult:
    """Rewrite the TFRecord files ``sources`` into ``num_shards`` balanced shards in the
    new directory ``output``.

    ``sources``: files, directories or globs (expanded by
    :func:`analyzer.datafiles.expand_sources`; duplicates read once). Shards are named
    :func:`shard_name` and balanced by bytes (max − min <= largest frame). With
    ``verify_crc`` every record's data CRC is checked on reading and on verification
    (slow without a crc32c package). ``progress`` shows tqdm bars on stderr.
    ``on_record(n)`` is called after the n-th record is written (progress hooks and
    fault injection in tests).

    Steps: check the arguments and the sources, write the shards into a temporary
    directory (:class:`_TempOutput`), read them back and compare the record multisets,
    publish the directory under ``output``.

    Returns a :class:`ReshardResult` (``verified`` is True). Raises ``ValueError``
    (one line, naming the flag/file and value) for bad arguments, an existing output,
    non-TFRecord or corrupt input, or fewer records than shards;
    :class:`ReshardVerificationError` if the records changed. In every failure case,
    and on interruption, neither the output nor a temporary directory is left.
    """
    t0 = time.monotonic()
    output = _check_arguments(num_shards, prefix, output)
    paths = _check_sources(sources, pattern, output)
    total_bytes = sum(os.path.getsize(p) for p in paths)
    _ensure_fd_limit(num_shards + 64, num_shards)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    removed = _remove_stale(output)
    names = [shard_name(prefix, i, num_shards) for i in range(num_shards)]
    with _TempOutput(output) as tmp:
        written = _write_shards(paths, [os.path.join(tmp.path, n) for n in names], verify_crc,
                                _Progress(progress, total_bytes, "reshard"), on_record)
        if written.digest.count < num_shards:
            raise ValueError(f"--num-shards {num_shards}: the sources hold only {written.digest.count} "
                             f"record(s); {num_shards - written.digest.count} shard(s) would be empty")
        _verify_shards(tmp.path, names, written, verify_crc, _Progress(progress, total_bytes, "verify"))
        tmp.publish()
    return ReshardResult(
        output=output, shard_paths=[os.path.join(output, n) for n in names],
        shard_records=written.records, shard_bytes=written.bytes, records=written.digest.count,
        bytes=sum(written.bytes), checksum=written.digest.hexdigest(), verified=True,
        seconds=time.monotonic() - t0, sources=len(paths), watchdog=tmp.watchdog is not None,
        removed_stale=removed)


def _check_arguments(num_shards: int, prefix: str, output: str) -> str:
    """Refuse a bad shard count or prefix and an existing output; returns the output's
    absolute path."""
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"--num-shards {num_shards!r}: must be an integer >= 1")
    if not prefix or os.sep in prefix or prefix.startswith("."):
        raise ValueError(f"--prefix {prefix!r}: must be a plain, non-hidden file name prefix")
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    if os.path.lexists(output):
        raise ValueError(f"--output {output}: already exists; reshard never overwrites (choose a new "
                         "directory)")
    return output


def _check_sources(sources: Sequence[str], pattern: str | None, output: str) -> list[str]:
    """The source files (:func:`analyzer.datafiles.expand_sources`); refuses one inside the
    output or one that is no uncompressed TFRecord file."""
    paths, _dups = expand_sources(list(sources), pattern=pattern, what="SRC")
    for p in paths:
        if os.path.realpath(p).startswith(os.path.realpath(output) + os.sep):
            raise ValueError(f"SRC {p}: inside --output {output}")
        if not tfrecord.looks_like_tfrecord(p):
            with open(p, "rb") as fh:
                tfrecord.check_not_compressed(fh.read(2), p)
            raise ValueError(f"SRC {p}: not an uncompressed TFRecord file (bad first record header)")
    return paths


class _TempOutput:
    """The hidden temporary directory beside the output that the shards are written into
    (``.<name>.reshard-<host>-<pid>-<random>``), guarded by a SIGKILL watchdog, with SIGTERM
    and SIGHUP turned into an exception while it exists (so that the cleanup runs). Leaving
    the ``with`` block on an exception removes it unless :meth:`publish` renamed it."""

    def __init__(self, output: str):
        self.output = output
        self.parent = os.path.dirname(output)
        self.path = ""
        self.watchdog: subprocess.Popen | None = None
        self.published = False
        self._old_handlers: dict[int, signal._HANDLER] = {}

    def __enter__(self) -> _TempOutput:
        self.path = tempfile.mkdtemp(prefix=f"{temp_prefix(self.output)}{os.getpid()}-", dir=self.parent)
        self.watchdog = _start_watchdog(self.path)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                try:
                    self._old_handlers[sig] = signal.signal(sig, _raise_exit)
                except (ValueError, OSError):  # pragma: no cover
                    pass
        return self

    def publish(self) -> None:
        """Make the directory ordinary data (mkdtemp made it 0700), sync it and rename it
        to the output, never over an existing one."""
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(self.path, 0o777 & ~mask)
        _fsync_dir(self.path)
        try:
            _rename_noreplace(self.path, self.output)
        except FileExistsError:
            raise ValueError(f"--output {self.output}: appeared while resharding; not overwritten "
                             "(the new shards were discarded)") from None
        self.published = True
        _fsync_dir(self.parent)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> None:
        try:
            if exc_type is not None and not self.published:
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            for sig, h in self._old_handlers.items():
                try:
                    signal.signal(sig, h)
                except (ValueError, OSError):  # pragma: no cover
                    pass
            _stop_watchdog(self.watchdog)


def _raise_exit(signum: int, _frame: types.FrameType | None) -> None:
    """A SIGTERM/SIGHUP handler: raise, so that the temporary directory is removed."""
    raise SystemExit(128 + signum)


@dataclass
class _Written:
    """What :func:`_write_shards` wrote: the sources' record multiset, and per shard its
    records and bytes (framing included)."""

    digest: MultisetDigest
    records: list[int]
    bytes: list[int]


def _write_shards(paths: list[str], shard_paths: list[str], verify_crc: bool, bar: _Progress,
                  on_record: Callable[[int], None] | None) -> _Written:
    """Copy every record frame of ``paths`` (in order) verbatim to the shard with the fewest
    bytes so far (ties: the lowest index), then flush and fsync the shards."""
    n = len(shard_paths)
    written = _Written(MultisetDigest(), [0] * n, [0] * n)
    B = max(n - 1, 1).bit_length()
    M = (1 << B) - 1
    heap = list(range(n))  # keys bytes << B | shard, a valid heap already
    hr = heapq.heapreplace
    buf = min(1 << 20, max(8192, (32 << 20) // n))
    n_written = 0
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "xb", buffering=buf)) for p in shard_paths]
        try:
            for p in paths:
                for frame, _off in tfrecord.iter_frames(p, verify_crc=verify_crc):
                    written.digest.add(frame[tfrecord.HEADER_BYTES:-tfrecord.FOOTER_BYTES])
                    k = heap[0]
                    i = k & M
                    files[i].write(frame)
                    size = len(frame)
                    hr(heap, k + (size << B))
                    written.records[i] += 1
                    written.bytes[i] += size
                    n_written += 1
                    bar.add(size)
                    if on_record is not None:
                        on_record(n_written)
        finally:
            bar.close()
        for fh in files:
            fh.flush()
            os.fsync(fh.fileno())
    return written


def _verify_shards(directory: str, names: list[str], written: _Written, verify_crc: bool, bar: _Progress) -> None:
    """Read every shard back: each must hold the records written to it, and together the
    same record multiset as the sources. Raises :class:`ReshardVerificationError`."""
    digest_out = MultisetDigest()
    try:
        for i, n in enumerate(names):
            count = 0
            for frame, _off in tfrecord.iter_frames(os.path.join(directory, n), verify_crc=verify_crc):
                digest_out.add(frame[tfrecord.HEADER_BYTES:-tfrecord.FOOTER_BYTES])
                count += 1
                bar.add(len(frame))
            if count != written.records[i]:
                raise ReshardVerificationError(f"{n}: {count} records read back, {written.records[i]} written")
    finally:
        bar.close()
    if digest_out != written.digest:
        raise ReshardVerificationError(f"records changed: in {written.digest!r}, out {digest_out!r}")
