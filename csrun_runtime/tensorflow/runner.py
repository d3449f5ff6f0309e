"""``run()``: what a run.py calls. Resolves the task's role from the environment
(:mod:`csrun_common.roles`) and the command line and params, then runs the chief
(:mod:`csrun_runtime.tensorflow.chief`) or the input-worker task (:mod:`csrun_runtime.tensorflow.worker`).

Importing this module does not import TensorFlow: a run.py imports the runtime first, so the
quiet-logging default below is in the environment before TensorFlow starts.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from csrun_common.roles import RoleError

from .. import capture, preemption
from ..params import resolve_params
from ..task import begin, flush_exit, process_start_time, resolve_logged, setup_logging
from . import quiet
from .chief import Chief
from .worker import run_worker

__all__ = ["run", "main", "setup_logging"]

log = logging.getLogger("csrun.runtime")

# Silence the C++ INFO lines of TensorFlow and the tf.data service servers (ARCHITECTURE.md),
# keeping its warnings and errors, when run.py imports csrun_runtime before TensorFlow; an
# explicit setting is kept (csrun_wse exports one to every task before Python starts).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# csrun_wse --requeue: catch the stop signals now, before TensorFlow loads (preemption.py).
preemption.install_from_env()
# In a launched task, TensorFlow now, without the start-up lines no log level hides (quiet.py).
if quiet.wanted(os.environ, sys.argv[0] if sys.argv else ""):
    quiet.import_tensorflow()


def run(input_fn: Callable[..., Any], model_fn: Callable[..., Any],
        eval_input_fn: Callable[..., Any] | None = None, *,
        argv: Sequence[str] | None = None, exit: bool = True) -> int | None:
    """Run a model the Model Zoo way; the one call a run.py makes (docs/CONTRACT.md).

    Args:
        input_fn: ``input_fn(params) -> tf.data.Dataset`` of ``(features, labels)``, training
            input (contract: :mod:`csrun_runtime.tensorflow.contract`, the Cerebras document "Limitations
            of the CerebrasEstimator").
        model_fn: ``model_fn(params) -> keras.Model``, compiled (optimizer, loss, metrics).
        eval_input_fn: ``eval_input_fn(params) -> tf.data.Dataset`` for evaluation; when
            ``None``, ``input_fn(params, mode="eval")`` is used if input_fn takes ``mode``.
        argv: the command line (default ``sys.argv[1:]``), see :mod:`csrun_runtime.params`.
        exit: end the process with the exit code (default). The process leaves with
            ``os._exit`` after flushing: tf.data service threads and iterators must not block
            the exit (ARCHITECTURE.md). With ``exit=False`` the code is returned instead.

    Returns:
        ``None`` in capture mode (:func:`csrun_runtime.capture.load_entry`: the functions and
        the resolved params are recorded, nothing runs); the exit code with ``exit=False``.

    Exit codes: 0 success; 1 runtime failure (input stalled, a worker's pipeline failed, no
    rendezvous, an exception); 2 invalid command line/params/environment or contract violation.

    The task's role comes from the environment (:func:`csrun_common.roles.resolve_role`):
    the chief trains (hosting the tf.data service dispatchers when there are input workers);
    an input worker serves ``input_fn`` through a tf.data service worker until the chief is done.
    """
    if capture.active():
        capture.record(input_fn, model_fn, eval_input_fn)
        return None
    code = main(input_fn, model_fn, eval_input_fn, argv=argv)
    if exit:
        flush_exit(code)
    return code


def main(input_fn: Callable[..., Any], model_fn: Callable[..., Any],
         eval_input_fn: Callable[..., Any] | None = None,
         argv: Sequence[str] | None = None,
         env: Mapping[str, str] | None = None) -> int:
    """Resolve role and params, then run the task; returns the exit code (see :func:`run`)."""
    t_proc = process_start_time()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    run_py = sys.argv[0] if sys.argv and sys.argv[0] else None
    try:
        role, prefix = begin(env)
    except RoleError as e:
        log.error("environment: %s", e)
        return 2
    preemption.set_label(prefix, role.is_chief)
    preemption.install_interrupts()  # Ctrl-C / SIGTERM: a clean stop, no traceback (preemption.py)
    try:
        return _main(role, input_fn, model_fn, eval_input_fn, argv, run_py, prefix, t_proc)
    except preemption.Interrupted as e:  # outside training and serving: stop where it is
        log.info("stopped by %s %s", e.signal, "outside the training loop: no step trained since, nothing more saved"
                 if role.is_chief else "before serving")
        return e.code if role.is_chief else 0


def _main(role: Any, input_fn: Callable[..., Any], model_fn: Callable[..., Any],
          eval_input_fn: Callable[..., Any] | None, argv: list[str], run_py: str | None, prefix: str,
          t_proc: float) -> int:
    resolved = resolve_logged(lambda: resolve_params(argv, run_py=run_py), prefix, role.is_chief)
    if resolved is None:
        return 2
    if role.kind == "worker":
        try:  # a signal is only recorded: the worker serves until the chief's done.json
            with preemption.deferred():
                return run_worker(role, resolved, input_fn)
        except Exception:  # noqa: BLE001
            log.exception("input worker failed")
            return 1
    return Chief(role, resolved, input_fn, model_fn, eval_input_fn, t_proc).run()
