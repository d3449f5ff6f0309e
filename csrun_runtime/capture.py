"""Capture mode: load a user's run.py without training (docs/CONTRACT.md).

``load_entry(run_py, argv)`` executes run.py as ``__main__`` with ``sys.argv = [run_py, *argv]``;
its call to :func:`csrun_runtime.run` records ``input_fn``, ``model_fn`` (and
``eval_input_fn``) with the params resolved from ``argv`` and returns without training; a
PyTorch run.py's call to :func:`csrun_runtime.pytorch.run` records ``train_data_fn`` (as
``input_fn``), ``model_fn`` and ``eval_data_fn`` with the params its ``default_params_fn``
completed, and ``framework == "pytorch"``. The analyzer uses it to probe the very input
function a launch would run, with nothing edited by the user.

Pure Python: TensorFlow (or torch) is imported only if run.py imports it.
"""
from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .params import ParamsError, Resolved, resolve_params, worker_params
from .registry import DEFAULT_FRAMEWORK, FRAMEWORKS

__all__ = ["CapturedRun", "CaptureError", "load_entry", "active", "record"]


class CaptureError(RuntimeError):
    """run.py could not be captured (missing file, it raised, or it never called ``run()``)."""


@dataclass
class CapturedRun:
    """What a run.py hands to the runtime.

    Attributes:
        run_py: absolute path of run.py.
        argv: its arguments (without the program name).
        input_fn: ``input_fn(params) -> tf.data.Dataset`` of ``(features, labels)`` (training);
            PyTorch: ``train_data_fn(params) -> torch.utils.data.DataLoader``.
        model_fn: ``model_fn(params) -> compiled keras.Model`` (PyTorch: ``torch.nn.Module``).
        eval_input_fn: the eval input function or ``None`` (then ``input_fn(params, mode="eval")``);
            PyTorch: ``eval_data_fn``.
        params: resolved params dict (command-line overrides applied, runconfig defaults filled;
            PyTorch: ``default_params_fn`` applied as a PyTorch task does,
            :meth:`csrun_runtime.pytorch.runner.Hooks.resolve`).
        mode: ``params["runconfig"]["mode"]``.
        warnings: params warnings (unknown/ignored keys).
        params_path: the params YAML read, or ``None``.
    """

    run_py: str
    argv: list[str]
    input_fn: Callable[..., Any]
    model_fn: Callable[..., Any]
    eval_input_fn: Callable[..., Any] | None
    params: dict[str, Any]
    mode: str
    warnings: list[str] = field(default_factory=list)
    params_path: str | None = None
    #: the backend whose ``run`` it called (:data:`csrun_runtime.registry.FRAMEWORKS`).
    framework: str = DEFAULT_FRAMEWORK

    def worker_params(self, worker_index: int = 0, num_input_workers: int = 1,
                      plan: dict[str, Any] | None = None) -> dict[str, Any]:
        """Params as input worker ``worker_index`` of ``num_input_workers`` gets them (``params.worker_params``)."""
        return worker_params(self.params, worker_index, num_input_workers, plan)


class _State:
    active: bool = False
    run_py: str | None = None
    argv: Sequence[str] = ()
    entry: CapturedRun | None = None
    loaded: dict[str, str] = {}  # module name -> run.py directory it was imported from


_STATE = _State()


def active() -> bool:
    """True while :func:`load_entry` is executing a run.py."""
    return _STATE.active


def record(input_fn: Callable[..., Any], model_fn: Callable[..., Any],
           eval_input_fn: Callable[..., Any] | None = None, *, framework: str = DEFAULT_FRAMEWORK,
           resolved: Resolved | None = None) -> CapturedRun:
    """Called by ``run()`` in capture mode: resolve params (unless the runtime passes its
    ``resolved`` params, as the PyTorch runner does after ``default_params_fn``) and store
    the entry.

    Raises:
        csrun_runtime.params.ParamsError: invalid command line or params.
        ValueError: ``framework`` not one of :data:`csrun_runtime.registry.FRAMEWORKS`.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework {framework!r}: one of {', '.join(FRAMEWORKS)}")
    if resolved is None:
        resolved = resolve_params(list(_STATE.argv), run_py=_STATE.run_py)
    entry = CapturedRun(run_py=str(_STATE.run_py), argv=list(_STATE.argv), input_fn=input_fn,
                  model_fn=model_fn, eval_input_fn=eval_input_fn, params=resolved.params,
                  mode=resolved.mode, warnings=resolved.warnings,
                  params_path=resolved.params_path, framework=framework)
    _STATE.entry = entry
    return entry


def _forget_other_dirs(here: str) -> None:
    """Drop the modules earlier captures imported from run.py directories other than ``here``
    (and those directories from ``sys.path``), so that two run.py files with a ``data.py``
    each do not collide."""
    for name, where in list(_STATE.loaded.items()):
        if where != here:
            sys.modules.pop(name, None)
            _STATE.loaded.pop(name, None)
            if where in sys.path:
                sys.path.remove(where)


def load_entry(run_py: str | os.PathLike, argv: Sequence[str] = ()) -> CapturedRun:
    """Execute ``run_py`` in capture mode and return what it passed to ``run()``.

    Args:
        run_py: path of the user's run.py.
        argv: its command line without the program name, e.g.
            ``["--params", "configs/params.yaml", "--mode", "train"]``.

    Returns:
        :class:`CapturedRun` (``.input_fn``, ``.model_fn``, ``.params``, ``.mode``, ...).

    Raises:
        CaptureError: run.py is missing, raised an exception, or did not call ``run()``.
        csrun_runtime.params.ParamsError: its command line or params are invalid.

    Side effects: run.py's directory stays on ``sys.path`` (its ``input_fn`` may import
    siblings lazily) and the modules it imported stay in ``sys.modules`` (so functions pickle
    by reference); a later ``load_entry`` of a run.py in another directory first drops the
    modules imported from earlier run.py directories, so two run.py files with a ``data.py``
    each do not collide.
    """
    path = Path(run_py).resolve()
    if not path.is_file():
        raise CaptureError(f"run.py not found: {run_py}")
    if _STATE.active:
        raise CaptureError("load_entry is not re-entrant")
    here = str(path.parent)
    _forget_other_dirs(here)
    before = set(sys.modules)
    saved_argv = sys.argv
    sys.argv = [str(path), *map(str, argv)]
    if here not in sys.path:
        sys.path.insert(0, here)
    _STATE.active, _STATE.run_py, _STATE.argv, _STATE.entry = True, str(path), list(map(str, argv)), None
    try:
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as e:
            if _STATE.entry is None:
                raise CaptureError(f"{path} exited (code {e.code}) before calling "
                                 f"csrun_runtime.run()") from None
        except (CaptureError, ParamsError):
            raise
        except Exception as e:
            raise CaptureError(f"{path} raised {type(e).__name__}: {e}") from e
        if _STATE.entry is None:
            raise CaptureError(f"{path} did not call csrun_runtime.run(input_fn=..., "
                             f"model_fn=...) under `if __name__ == \"__main__\":`")
        return _STATE.entry
    finally:
        _STATE.active = False
        sys.argv = saved_argv
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            f = getattr(mod, "__file__", None) or ""
            if f and os.path.dirname(os.path.abspath(f)) == here:
                _STATE.loaded[name] = here
