"""``run()``: what a run.py calls, and :class:`Hooks`, what the TensorFlow backend supplies to the
task's life (:mod:`csrun_runtime.lifecycle`: role, stop signals, params, the chief's rendezvous,
exit codes, the job's end): its params, its input worker (:mod:`.worker`), its chief
(:mod:`.chief`) and the meaning of its exceptions.

Importing this module does not import TensorFlow: a run.py imports the runtime first, so the
quiet-logging default below is in the environment before TensorFlow starts.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from csrun_common import exits
from csrun_common.roles import Role

from .. import lifecycle
from ..backend import Failure
from ..params import Resolved, resolve_params
from ..rankgroup import RankGroup
from ..rendezvous import Rendezvous
from . import quiet
from .chief import Chief
from .contract import Refused
from .facts import FACTS
from .ranks import RankSetupError
from .worker import InputWorker

__all__ = ["run", "Hooks"]

# Silence the C++ INFO lines of TensorFlow and the tf.data service servers (ARCHITECTURE.md),
# keeping its warnings and errors, when run.py imports csrun_runtime before TensorFlow; an
# explicit setting is kept (csrun_wse exports one to every task before Python starts).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# In a launched task, TensorFlow now, without the start-up lines no log level hides (quiet.py).
if quiet.wanted(os.environ, sys.argv[0] if sys.argv else ""):
    quiet.import_tensorflow()


class Hooks:
    """The TensorFlow backend's :class:`csrun_runtime.backend.Hooks` over a run.py's functions
    (see :func:`run`)."""

    facts = FACTS

    def __init__(self, input_fn: Callable[..., Any], model_fn: Callable[..., Any],
                 eval_input_fn: Callable[..., Any] | None = None):
        self.input_fn, self.model_fn, self.eval_input_fn = input_fn, model_fn, eval_input_fn

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]:
        """``(input_fn, model_fn, eval_input_fn)``."""
        return self.input_fn, self.model_fn, self.eval_input_fn

    def resolve(self, argv: Sequence[str], run_py: str | None) -> Resolved:
        """:func:`csrun_runtime.params.resolve_params`. Raises its ``ParamsError``."""
        return resolve_params(list(argv), run_py=run_py)

    def warnings(self, env: Mapping[str, str]) -> list[str]:
        """None: every csrun_wse feature is wired for TensorFlow."""
        return []

    def worker(self, role: Role, resolved: Resolved) -> InputWorker:
        """Input worker ``role`` serving ``input_fn`` (:class:`.worker.InputWorker`)."""
        return InputWorker(role, resolved, self.input_fn)

    def chief(self, role: Role, resolved: Resolved, rdv: Rendezvous | None, t_proc: float) -> Chief:
        """The chief (:class:`.chief.Chief`) with the job step's rendezvous ``rdv``."""
        return Chief(role, resolved, self.input_fn, self.model_fn, self.eval_input_fn, t_proc, rdv=rdv)

    def failure(self, error: BaseException, ranks: RankGroup | None) -> Failure | None:
        """A contract violation (:class:`.contract.Refused`: every violation a line) 2; several
        trainer ranks that could not be set up (:class:`.ranks.RankSetupError`) 1, in one line."""
        if isinstance(error, Refused):
            return Failure(exits.USAGE, tuple(error.problems), reason=str(error))
        if isinstance(error, RankSetupError):
            return Failure(exits.FAILED, (str(error),))
        return None


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
        exit: end the process with the exit code (default; ``os._exit`` after flushing, :mod:`csrun_runtime.task`);
            with ``exit=False`` return it.

    Returns:
        ``None`` in capture mode (:func:`csrun_runtime.capture.load_entry`: the functions and
        the resolved params are recorded, nothing runs); the exit code with ``exit=False``.

    Exit codes (:mod:`csrun_runtime.lifecycle`): 0 success; 1 runtime failure (input stalled, a
    worker's pipeline failed, no rendezvous, an exception); 2 invalid command line/params/environment
    or contract violation; 130 / 143 stopped by SIGINT / SIGTERM, 75 by ``csrun_wse --requeue``'s signal.

    The task's role comes from the environment (:func:`csrun_common.roles.resolve_role`): the
    chief trains; an input worker serves ``input_fn`` to it until the chief is done.
    """
    return lifecycle.run(Hooks(input_fn, model_fn, eval_input_fn), argv, exit)
