"""How the chief's :class:`~csrun_runtime.dataplane.Receiver` spends its cores (issue 31): how
many zmq I/O threads read the senders' connections, and whether received frames land in memory
the process already has.

Every received message is a fresh buffer that libzmq allocates with ``malloc`` and frees when
the last array over it goes. glibc serves blocks above its mmap threshold (128 KiB, rising with
use to at most 32 MiB) with a fresh ``mmap`` and returns them with ``munmap`` on free, and trims
freed memory at the top of its heaps beyond a small threshold: each such frame is then written
into pages the kernel must fault in and zero first, one fault per 4 KiB. Measured on the 2-core
host (docs/DATAPLANE.md "The receive path"): 38.5 MB image bundles take 230-260 page faults per
MB received (every page) and 0.4 GB/s through one receiver, with :func:`keep_receive_memory`
9-40 faults per MB and 0.9-1.1 GB/s; 256 KiB and 4 MiB streams 11-59 faults per MB, under 1
with it (``bench/results/ingest_recv.json``). Faulting in every page of each bundle on one zmq
I/O thread was a likely cause of the H100 host's 1.4-1.7 GB/s image receive with the chief at
1.1 cores (issue 31, item 4; that host was not lent again). On a 16-core H200 host 8 local
senders' image batches are received at 15.6-18.3 GB/s (BENCHMARKS.md "GPU feed", third run).

Those 9-40 faults per MB were with one zmq I/O thread. With the default two or more, each I/O
thread allocates from a glibc arena of its own, whose heaps are 64 MiB at most, and glibc
unmaps such a heap as soon as it is empty (``heap_trim`` in glibc's ``malloc/arena.c``): a
38.5 MB bundle, alone in its heap, came back into freshly faulted pages when the consumer
held bundles through a copy (as the device feed does): 97-116 faults per MB. A top pad of
:data:`KEEP_TOP_PAD` keeps those heaps: 0 faults per MB, the chief's CPU per MB 0.63 -> 0.33 ms
and 1.5 -> 2.5 GB/s at k = 1 on the 2-core host (``bench/results/ingest_images.json``, variants
``data plane, copied out[, no top pad]``); on the 16-core H200 host 13.8 -> 18.0 GB/s at k = 8
(``bench/results/gpu/ingest_images_h200.json``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform

from csrun_common.env import DATAPLANE_KEEP_MEMORY

log = logging.getLogger(__name__)

#: Most zmq I/O threads a receiver starts by default (:func:`auto_io_threads`): 4 on 16 cores.
IO_THREADS_MAX = 4
#: Usable cores per default zmq I/O thread (:func:`auto_io_threads`).
CORES_PER_IO_THREAD = 4
#: Freed bytes glibc keeps at the top of a heap before it returns them to the kernel, under
#: :func:`keep_receive_memory` (the chief's resident memory may stay this much above its use).
KEEP_FREED_BYTES = 512 << 20
#: Free bytes glibc keeps at the top of a heap when it trims it (``M_TOP_PAD``), under
#: :func:`keep_receive_memory`: 64 MiB, the largest heap of a thread's arena on 64-bit glibc
#: (``HEAP_MAX_SIZE``), so that an arena's emptied heap is kept for the next bundle instead of
#: being unmapped. mallopt(3): "When the heap is trimmed as a consequence of calling free(3) ...
#: this much free space is preserved at the top of the heap." Also what glibc adds to each
#: ``sbrk`` (address space; pages count as resident only once written).
KEEP_TOP_PAD = 64 << 20
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4  # glibc's mallopt parameters (malloc.h)
_kept: bool | None = None  # keep_receive_memory's outcome, once per process


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def auto_io_threads() -> int:
    """zmq I/O threads for a receiver: usable cores // CORES_PER_IO_THREAD, at least 2, at most IO_THREADS_MAX."""
    return max(2, min(IO_THREADS_MAX, usable_cores() // CORES_PER_IO_THREAD))


def keep_receive_memory(top_pad: int = KEEP_TOP_PAD) -> bool:
    """Tell this process' glibc to serve every block from its heaps (``M_MMAP_MAX`` 0: no
    ``mmap`` per large block), keep up to :data:`KEEP_FREED_BYTES` freed at the top of each
    heap (``M_TRIM_THRESHOLD``) and keep emptied heaps (``M_TOP_PAD`` ``top_pad`` bytes,
    default :data:`KEEP_TOP_PAD`; 0 leaves glibc's default, as before issue 31's second GPU
    run), so that received frames reuse pages already mapped instead of faulting in fresh ones.
    Process-wide and applied once (later calls return the first outcome); a steady stream then
    reuses the same memory, and the process keeps what it freed up to that bound. The
    environment variable :data:`csrun_common.env.DATAPLANE_KEEP_MEMORY` ``=0`` turns it off for
    the process (e.g. a chief or input worker whose other allocations fragment the heaps).
    Returns whether it applied (False: turned off, not glibc, or mallopt refused)."""
    global _kept
    if _kept is None:
        _kept = False
        if os.environ.get(DATAPLANE_KEEP_MEMORY.name, "1") != "0" and platform.libc_ver()[0] == "glibc":
            try:
                libc = ctypes.CDLL(None)
                _kept = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
                if _kept and top_pad:
                    _kept = bool(libc.mallopt(_M_TOP_PAD, int(top_pad)))
            except (OSError, AttributeError) as e:
                log.debug("data plane: glibc mallopt unavailable: %s", e)
    return _kept
