"""``run()`` for PyTorch: resolve the task's role (:func:`csrun_common.roles.resolve_role`, the
same ``CSRUN_*`` variables as TensorFlow's runtime) and params (:mod:`csrun_runtime.params`),
then run the chief (:mod:`.chief`: also the single process of ``python run.py``) or an input
worker (:mod:`.worker`). Imports neither TensorFlow nor anything that does.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from csrun_common import exits
from csrun_common.roles import RoleError

from .. import capture, preemption
from ..params import Resolved, resolve_params
from ..task import begin, flush_exit, process_start_time, resolve_logged

__all__ = ["run", "main", "resolve"]

log = logging.getLogger("csrun.runtime")

# csrun_wse --requeue: catch its signals now, when run.py imports this package, before torch and
# the data modules load (seconds), as the TensorFlow runtime does (csrun_runtime/preemption.py).
preemption.install_from_env()


def _merge_defaults(defaults: Mapping[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """``params`` over ``defaults`` (section by section, one level deep): the YAML wins."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in defaults.items()}
    for k, v in params.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


#: csrun_wse features whose variables reach a PyTorch task but that its runtime does not act on
#: yet (docs/PYTORCH.md "Not yet for PyTorch"): variable -> flag. None at present (--autoscale
#: and --survive-node-loss are wired); kept so that the next such flag is warned about.
NOT_WIRED: dict[str, str] = {}


def not_wired(environ: Mapping[str, str]) -> list[str]:
    """One warning per csrun_wse feature in ``environ`` that the PyTorch runtime ignores (pure)."""
    out = []
    for var, flag in NOT_WIRED.items():
        value = (environ.get(var) or "").strip()
        if value and value != "0":
            out.append(f"csrun_wse {flag} ({var}={value}) is not wired for PyTorch yet: ignored "
                       f"(docs/PYTORCH.md \"Not yet for PyTorch\")")
    return out


def run(model_fn: Callable[..., Any], train_data_fn: Callable[..., Any],
        eval_data_fn: Callable[..., Any] | None = None,
        default_params_fn: Callable[[dict[str, Any]], Any] | None = None, *,
        argv: Sequence[str] | None = None, exit: bool = True) -> int:
    """Run a PyTorch model the Model Zoo R1.6.1 way; the one call a run.py makes (docs/PYTORCH.md).

    Args:
        model_fn: ``model_fn(params) -> torch.nn.Module`` whose ``forward(batch)`` returns the
            loss (a scalar tensor or ``{"loss": ...}``); optional ``configure_optimizer(params)``
            and ``eval_metrics(batch) -> {name: number}`` (:mod:`.contract`).
        train_data_fn: ``train_data_fn(params) -> torch.utils.data.DataLoader`` built from
            ``params["train_input"]``, sharded with :func:`num_streamers` /
            :func:`get_streaming_rank` (e.g. ``DistributedSampler``).
        eval_data_fn: the same for ``params["eval_input"]`` (eval on the chief, in-process).
        default_params_fn: ``default_params_fn(params)`` fills defaults: it may change ``params``
            in place or return a dict of sections that the YAML's values override.
        argv: the command line (default ``sys.argv[1:]``; the Model Zoo's, :mod:`csrun_runtime.params`).
        exit: leave the process with the exit code (``os._exit`` after flushing, so that
            DataLoader worker processes and zmq threads cannot hold the exit); else return it.

    Capture mode (:func:`csrun_runtime.capture.load_entry`, the analyzer's): records the four
    functions' results that matter — ``train_data_fn``, ``model_fn``, ``eval_data_fn`` and the
    params ``default_params_fn`` completed (:func:`resolve`) — with ``framework="pytorch"`` and
    returns 0 without training, exiting or importing torch.

    Returns the exit code with ``exit=False``: 0 success; 1 runtime failure; 2 invalid command
    line, params or environment, or a contract violation; 130 / 143 stopped by SIGINT / SIGTERM,
    75 stopped by one of ``csrun_wse --requeue``'s signals (after saving a checkpoint when it was
    training; :mod:`csrun_runtime.preemption`).
    """
    if capture.active():
        args = list(sys.argv[1:] if argv is None else argv)
        resolved = resolve(args, sys.argv[0] if sys.argv and sys.argv[0] else None, default_params_fn)
        capture.record(train_data_fn, model_fn, eval_data_fn, framework="pytorch", resolved=resolved)
        return 0
    code = main(model_fn, train_data_fn, eval_data_fn, default_params_fn, argv=argv)
    if exit:
        flush_exit(code)
    return code


def resolve(argv: Sequence[str], run_py: str | None,
            default_params_fn: Callable[[dict[str, Any]], Any] | None) -> Resolved:
    """The params of a PyTorch run: :func:`csrun_runtime.params.resolve_params` of ``argv``,
    then ``default_params_fn(params)`` (it may change them in place or return sections the
    YAML's values override: :func:`_merge_defaults`).

    Raises:
        csrun_runtime.params.ParamsError: invalid command line or params.
    """
    resolved = resolve_params(list(argv), run_py=run_py)
    if default_params_fn is not None:
        got = default_params_fn(resolved.params)
        if isinstance(got, Mapping):
            resolved.params = _merge_defaults(got, resolved.params)
    return resolved


def main(model_fn: Callable[..., Any], train_data_fn: Callable[..., Any],
         eval_data_fn: Callable[..., Any] | None = None,
         default_params_fn: Callable[[dict[str, Any]], Any] | None = None, *,
         argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Resolve role and params, then run the task; returns the exit code (see :func:`run`)."""
    t_proc = process_start_time()
    argv = list(sys.argv[1:] if argv is None else argv)
    run_py = sys.argv[0] if sys.argv and sys.argv[0] else None
    try:
        role, prefix = begin(env)
    except RoleError as e:
        log.error("environment: %s", e)
        return 2
    # csrun_wse --requeue's signals, Ctrl-C and SIGTERM: recorded, a checkpoint at the step reached
    # (csrun_runtime.preemption, the TensorFlow runtime's; framework-neutral)
    preemption.install_from_env(env)
    preemption.set_label(prefix, role.is_chief)
    preemption.install_interrupts()
    resolved = resolve_logged(lambda: resolve(argv, run_py, default_params_fn), prefix, role.is_chief,
                              not_wired(os.environ if env is None else env))
    if resolved is None:
        return 2
    try:
        if role.kind == "worker":
            from .worker import InputWorker

            with preemption.deferred():  # a signal is only recorded: the worker streams until done.json
                return InputWorker(role, resolved, train_data_fn).run()
        from .chief import Chief

        return Chief(role, resolved, model_fn, train_data_fn, eval_data_fn, t_proc).run()
    except preemption.Interrupted as e:
        log.info("stopped by %s", e.signal)
        return e.code if role.is_chief else 0
    except KeyboardInterrupt:
        log.info("stopped by SIGINT")
        return exits.INTERRUPTED if role.is_chief else 0
    except Exception:  # noqa: BLE001 - a runtime failure: logged with its traceback, exit 1
        log.exception("%s failed", "the chief" if role.is_chief else "input worker")
        return 1
