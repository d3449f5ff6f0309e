"""``run()`` for PyTorch, and :class:`Hooks`, what this backend supplies to the task's life
(:mod:`csrun_runtime.lifecycle`: the role from the same ``CSRUN_*`` variables as TensorFlow's, stop
signals, the chief's rendezvous, exit codes): its params (``default_params_fn`` applied), its
input worker (:mod:`.worker`), its chief (:mod:`.chief`: also the single process of ``python
run.py``) and the meaning of its exceptions. Imports neither TensorFlow nor anything that does.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from csrun_common import exits
from csrun_common.roles import Role

from .. import lifecycle, workernames
from ..backend import Failure, Task
from ..params import Resolved, resolve_params
from ..rankgroup import RankGroup
from ..rendezvous import Rendezvous
from .facts import FACTS

if TYPE_CHECKING:
    from .chief import Chief

__all__ = ["run", "Hooks", "resolve"]


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
        exit: leave the process with the exit code (``os._exit`` after flushing, :mod:`csrun_runtime.task`);
            else return it.

    Capture mode (:func:`csrun_runtime.capture.load_entry`, the analyzer's): records the four
    functions' results that matter — ``train_data_fn``, ``model_fn``, ``eval_data_fn`` and the
    params ``default_params_fn`` completed (:func:`resolve`) — with ``framework="pytorch"`` and
    returns 0 without training, exiting or importing torch.

    Returns the exit code with ``exit=False``: 0 success; 1 runtime failure; 2 invalid command
    line, params or environment, or a contract violation; 130 / 143 stopped by SIGINT / SIGTERM,
    75 stopped by one of ``csrun_wse --requeue``'s signals (after saving a checkpoint when it was
    training; :mod:`csrun_runtime.preemption`).
    """
    code = lifecycle.run(Hooks(model_fn, train_data_fn, eval_data_fn, default_params_fn), argv, exit)
    return 0 if code is None else code  # capture mode: 0


def resolve(argv: Sequence[str], run_py: str | None,
            default_params_fn: Callable[[dict[str, Any]], Any] | None) -> Resolved:
    """The params of a PyTorch run: :func:`csrun_runtime.params.resolve_params` of ``argv``, then
    ``default_params_fn(params)``, which may change them in place or return sections the YAML's values
    override (:func:`_merge_defaults`). Raises :class:`csrun_runtime.params.ParamsError`."""
    resolved = resolve_params(list(argv), run_py=run_py)
    if default_params_fn is not None:
        got = default_params_fn(resolved.params)
        if isinstance(got, Mapping):
            resolved.params = _merge_defaults(got, resolved.params)
    return resolved


class Hooks:
    """The PyTorch backend's :class:`csrun_runtime.backend.Hooks` over a run.py's functions (see
    :func:`run`)."""

    facts = FACTS

    def __init__(self, model_fn: Callable[..., Any], train_data_fn: Callable[..., Any],
                 eval_data_fn: Callable[..., Any] | None = None,
                 default_params_fn: Callable[[dict[str, Any]], Any] | None = None):
        self.model_fn, self.train_data_fn, self.eval_data_fn = model_fn, train_data_fn, eval_data_fn
        self.default_params_fn = default_params_fn

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]:
        """``(train_data_fn, model_fn, eval_data_fn)``: the capture record's input, model and eval functions."""
        return self.train_data_fn, self.model_fn, self.eval_data_fn

    def resolve(self, argv: Sequence[str], run_py: str | None) -> Resolved:
        """:func:`resolve` with ``default_params_fn``. Raises ``ParamsError``."""
        return resolve(argv, run_py, self.default_params_fn)

    def warnings(self, env: Mapping[str, str]) -> list[str]:
        """:func:`not_wired`."""
        return not_wired(env)

    def worker(self, role: Role, resolved: Resolved) -> Task:
        """Input worker ``role`` streaming ``train_data_fn``'s DataLoader (:class:`.worker.InputWorker`)."""
        from .worker import InputWorker

        return InputWorker(role, resolved, self.train_data_fn)

    def chief(self, role: Role, resolved: Resolved, rdv: Rendezvous | None, t_proc: float) -> Chief:
        """The chief (:class:`.chief.Chief`) with the job step's rendezvous ``rdv``."""
        from .chief import Chief

        return Chief(role, resolved, self.model_fn, self.train_data_fn, self.eval_data_fn, t_proc, rdv=rdv)

    def failure(self, error: BaseException, ranks: RankGroup | None) -> Failure | None:
        """A contract violation (:class:`.contract.ContractError`, an unusable checkpoint, an input
        worker's violations, each a line) 2; a trainer rank that died in DDP's all-reduce 1, in
        one line (:func:`.ranks.collective_failure`)."""
        from .checkpoint import CheckpointError
        from .contract import ContractError
        from .ranks import TorchRanks, collective_failure
        from .remote import WorkerFailed

        if isinstance(error, ContractError | CheckpointError):
            return Failure(exits.USAGE, (str(error),))
        if isinstance(error, WorkerFailed):
            return Failure(exits.USAGE, tuple(f"{workernames.name(error.index)}: {v}" for v in error.violations))
        lost = collective_failure(ranks, error) if isinstance(ranks, TorchRanks) else None
        return None if lost is None else Failure(exits.FAILED, (str(lost),))
