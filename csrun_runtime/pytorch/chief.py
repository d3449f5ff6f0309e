"""The PyTorch chief: trains, evaluates, validates or compiles a run.py's ``nn.Module``
(docs/PYTORCH.md), with its training batches from its own DataLoader (no input workers:
``python run.py``, or a job without any) or from the input workers over the data plane
(:class:`.remote.RemoteSource`: one zmq ROUTER whose endpoint is published in the rendezvous
directory as ``endpoints.json``; lost and replaced workers, adoptions under ``csrun_wse
--survive-node-loss``; under ``csrun_wse --autoscale`` the training loop's
:class:`csrun_runtime.autoscale.Autoscaler` opens and pauses the workers' streams,
docs/AUTOSCALE.md).

model_dir artifacts, as the TensorFlow chief's (csrun_runtime/artifacts.py): checkpoints
``model-ckpt-<step>.pt`` (:mod:`.checkpoint`), TensorBoard events (``loss``,
``samples_per_sec``, ``input_wait_fraction``; eval under ``eval/``; :mod:`.events`),
``performance/performance.json`` (:func:`csrun_runtime.artifacts.performance_record` and the
verdict), ``train/params_train.yaml`` / ``eval/params_eval.yaml``, ``eval/results.json``,
``validate_report.txt``, ``compile_report.txt`` / ``compile_report.json``.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from csrun_common.roles import Role

from .. import preemption
from ..artifacts import write_params_yaml
from ..loop import LoopSetup, TrainingDriver
from ..params import Resolved, load_shard_plan, training_target
from ..position import say_in_process_restart
from ..rankgroup import LoopRanks
from ..rendezvous import Rendezvous
from . import checkpoint
from .contract import (
    ContractError,
    build_lr_scheduler,
    build_optimizer,
    call_data_fn,
    check_module,
    epochs,
    loss_of,
    process_params,
    seed_process,
    to_torch,
    torch_seed,
)
from .devicefeed import DEVICE_PREFETCH, DeviceFeed
from .evaluation import Evaluator
from .own_input import OwnInput
from .ranks import TorchRanks, rank_device
from .remote import RemoteSource, autoscale_spec
from .report import compile_report, validate_report
from .streamers import StreamerFacts, set_facts
from .training import TorchStepBackend

__all__ = ["Chief"]

log = logging.getLogger("csrun.runtime")

#: validate_only's file-coverage check reads each of its three DataLoaders for at most this long
#: (seconds); the analyzer's check process allows a whole pass of 60 s.
VALIDATE_COVERAGE_SECS = 10.0


class _LocalSource:
    """The chief's own training DataLoader (streamer 0 of 1)."""

    def __init__(self, loader: Any):
        self.it = epochs(loader)
        self.n = 0

    def next(self) -> tuple[Any, str]:
        self.n += 1
        return next(self.it), "in-process"

    def poll(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"batches_per_worker": {"in-process": self.n}, "input": "in-process DataLoader"}

    def close(self) -> None:
        pass


class Chief:
    """The chief (or the single process) of a PyTorch run: :meth:`run_mode` runs the mode; its
    life around it (the rendezvous, exit codes, the job's end) is :mod:`csrun_runtime.lifecycle`'s,
    through :class:`.runner.Hooks` (exit codes: 0 success; 1 runtime failure; 2 a contract
    violation, the chief's own or an input worker's, or unusable params/shard plan)."""

    def __init__(self, role: Role, resolved: Resolved, model_fn: Callable[..., Any],
                 train_data_fn: Callable[..., Any], eval_data_fn: Callable[..., Any] | None, t_proc: float,
                 rdv: Rendezvous | None = None):
        self.role, self.resolved = role, resolved
        self.model_fn, self.train_data_fn, self.eval_data_fn = model_fn, train_data_fn, eval_data_fn
        self.params = resolved.params
        self.rc = self.params["runconfig"]
        self.mode = resolved.mode
        self.model_dir = Path(resolved.model_dir)
        self.t_proc = t_proc
        self.num_input_workers = 0 if role.single_process else role.num_input_workers
        self.rdv = rdv  # the job step's rendezvous (with input workers), the lifecycle's
        self.ranks: TorchRanks | None = None  # several trainer ranks: joined at the start of training
        self.device = rank_device(role)
        self.evaluator = Evaluator(eval_data_fn, self.params, self.model_dir, self.device, self._forward_loss)
        self._source: Any = None  # the training batch source, closed at the end of run()
        self.own_input = OwnInput(role, os.environ)  # the chief's input CPUs: input worker 0 in this task

    # ------------------------------------------------------------------ the lifecycle's (csrun_runtime.lifecycle)
    def run_mode(self) -> int:
        """Run ``runconfig.mode``; returns 0 or a stop's code. Raises ``ParamsError``, ``ContractError``,
        ``CheckpointError``, ``WorkerFailed`` and runtime errors, for :meth:`.runner.Hooks.failure` to map."""
        return {"train": self._train, "train_and_eval": self._train, "eval": self._eval_mode,
                "validate_only": self._validate_only, "compile_only": self._compile_only}[self.mode]()

    def close(self) -> None:
        """Once the job is marked done (so that the input workers read the chief's status first):
        the training source, then input worker 0 in this task (it leaves after its report)."""
        if self._source is not None:
            self._source.close()
        self.own_input.stop()

    def missing_reports(self) -> int:
        """:meth:`.own_input.OwnInput.missing`: input worker 0 asked for and never started."""
        return self.own_input.missing()

    # ------------------------------------------------------------------ pieces
    def _train_loader(self) -> Any:
        """Streamer 0 of 1's training DataLoader (seeded as streamer 0; ``data_dir`` unchanged,
        ``params["csrun"]["data_files"]`` worker 0's files under a shard plan)."""
        data_dir, files = None, None
        if self.role.shard_plan:
            plan = load_shard_plan(self.role.shard_plan, max(1, self.num_input_workers))
            files = list(plan["workers"][0]["files"])
        # several trainer ranks reading in-process: rank r reads streamer r of world_size's share
        r, n = (self.role.rank, self.role.world_size) if self.role.world_size > 1 and not files else (0, 1)
        p = process_params(self.params, r, n, True, data_dir, files)
        set_facts(StreamerFacts(n, r, True))
        seed_process(torch_seed(self.params, r))
        return call_data_fn(self.train_data_fn, p, "train_input")

    def _check_workers_loader(self) -> None:
        """The contract of the training DataLoader as input worker 0 of ``W`` builds it (not
        iterated), so that a violation is the chief's exit 2 before any worker streams.
        Raises :class:`ContractError`."""
        w = 1 if self.role.shard_plan else max(1, self.role.num_streamers)  # job-wide: W of all ranks
        set_facts(StreamerFacts(w, 0, True))
        try:
            call_data_fn(self.train_data_fn, process_params(self.params, 0, w, True), "train_input")
        finally:
            set_facts(StreamerFacts(w, 0, False))

    def _model(self) -> tuple[Any, Any]:
        import torch

        seed = self.rc.get("seed")
        if seed is not None:
            torch.manual_seed(int(seed))
        try:
            model = self.model_fn(self.params)
        except Exception as e:  # noqa: BLE001
            raise ContractError(f"model: model_fn raised {type(e).__name__}: {e}") from None
        check_module(model)
        model.to(self.device)
        return model, build_optimizer(model, self.params)

    def _restore(self, model: Any, opt: Any) -> int:
        src = self.rc.get("checkpoint_path") or (self.model_dir if self.rc.get("autoload_last_checkpoint") else None)
        path = checkpoint.latest(src) if src else None
        if path is None:
            if self.rc.get("checkpoint_path"):
                raise checkpoint.CheckpointError(f"runconfig.checkpoint_path {self.rc['checkpoint_path']}: "
                                                 "no checkpoint there")
            return 0
        step = checkpoint.load(path, model, opt, map_location=self.device)
        log.info("restored %s (global step %d)", path, step)
        return step

    def _forward_loss(self, model: Any, batch: Any) -> Any:
        return loss_of(model(batch))

    # ------------------------------------------------------------------ train
    def _train(self) -> int:
        """``train`` / ``train_and_eval``: restore, then the core's training loop
        (:class:`csrun_runtime.loop.TrainingDriver` over :class:`.training.TorchStepBackend`) to
        the target: checkpoints, the allocation record, performance.json and the verdict;
        returns 0, or the stop signal's exit code (:func:`csrun_runtime.preemption.exit_code`).
        Raises what the loop raised (after performance.json, once a step was trained)."""
        remote = self.rdv is not None and self.num_input_workers > 0
        if remote:
            self.own_input.place()  # before the model: the training CPUs, when the split pins them
        if self.role.world_size > 1:  # several trainer ranks: join the others (bounded wait)
            self.ranks = TorchRanks.start(self.role, self.rc)
        model, opt = self._model()
        start = self._restore(model, opt)  # every rank restores the same checkpoint
        target = training_target(start, self.rc)
        writes = self.role.is_rank_zero or self.role.world_size <= 1
        if writes:
            write_params_yaml(self.model_dir, self.params, "train")
        evaluating = self.mode == "train_and_eval"
        if start >= target:
            log.info("global step %d already reached the training target %d; nothing to train", start, target)
            if evaluating and writes:
                self._evaluate(model, start)
            return 0
        autoscale = autoscale_spec(os.environ, self.num_input_workers) if remote else None
        if remote and self.rdv is not None:
            self._check_workers_loader()  # before the endpoint is published: no worker builds a bad one
            source: Any = RemoteSource(self.rdv, self.role, self.rc, streams=autoscale.initial if autoscale else None,
                                       start=start)
            self.own_input.start()
        else:
            say_in_process_restart(start)
            source = _LocalSource(self._train_loader())
        # batches staged on the device ahead of the step, received on the feed's thread on CUDA (not
        # under --autoscale: its autoscaler drives the source from the loop's thread)
        source = DeviceFeed(source, self.device, depth=int(self.rc.get("device_prefetch") or DEVICE_PREFETCH),
                            threaded=None if autoscale is None else False)
        self._source = source  # closed once the job is marked done (close()): the workers read the chief's status
        self._loop(model, opt, source, start, evaluating, autoscale)
        return preemption.exit_code()  # 75 after --requeue's signal, 130/143 after Ctrl-C/SIGTERM, else 0

    def _loop(self, model: Any, opt: Any, source: Any, start: int, evaluating: bool, autoscale: Any) -> None:
        """The core's training loop over :class:`.training.TorchStepBackend`; with several trainer
        ranks the module wrapped in ``DistributedDataParallel`` (:meth:`.ranks.TorchRanks.wrap`,
        after the restore), checkpoints and evaluations of the unwrapped module, and the loop's
        :class:`csrun_runtime.rankgroup.LoopRanks` (stop agreement, rank 0 writes)."""
        trained = self.ranks.wrap(model) if self.ranks is not None else model
        backend = TorchStepBackend(model=trained, opt=opt, source=source, rc=self.rc, model_dir=self.model_dir,
                                   device=self.device, evaluate=self._evaluate, forward_loss=self._forward_loss,
                                   start=start, info=self.own_input.describe, module=model,
                                   scheduler=build_lr_scheduler(model, opt, self.params, start))
        ranks = LoopRanks(self.ranks, self.role.node or None) if self.ranks is not None else None
        setup = LoopSetup(rc=self.rc, model_dir=self.model_dir, mode=self.mode, start=start, t_proc=self.t_proc,
                          node=self.role.node or None, num_input_workers=self.num_input_workers,
                          params_path=self.resolved.params_path, evaluating=evaluating, rdv=self.rdv,
                          autoscale=autoscale, addresses=getattr(source, "addresses", []),
                          registry=getattr(source, "registry", {}), ranks=ranks)
        log.info("training on %s%s", self.device, f" as trainer rank {self.role.rank} of {self.role.world_size} "
                 f"(DistributedDataParallel, {self.ranks.backend})" if self.ranks is not None else "")
        TrainingDriver(setup, backend).run()

    # ------------------------------------------------------------------ eval
    def _eval_loader(self) -> Any:
        return self.evaluator.loader()

    def _evaluate(self, model: Any, step: int) -> dict[str, float]:
        """:meth:`csrun_runtime.pytorch.evaluation.Evaluator.evaluate`."""
        return self.evaluator.evaluate(model, step)

    def _eval_mode(self) -> int:
        model, opt = self._model()
        step = self._restore(model, opt)
        if step == 0:
            log.warning("no checkpoint in %s: evaluating the initial model", self.model_dir)
        self._evaluate(model, step)
        return 0

    # ------------------------------------------------------------------ validate / compile
    def _validate_only(self) -> int:
        """Build the training DataLoader, pull one batch (fixed batch size checked), and the
        eval DataLoader's first batch when there is an eval_data_fn; the input workers' files
        (contract rule 7: :func:`.coverage.validate_lines`, at most :data:`VALIDATE_COVERAGE_SECS`
        of reading per build); ``validate_report.txt``
        (:func:`.report.validate_report`)."""
        from .coverage import validate_lines

        has_eval = self.eval_data_fn is not None and isinstance(self.params.get("eval_input"), dict)
        loader = self._train_loader()
        lines = validate_lines(self.train_data_fn, self.params, bool(self.rc.get("strict")), VALIDATE_COVERAGE_SECS)
        validate_report(loader, self._eval_loader if has_eval else None, self.model_dir, lines)
        return 0

    def _compile_only(self) -> int:
        """Instantiate the module and its optimizer, run one forward (the loss checked) and one
        backward on a real training batch, then ``compile_only_steps`` timed forwards;
        ``compile_report.txt`` / ``compile_report.json``."""
        loader = self._train_loader()
        model, opt = self._model()
        batch = to_torch(next(iter(loader)), self.device)
        compile_report(model, opt, batch, self.device, self._forward_loss, int(self.rc["compile_only_steps"]),
                       self.model_dir)
        return 0
