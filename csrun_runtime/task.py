"""A task's start and end, the same for every framework's task (:mod:`csrun_runtime.lifecycle`)
and the analyzer's drain tasks (``analyzer/verify_task.py``,
``csrun_runtime/pytorch/drain.py``): the process's start time, the role and its log prefix, the
``LEVEL:csrun:<prefix><message>`` log lines on stderr, and a flushed ``os._exit``.

Framework-neutral: imports neither TensorFlow nor torch.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NoReturn

import psutil

from csrun_common.roles import Role, resolve_role

from . import workernames

if TYPE_CHECKING:
    from .params import Resolved

__all__ = ["log", "process_start_time", "setup_logging", "log_prefix", "begin", "resolve_logged", "flush_exit"]

#: The runtime's logger (``csrun.runtime``): every runtime module logs through it.
log = logging.getLogger("csrun.runtime")


def process_start_time() -> float:
    """This process's start, seconds since the epoch (psutil; ``time.time()`` when psutil
    cannot tell): the verdict's and the drain's start-up times count from it."""
    try:
        return float(psutil.Process(os.getpid()).create_time())
    except Exception:  # noqa: BLE001 - psutil.Error or an OS without the field
        return time.time()


def setup_logging(prefix: str = "", level: str = "INFO") -> None:
    """Log to stderr as ``LEVEL:csrun:<prefix><message>`` (the message bodies of the Cerebras
    document "Weight Streaming Quickstart"); ``level`` a :mod:`logging` level name
    (``runconfig.logging``; an unknown name means INFO)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(levelname)s:csrun:{prefix}%(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(getattr(logging, level, logging.INFO))


def log_prefix(role: Role) -> str:
    """``""`` for the chief (rank 0 of several trainer ranks), ``"[rank <r> <node>] "`` for
    another trainer rank, ``"[worker <g> <node>] "`` for an input worker (``g`` its job-wide
    index): what its lines start with."""
    if role.is_chief:
        return f"[rank {role.rank} {role.node}] " if role.rank else ""
    return f"[worker {role.streamer_index} {role.node}] "


def begin(env: Mapping[str, str] | None = None) -> tuple[Role, str]:
    """The task's role from ``env`` (default ``os.environ``; :func:`csrun_common.roles.resolve_role`)
    and its log prefix, logging set up with it. Raises :class:`csrun_common.roles.RoleError`
    (the contract's variables are wrong) after setting up logging without a prefix."""
    try:
        role = resolve_role(env)
    except Exception:
        setup_logging()
        raise
    prefix = log_prefix(role)
    setup_logging(prefix)
    workernames.set_rank(role.rank, role.world_size)  # input workers named job-wide in every message
    return role, prefix


def resolve_logged(resolve: Callable[[], Resolved], prefix: str, is_chief: bool,
                   warnings: Iterable[str] = ()) -> Resolved | None:
    """The run's params from ``resolve()`` (:func:`csrun_runtime.params.resolve_params` or a
    framework's variant), then logging at ``runconfig.logging`` with ``prefix``; the chief logs
    the params' warnings and ``warnings``. Returns ``None`` after logging each problem of a
    :class:`csrun_runtime.params.ParamsError` (the caller exits 2)."""
    from .params import ParamsError

    try:
        resolved = resolve()
    except ParamsError as e:
        for p in e.problems:
            log.error("%s", p)
        return None
    setup_logging(prefix, resolved.params["runconfig"]["logging"])
    if is_chief:
        for w in [*resolved.warnings, *warnings]:
            log.warning("%s", w)
    return resolved


def flush_exit(code: int) -> NoReturn:
    """Flush the log handlers, stdout and stderr, then ``os._exit(code)``: tf.data service threads,
    DataLoader worker processes and zmq threads cannot hold the exit."""
    for h in log.handlers:
        try:
            h.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
