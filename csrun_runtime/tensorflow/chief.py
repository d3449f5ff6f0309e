"""The chief task: validates, compiles, trains and evaluates (also single-process mode).

With input workers the chief hosts their tf.data service dispatchers, waits for them in the
rendezvous and trains on the merge of their streams (:class:`csrun_runtime.tensorflow.service.ServiceSource`);
without, it iterates the pipeline itself. Evaluation always runs on the chief, in-process, so
held-out data is read exactly once. Modes and artifacts: csrun_runtime/README.md.

Its life around the mode (the rendezvous, exit codes, the job's end) is the core's
(:mod:`csrun_runtime.lifecycle`, through :class:`csrun_runtime.tensorflow.runner.Hooks`): the chief
runs the mode (:meth:`Chief.run_mode`). It orchestrates; the parts are apart: the input side in
:mod:`csrun_runtime.tensorflow.chief_streams`, evaluation in :mod:`csrun_runtime.tensorflow.evaluation`, the modes
that train nothing in :mod:`csrun_runtime.tensorflow.chief_modes`, the training loop in
:mod:`csrun_runtime.tensorflow.training`.

TensorFlow and Keras are imported inside the methods (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.autoscale import AutoscaleSpec
from csrun_common.autoscale import parse_env as parse_autoscale
from csrun_common.modes import TRAIN_MODES
from csrun_common.roles import Role

from .. import chief_input, preemption
from ..artifacts import write_params_yaml
from ..params import ParamsError, Resolved, load_shard_plan
from ..rendezvous import Rendezvous
from . import chief_model, chief_modes
from .chief_streams import ChiefStreams
from .contract import Refused, check_model
from .evaluation import Evaluator
from .ranks import RANKS_NO_XLA, TFRanks
from .steps import TrainSteps
from .training import LoopContext, training_loop

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import keras
    import tensorflow as tf

__all__ = ["Chief", "Refused"]

log = logging.getLogger("csrun.runtime")


class Chief:
    """The chief task (also single-process mode): validates, compiles or trains on the
    merged stream of the input workers (or the in-process pipeline when there are none).

    :meth:`run_mode` returns the exit code; what it raises is mapped by the lifecycle (module
    docstring). :mod:`analyzer.verify_task` reuses it for the rendezvous (:meth:`wait_workers`) without
    training. The input side is :attr:`streams` (:class:`csrun_runtime.tensorflow.chief_streams.ChiefStreams`),
    evaluation :attr:`evaluator` (:class:`csrun_runtime.tensorflow.evaluation.Evaluator`); the chief's
    attributes and methods of the same names delegate to them.
    """

    def __init__(self, role: Role, resolved: Resolved, input_fn: Callable[..., Any],
                 model_fn: Callable[..., Any], eval_input_fn: Callable[..., Any] | None, t_proc: float,
                 rdv: Rendezvous | None = None):
        self.role, self.resolved = role, resolved
        self.params = resolved.params
        self.rc = self.params["runconfig"]
        self.mode = resolved.mode
        self.input_fn, self.model_fn, self.eval_input_fn = input_fn, model_fn, eval_input_fn
        self.t_proc = t_proc
        self.model_dir = Path(self.rc["model_dir"])
        self.num_input_workers = role.num_input_workers
        self.jit_note = ""
        self.ranks: TFRanks | None = None  # several trainer ranks (training modes): their strategy
        self._build: Callable[[], Any] = lambda: None  # the model's build (_build_model), for rank 0's eval copy
        self.streams = ChiefStreams(role, self.params, self.mode, input_fn)
        self.streams.rdv = rdv
        self.evaluator = Evaluator(input_fn, eval_input_fn, self.params, self.model_dir)
        #: what performance.json reports of the input path: ``input_bundle`` (setting, batch
        #: bytes, batches per element by worker), ``workers_registered_secs`` (the streams' dict)
        self.ingest_info: dict[str, Any] = self.streams.ingest_info

    # ------------------------------------------------------------------ the streams' state
    @property
    def rdv(self) -> Rendezvous | None:
        """The job step's rendezvous (with input workers; set by :meth:`run` or from outside)."""
        return self.streams.rdv

    @rdv.setter
    def rdv(self, value: Rendezvous | None) -> None:
        self.streams.rdv = value

    @property
    def plan(self) -> dict[str, Any] | None:
        """The shard plan (``CSRUN_SHARD_PLAN``), or None."""
        return self.streams.plan

    @plan.setter
    def plan(self, value: dict[str, Any] | None) -> None:
        self.streams.plan = value

    @property
    def autoscale(self) -> AutoscaleSpec | None:
        """``csrun_wse --autoscale`` (docs/AUTOSCALE.md), set by ``_run_mode`` from CSRUN_AUTOSCALE."""
        return self.streams.autoscale

    @property
    def chief_input(self) -> chief_input.ChiefInputWorker | None:
        """Input worker 0 in this task (:mod:`csrun_runtime.chief_input`) once started, else None."""
        return self.streams.chief_input

    @property
    def rendezvous(self) -> Rendezvous:
        """The job step's rendezvous; only a chief with input workers has one."""
        return self.streams.rendezvous

    def place_chief_input(self) -> None:
        """:meth:`csrun_runtime.tensorflow.chief_streams.ChiefStreams.place_chief_input`."""
        self.streams.place_chief_input()

    def start_chief_input(self) -> None:
        """:meth:`csrun_runtime.tensorflow.chief_streams.ChiefStreams.start_chief_input`."""
        self.streams.start_chief_input()

    def wait_workers(self) -> dict[int, dict[str, Any]]:
        """:meth:`csrun_runtime.tensorflow.chief_streams.ChiefStreams.wait_workers`."""
        return self.streams.wait_workers()

    def _check_train_input(self) -> tuple[Any, Any, int]:
        return self.streams.check_train_input()

    # ------------------------------------------------------------------ the lifecycle's (csrun_runtime.lifecycle)
    def close(self) -> None:
        """Once the job is marked done: close the chief's own input worker and the shard-plan views."""
        self.streams.close()

    def missing_reports(self) -> int:
        """1 when :mod:`csrun_runtime.chief_input` asked for input worker 0 in this task and it never
        started (a mode that streams nothing), else 0: it will write no report."""
        try:
            asked = chief_input.requested(os.environ)
        except ValueError:
            asked = 0
        return 1 if asked and self.chief_input is None else 0

    def run_mode(self) -> int:
        """Run ``runconfig.mode`` (validate_only, compile_only, train, eval, train_and_eval);
        returns 0 or a stop's exit code (:func:`csrun_runtime.preemption.exit_code`). Raises
        ``ParamsError``, :class:`.contract.Refused` and runtime failures: the lifecycle's ladder
        maps them to exit codes."""
        if self.role.world_size > 1 and self.mode in TRAIN_MODES:  # before any TF op: it enables the collectives
            self.ranks = TFRanks(self.role, self.rc)
        if self.num_input_workers:
            try:
                self.streams.autoscale = parse_autoscale(os.environ, self.num_input_workers)
            except ValueError as e:
                raise ParamsError(str(e)) from None
            if self.mode in TRAIN_MODES:
                self.place_chief_input()
        if self.role.shard_plan:
            self.plan = load_shard_plan(self.role.shard_plan, max(1, self.role.num_streamers))  # job-wide W
        log.info("Checkpoints and summaries will be saved in: %s", self.model_dir)
        log.info("mode %s; %s", self.mode, self.role.describe())
        if self.mode == "validate_only":
            return chief_modes.validate_only(self.input_fn, self.model_fn, self.params, self.eval_input_fn,
                                             self.plan, self.role.num_streamers, self.model_dir)
        if self.mode == "compile_only":
            return self._compile_only()
        return self._train_eval()

    # ------------------------------------------------------------------ the model
    def _build_model(self, spec: Any) -> Any:
        """:func:`csrun_runtime.tensorflow.chief_model.build_model` with the chief's ``model_fn``;
        under the strategy's scope with several trainer ranks (its variables mirrored)."""
        self._build = functools.partial(chief_model.build_model, self.model_fn, self.params, spec)
        return self._build() if self.ranks is None else self.ranks.build(self._build)

    def _apply_jit(self, model) -> None:
        setting = self.rc.get("jit_compile", "auto")
        want = setting in ("auto", True) and self.ranks is None
        model.jit_compile = want
        model.train_function = None
        model.test_function = None
        self.jit_note = RANKS_NO_XLA if self.ranks is not None and setting in ("auto", True) else ""
        if want and not model.jit_compile:
            self.jit_note = "Keras reports that this model does not support XLA"
            log.info("XLA: %s; running the train step without XLA", self.jit_note)

    def train_steps(self, model: keras.Model, step_var: tf.Variable | None = None) -> TrainSteps:
        """The chief's several-steps-per-call train function for ``model``; with
        ``runconfig.jit_compile: auto`` an XLA compile failure on the first call is logged
        (``xla_note``) and training goes on without XLA (:class:`csrun_runtime.tensorflow.steps.TrainSteps`).
        ``step_var``: the global step variable, advanced inside each call."""

        def fell_back(e: BaseException) -> None:
            self.jit_note = f"XLA compile failed: {type(e).__name__}: {str(e).strip()[:300]}"
            log.warning("%s; falling back to the train step without XLA", self.jit_note)
            model.train_function = None
            model.test_function = None

        return TrainSteps(model, fell_back, allow_fallback=self.rc.get("jit_compile", "auto") == "auto",
                          counter=step_var, strategy=self.ranks.strategy if self.ranks is not None else None)

    def _checkpointing(self, model: Any) -> tuple[Any, Any, Any, str | None]:
        """:func:`csrun_runtime.tensorflow.chief_model.checkpointing` in the chief's ``model_dir``."""
        return chief_model.checkpointing(model, self.model_dir, self.rc)

    def save(self, mgr: tf.train.CheckpointManager, step: int) -> None:
        """Write checkpoint ``model-ckpt-<step>`` (the core's loop calls it on rank 0 alone)."""
        log.info("Saving checkpoint at global step %d", step)
        mgr.save(checkpoint_number=step)


    def evaluate(self, model: keras.Model, step: int) -> dict[str, float]:
        """Evaluate ``model`` at global ``step`` (:meth:`.evaluation.Evaluator.evaluate`); returns the metrics. With
        several ranks rank 0 alone calls it, on an undistributed copy (:meth:`.ranks.TFRanks.eval_model`)."""
        if self.ranks is not None:
            model = self.ranks.eval_model(self._build, model)
        return self.evaluator.evaluate(model, step)

    # ------------------------------------------------------------------ modes
    def _compile_only(self) -> int:
        _, spec, batch_size = self._check_train_input()
        mrep, _ = check_model(self.model_fn, self.params, spec)
        if not mrep.ok:
            raise Refused(mrep.violations)
        model = self._build_model(spec)
        self._apply_jit(model)
        timing = chief_modes.time_steps(model, spec, self.rc, self.train_steps)
        chief_modes.compile_report(model, spec, batch_size, timing, self.rc, self.model_dir, self.jit_note)
        return 0

    def _train_eval(self) -> int:
        training = self.mode in TRAIN_MODES
        evaluating = self.mode in ("eval", "train_and_eval")
        ds = spec = batch_size = None
        if training:
            ds, spec, batch_size = self._check_train_input()
        if evaluating:
            eds = self.evaluator.dataset()
            if spec is None:
                spec = eds.element_spec
        addresses = self.streams.start_dispatchers() if training and self.num_input_workers > 0 else []
        if addresses:
            self.start_chief_input()
        model = self._build_model(spec)
        self._apply_jit(model)
        step_var, ckpt, mgr, restored = self._checkpointing(model)
        if not training:
            if restored is None:
                raise ParamsError(f"mode eval needs a checkpoint: none in {self.model_dir} "
                                  f"and no runconfig.checkpoint_path / --checkpoint_path")
            write_params_yaml(self.model_dir, self.params, "eval")
            self.evaluate(model, int(step_var.numpy()))
            self.evaluator.verdict()
            return 0
        if self.role.is_rank_zero:
            write_params_yaml(self.model_dir, self.params, "train")
        source = self.streams.training_source(ds, addresses, start=int(step_var.numpy()))
        assert batch_size is not None  # the training input's contract fixes it
        training_loop(self.loop_context(), model, step_var, mgr, source, batch_size, evaluating).run()
        return preemption.exit_code()  # 75 after --requeue's signal, 130/143 after Ctrl-C/SIGTERM, else 0

    def loop_context(self) -> LoopContext:
        """What :func:`csrun_runtime.tensorflow.training.training_loop` takes from the chief: values, and
        :meth:`save`, :meth:`evaluate`, :meth:`train_steps` and the XLA note as callables."""
        s = self.streams
        return LoopContext(
            rc=self.rc, model_dir=self.model_dir, mode=self.mode, t_proc=self.t_proc, node=self.role.node,
            num_input_workers=self.num_input_workers, params_path=self.resolved.params_path, save=self.save,
            evaluate=self.evaluate, train_steps=self.train_steps, jit_note=lambda: self.jit_note,
            ingest_info=self.ingest_info, rdv=self.rdv, autoscale=s.autoscale, addresses=s.addresses,
            registry=s.registry, ranks=self.ranks)
