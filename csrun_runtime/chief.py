"""The chief task: validates, compiles, trains and evaluates (also single-process mode).

With input workers the chief hosts their tf.data service dispatchers, waits for them in the
rendezvous and trains on the merge of their streams (:class:`csrun_runtime.service.ServiceSource`);
without, it iterates the pipeline itself. Evaluation always runs on the chief, in-process, so
held-out data is read exactly once. Modes and artifacts: csrun_runtime/README.md.

TensorFlow and Keras are imported inside the methods (see :mod:`csrun_runtime.worker`).
"""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.atomic import read_json, write_json
from csrun_common.autoscale import AutoscaleSpec
from csrun_common.autoscale import parse_env as parse_autoscale
from csrun_common.roles import Role

from . import chief_input, dataplane_source, preemption
from .artifacts import write_params_yaml
from .contract import (
    build_eval_input,
    check_dataset,
    check_model,
    check_signature,
    check_workers,
    synthetic_batch,
    validate,
)
from .coverage import check_job_files
from .params import TRAIN_MODES, ParamsError, Resolved, load_shard_plan
from .pipeline import build_worker_input
from .rendezvous import Heartbeat, Rendezvous
from .service import (
    BatchSource,
    InputStalled,
    LocalSource,
    ServiceSource,
    limit_threads,
    plan_bundle,
    start_dispatchers,
)
from .steps import TrainSteps
from .training import LoopContext, TrainingLoop, write_scalar

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import keras
    import tensorflow as tf

__all__ = ["Chief", "Refused"]

log = logging.getLogger("csrun.runtime")


class Refused(Exception):
    """The run refuses to start: contract violations (exit 2); ``problems`` lists them."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class Chief:
    """The chief task (also single-process mode): validates, compiles or trains on the
    merged stream of the input workers (or the in-process pipeline when there are none).

    ``run()`` returns the exit code (0 ok, 1 failure, 2 refused: contract or params).
    :mod:`analyzer.verify_task` reuses it for the rendezvous (:meth:`wait_workers`) without
    training.
    """

    def __init__(self, role: Role, resolved: Resolved, input_fn: Callable[..., Any],
                 model_fn: Callable[..., Any], eval_input_fn: Callable[..., Any] | None, t_proc: float):
        self.role, self.resolved = role, resolved
        self.params = resolved.params
        self.rc = self.params["runconfig"]
        self.mode = resolved.mode
        self.input_fn, self.model_fn, self.eval_input_fn = input_fn, model_fn, eval_input_fn
        self.t_proc = t_proc
        self.model_dir = Path(self.rc["model_dir"])
        self.num_workers = role.num_workers
        self.rdv: Rendezvous | None = None
        self.plan: dict[str, Any] | None = None
        self.jit_note = ""
        self._eval_ds: Any = None
        self._eval_info: dict[str, Any] = {}
        self._eval_writer: Any = None
        self._last_eval: dict[str, Any] | None = None  # the last evaluation's results.json record
        self._servers: list[Any] = []  # the dispatchers, referenced for the job's life
        self._receiver: Any = None  # runconfig.transport: dataplane (csrun_runtime/dataplane_source.py)
        #: what performance.json reports of the input path: ``input_bundle`` (setting, batch
        #: bytes, batches per element by worker), ``workers_registered_secs``.
        self.ingest_info: dict[str, Any] = {}
        self._all_files: list[str] | None = None  # the training files (rule 7's whole set)
        self._view_root: str | None = None  # shard-plan data_dir views of in-process pipelines
        self._shards = False  # the training pipeline shards by the input-worker count
        #: ``csrun_wse --autoscale`` (docs/AUTOSCALE.md); every slot's dispatcher address and
        #: registration are kept for the autoscaler (:mod:`csrun_runtime.autoscale`)
        self.autoscale: AutoscaleSpec | None = None  # set by _run_mode from CSRUN_AUTOSCALE
        self.addresses: list[str] = []
        self.registry: dict[int, dict[str, Any]] = {}
        #: ``csrun_wse --chief-input-cpus``: where training and input worker 0 run
        #: (:mod:`csrun_runtime.chief_input`), and that worker's process once started
        self.input_split: chief_input.CpuSplit | None = None
        self.chief_input: chief_input.ChiefInputWorker | None = None

    # ------------------------------------------------------------------ top level
    def run(self) -> int:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        if self.num_workers > 0:
            assert self.role.rendezvous_key is not None  # resolve_role requires SLURM_JOB_ID
            self.rdv = Rendezvous(self.model_dir, self.role.rendezvous_key)
            self.rdv.reset()
            Heartbeat(self.rdv, "chief").start()
        code, reason = 1, ""
        try:
            code = self._run_mode()
        except ParamsError as e:
            for p in e.problems:
                log.error("%s", p)
            code, reason = 2, str(e)
        except Refused as e:
            for p in e.problems:
                log.error("%s", p)
            code, reason = 2, str(e)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, InputStalled):
                log.error("%s", e)
            else:
                log.exception("run failed: %s", e)
            code, reason = 1, f"{type(e).__name__}: {e}"
        except preemption.Interrupted as e:  # SIGINT/SIGTERM before training (preemption.py)
            log.info("stopped by %s outside the training loop: no step trained since, nothing more saved",
                     e.signal)
            code, reason = e.code, f"stopped by {e.signal}"
        finally:
            if self.rdv is not None:
                stopped = code == preemption.REQUEUE_EXIT or preemption.stop_requested()
                status = "ok" if code == 0 else "stopped" if stopped else "failed"
                self.rdv.mark_done(status, reason[:2000])
                if code != 0:  # exit after the workers: the step's status is then ours, not a
                    # killed worker's 143 (srun --kill-on-bad-exit ends them when we fail first);
                    # a worker still importing TensorFlow needs more than the stop's 10 s
                    preemption.wait_workers_left(self.rdv.reports, self.num_workers, 10.0 if stopped else 30.0)
            if self.chief_input is not None:  # it leaves on done.json, after its report
                self.chief_input.stop()
            if self._view_root is not None:
                shutil.rmtree(self._view_root, ignore_errors=True)
        return code

    def _run_mode(self) -> int:
        if self.num_workers:
            try:
                self.autoscale = parse_autoscale(os.environ, self.num_workers)
            except ValueError as e:
                raise ParamsError(str(e)) from None
            if self.mode in TRAIN_MODES:
                self.place_chief_input()
        if self.role.shard_plan:
            self.plan = load_shard_plan(self.role.shard_plan, max(1, self.num_workers))
        log.info("Checkpoints and summaries will be saved in: %s", self.model_dir)
        log.info("mode %s; %s", self.mode, self.role.describe())
        if self.mode == "validate_only":
            return self._validate_only()
        if self.mode == "compile_only":
            return self._compile_only()
        return self._train_eval()

    # ------------------------------------------------------------------ helpers
    def place_chief_input(self) -> None:
        """With ``CSRUN_CHIEF_INPUT_CPUS=n`` (``--chief-input-cpus``), split this task's CPUs
        between training and input worker 0 (:func:`csrun_runtime.chief_input.split_cpus`)
        and, when they are disjoint, pin the chief's threads now, before TensorFlow sizes its
        thread pools from them; :meth:`start_chief_input` then starts the worker. No-op
        without the variable. Raises :class:`ParamsError` naming the variable for a bad value."""
        try:
            n = chief_input.requested(os.environ)
        except ValueError as e:
            raise ParamsError(str(e)) from None
        if not n:
            return
        self.input_split = chief_input.split_cpus(sorted(os.sched_getaffinity(0)),
                                                  self.role.cpus_per_task, n)
        if self.input_split.pinned:
            chief_input.pin_threads(self.input_split.training)
        self.ingest_info["chief_input"] = {"worker": 0, **self.input_split.describe(),
                                           "chief_affinity": sorted(os.sched_getaffinity(0))}

    def start_chief_input(self) -> None:
        """Start input worker 0 in this task (:class:`csrun_runtime.chief_input.ChiefInputWorker`)
        once the dispatchers are published, when :meth:`place_chief_input` placed one."""
        if self.input_split is not None and self.chief_input is None:
            self.chief_input = chief_input.ChiefInputWorker.start(self.role, self.input_split)

    def _check_train_input(self):
        """Contract checks of the training input (built as input worker 0 would build it,
        :func:`csrun_runtime.pipeline.build_worker_input`); with several input workers also
        rules 6 and 7 (:func:`csrun_runtime.contract.check_workers`). Returns
        ``(ds, spec, batch)``; ``ds`` is what the in-process pipeline trains on."""

        problems = [f"train_input: {m}" for m in check_signature(self.input_fn)]
        if problems:
            raise Refused(problems)
        if self.plan is not None and self._view_root is None:
            self._view_root = tempfile.mkdtemp(prefix="csrun-views-")
        try:
            built = build_worker_input(self.input_fn, self.params, 0, max(1, self.num_workers),
                                       self.plan, job_key=self.role.rendezvous_key,
                                       view_root=self._view_root)
        except Exception as e:  # noqa: BLE001
            raise Refused([f"train_input: the input function raised {type(e).__name__}: {e}"]) from None
        ds = built.dataset
        rep = check_dataset(ds, "train", batch_size=built.params["train_input"].get("batch_size"))
        if rep.ok and self.num_workers > 1:
            rep.extend(check_workers(self.input_fn, self.params, self.plan,
                                     strict=bool(self.rc.get("strict"))))
            cov = rep.info.get("file_coverage") or {}
            log.info("input workers' files (checked as workers 0 and 1 of %s): %s%s",
                     cov.get("num_workers", "?"), cov.get("verdict", "unknown"),
                     f" ({cov['note']})" if cov.get("note") else "")
            self._all_files = rep.info.get("all_files")
            self._shards = bool(built.shards_by_worker_count)
        for w in rep.warnings:
            log.warning("%s", w)
        if not rep.ok:
            raise Refused(rep.violations)
        return ds, ds.element_spec, rep.info["train_input"]["batch_size"]

    def _eval_dataset(self):

        if self._eval_ds is None:
            if self.eval_input_fn is not None:
                problems = check_signature(self.eval_input_fn, "eval_input_fn")
                if problems:
                    raise Refused([f"eval_input: {m}" for m in problems])
            try:
                ds = build_eval_input(self.input_fn, self.params, self.eval_input_fn)
            except Exception as e:  # noqa: BLE001
                raise Refused([f"eval_input: the input function raised {type(e).__name__}: {e}"]) from None
            rep = check_dataset(ds, "eval", eval_steps=self.rc.get("eval_steps"),
                                batch_size=(self.params.get("eval_input") or {}).get("batch_size"))
            for w in rep.warnings:
                log.warning("%s", w)
            if not rep.ok:
                raise Refused(rep.violations)
            self._eval_ds = ds
            self._eval_info = rep.info["eval_input"]
        return self._eval_ds

    def _build_model(self, spec):
        import keras


        if self.rc.get("seed") is not None:
            keras.utils.set_random_seed(int(self.rc["seed"]))
        model = self.model_fn(self.params)
        if not isinstance(model, keras.Model):
            raise Refused([f"model: model_fn must return a keras.Model, got {type(model).__name__}"])
        if not getattr(model, "compiled", False) or model.optimizer is None:
            raise Refused(["model: model_fn must return a compiled model "
                            "(model.compile(optimizer=..., loss=..., metrics=...))"])
        if not model.built:
            x, _ = synthetic_batch(spec)
            model(x)
        model.optimizer.build(model.trainable_variables)
        return model

    def _apply_jit(self, model) -> None:
        setting = self.rc.get("jit_compile", "auto")
        want = setting in ("auto", True)
        model.jit_compile = want
        model.train_function = None
        model.test_function = None
        self.jit_note = ""
        if want and not model.jit_compile:
            self.jit_note = "Keras reports that this model does not support XLA"
            log.info("XLA: %s; running the train step without XLA", self.jit_note)

    def _time_steps(self, model: keras.Model, spec: Any) -> tuple[float, list[float], int]:
        """compile_only's timing: the first step (trace and compile, with the XLA fallback),
        then ``runconfig.compile_only_steps`` steps on a synthetic element of the input's
        shapes, in calls of as many steps as training would make (the bundle
        :func:`csrun_runtime.service.plan_bundle` gives, capped by ``steps_per_execution``).
        Returns ``(first step s, seconds per step of each timed call, steps per call)``."""
        import tensorflow as tf

        batch = synthetic_batch(spec, "random")
        bundle = plan_bundle(spec, self.rc.get("input_bundle", "auto")).bundle
        spe = self.rc.get("steps_per_execution", "auto")
        n = int(self.rc["compile_only_steps"])
        per_call = max(1, min(n, bundle, bundle if spe == "auto" else int(spe)))
        element = tf.nest.map_structure(lambda t: None if t is None else tf.stack([t] * bundle), batch)
        steps = self.train_steps(model)
        t = time.monotonic()
        steps(element, 0, 1)
        first = time.monotonic() - t
        times, done = [], 0
        while done < n:
            k = min(per_call, n - done)
            t = time.monotonic()
            steps(element, 0, k)
            times.append((time.monotonic() - t) / k)
            done += k
        return first, times, per_call

    def train_steps(self, model: keras.Model, step_var: tf.Variable | None = None) -> TrainSteps:
        """The chief's several-steps-per-call train function for ``model``; with
        ``runconfig.jit_compile: auto`` an XLA compile failure on the first call is logged
        (``xla_note``) and training goes on without XLA (:class:`csrun_runtime.steps.TrainSteps`).
        ``step_var``: the global step variable, advanced inside each call."""

        def fell_back(e: BaseException) -> None:
            self.jit_note = f"XLA compile failed: {type(e).__name__}: {str(e).strip()[:300]}"
            log.warning("%s; falling back to the train step without XLA", self.jit_note)
            model.train_function = None
            model.test_function = None

        return TrainSteps(model, fell_back, allow_fallback=self.rc.get("jit_compile", "auto") == "auto",
                          counter=step_var)

    def _checkpointing(self, model):
        import tensorflow as tf

        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, global_step=step)
        mgr = tf.train.CheckpointManager(ckpt, str(self.model_dir),
                                         max_to_keep=int(self.rc["keep_checkpoint_max"]),
                                         checkpoint_name="model-ckpt")
        path = None
        if self.rc.get("checkpoint_path"):
            p = self.rc["checkpoint_path"]
            path = tf.train.latest_checkpoint(p) if os.path.isdir(p) else p
            if path is None or not tf.io.gfile.glob(path + ".index"):
                raise ParamsError(f"runconfig.checkpoint_path: no checkpoint at {p}")
        elif self.rc.get("autoload_last_checkpoint", True):
            path = mgr.latest_checkpoint
        if path:
            status = ckpt.restore(path)
            try:
                status.assert_existing_objects_matched()
            except AssertionError as e:
                raise ParamsError(f"checkpoint {path} does not match the model: {e}") from None
            status.expect_partial()
            log.info("Restored checkpoint %s at global step %d", path, int(step.numpy()))
        return step, ckpt, mgr, path

    def save(self, mgr: tf.train.CheckpointManager, step: int) -> None:
        log.info("Saving checkpoint at global step %d", step)
        mgr.save(checkpoint_number=step)

    def evaluate(self, model: keras.Model, step: int) -> dict[str, float]:
        import tensorflow as tf

        ds = self._eval_dataset()
        if self.rc.get("eval_steps"):
            ds = ds.take(int(self.rc["eval_steps"]))
        t = time.monotonic()
        # Keras' evaluate() without steps warns that a finite dataset "ran out of data"; a plain
        # loop over the test step accumulates the compiled metrics and counts the samples.
        model.make_test_function()
        model.reset_metrics()
        logs: dict[str, Any] = {}
        batches = samples = 0
        for x, y in ds:
            logs = model.test_function(iter([(x, y, None)]))
            batches += 1
            first = x if not isinstance(x, dict) else next(iter(x.values()))
            samples += int(first.shape[0])
        dt = time.monotonic() - t
        if not batches:
            raise Refused(["eval_input: the eval Dataset produced no batch"])
        res = {k: float(v) for k, v in logs.items()}
        log.info("Eval results at global step %d: %s (%d samples in %d batches, %.2f s)", step,
                 ", ".join(f"{k} = {v:.6g}" for k, v in res.items()), samples, batches, dt)
        if self._eval_writer is None:
            self._eval_writer = tf.summary.create_file_writer(str(self.model_dir / "eval"))
        with self._eval_writer.as_default():
            for k, v in res.items():
                write_scalar(k, v, step)
        self._eval_writer.flush()
        path = self.model_dir / "eval" / "results.json"
        prev = read_json(path) or {}
        history = prev.get("history", []) if isinstance(prev, dict) else []
        rec = {"global_step": step, "metrics": res, "eval_samples": samples,
               "eval_batches": batches, "time": round(dt, 4)}
        history.append(rec)
        write_json(path, {**rec, "history": history[-100:]})
        self._last_eval = rec
        return res

    def _eval_verdict(self) -> None:
        """The verdict block of an ``eval`` run (docs/VERDICT.md): what was evaluated and how
        fast; an eval run trains nothing, so there is no input wait to judge."""
        rec = self._last_eval or {}
        t = float(rec.get("time") or 0.0)
        n = int(rec.get("eval_samples") or 0)
        log.info("verdict (eval done): evaluated the checkpoint at global step %s: %d samples in %d batches "
                 "in %.3f s (%.1f samples/s)", rec.get("global_step"), n, int(rec.get("eval_batches") or 0), t,
                 n / t if t > 0 else 0.0)
        log.info("  no training in mode eval: input waits are judged on train runs; results in %s",
                 self.model_dir / "eval" / "results.json")

    # ------------------------------------------------------------------ modes
    def _validate_only(self) -> int:

        rep = validate(self.input_fn, self.model_fn, self.params, self.eval_input_fn,
                       plan=self.plan, num_workers=max(1, self.num_workers),
                       strict=bool(self.rc.get("strict")))
        text = rep.text()
        cov = rep.info.get("file_coverage")
        if cov:
            line = (f"input workers' files (checked as workers 0 and 1 of {cov['num_workers']}): "
                    f"{cov['verdict']}" + (f" ({cov['note']})" if cov.get("note") else ""))
            log.info("validate_only: %s", line)
            text += f"\nINFO: {line}"
        (self.model_dir / "validate_report.txt").write_text(text + "\n")
        for w in rep.warnings:
            log.warning("%s", w)
        for v in rep.violations:
            log.error("%s", v)
        if rep.ok:
            log.info("validate_only: input_fn and model satisfy the contract (%s)",
                     ", ".join(f"{k}: batch_size {v.get('batch_size')}" for k, v in rep.info.items()
                               if isinstance(v, dict) and "batch_size" in v))
            return 0
        log.error("validate_only: %d violation(s)", len(rep.violations))
        return 2

    def _compile_only(self) -> int:
        import tensorflow as tf


        _, spec, batch_size = self._check_train_input()
        mrep, _ = check_model(self.model_fn, self.params, spec)
        if not mrep.ok:
            raise Refused(mrep.violations)
        model = self._build_model(spec)
        self._apply_jit(model)
        first, times, per_call = self._time_steps(model, spec)
        n = int(self.rc["compile_only_steps"])
        med = statistics.median(times)
        compile_time = max(0.0, first - med)
        est = batch_size / med if med > 0 else None
        xla = bool(model.jit_compile)
        rec = {
            "compile_time": round(compile_time, 4),
            "est_samples_per_sec": round(est, 2) if est else None,
            "first_step_time": round(first, 4),
            "median_step_time": round(med, 6),
            "timed_steps": n,
            "steps_per_call": per_call,
            "batch_size": batch_size,
            "xla": xla,
            "xla_note": self.jit_note,
            "parameters": int(model.count_params()),
            "element_spec": repr(spec),
            "devices": [d.name for d in tf.config.list_logical_devices()],
            "note": "steps run on synthetic batches of the input's shapes (no input pipeline)",
        }
        lines = [
            "csrun compile_only report",
            f"model_dir: {self.model_dir}",
            f"train step: {'XLA (jit_compile=True)' if xla else 'TF graph without XLA'}"
            + (f" [{self.jit_note}]" if self.jit_note else ""),
            f"compile time: {rec['compile_time']} s (first step {rec['first_step_time']} s "
            f"minus median step {rec['median_step_time']} s)",
            f"estimated samples/s: {rec['est_samples_per_sec']} (batch_size {batch_size} / "
            f"median of {n} timed steps on synthetic batches, {per_call} steps per call)",
            f"model parameters: {rec['parameters']}",
            f"element_spec: {rec['element_spec']}",
            f"devices: {', '.join(rec['devices'])}",
        ]
        (self.model_dir / "compile_report.txt").write_text("\n".join(lines) + "\n")
        write_json(self.model_dir / "compile_report.json", rec)
        for line in lines[2:5]:
            log.info("compile_only: %s", line)
        log.info("compile_only: report in %s", self.model_dir / "compile_report.txt")
        return 0

    def _train_eval(self) -> int:
        training = self.mode in TRAIN_MODES
        evaluating = self.mode in ("eval", "train_and_eval")
        ds = spec = batch_size = None
        if training:
            ds, spec, batch_size = self._check_train_input()
        if evaluating:
            eds = self._eval_dataset()
            if spec is None:
                spec = eds.element_spec
        addresses = self._start_dispatchers() if training and self.num_workers > 0 else []
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
            self._eval_verdict()
            return 0
        write_params_yaml(self.model_dir, self.params, "train")
        source = self._training_source(ds, addresses)
        assert batch_size is not None  # the training input's contract fixes it
        TrainingLoop(self.loop_context(), model, step_var, mgr, source, batch_size, evaluating).run()
        return preemption.exit_code()  # 75 after --requeue's signal, 130/143 after Ctrl-C/SIGTERM, else 0

    def loop_context(self) -> LoopContext:
        """What :class:`csrun_runtime.training.TrainingLoop` takes from the chief: values, and
        :meth:`save`, :meth:`evaluate`, :meth:`train_steps` and the XLA note as callables."""
        return LoopContext(
            rc=self.rc, model_dir=self.model_dir, mode=self.mode, t_proc=self.t_proc, node=self.role.node,
            num_workers=self.num_workers, params_path=self.resolved.params_path, save=self.save,
            evaluate=self.evaluate, train_steps=self.train_steps, jit_note=lambda: self.jit_note,
            ingest_info=self.ingest_info, rdv=self.rdv, autoscale=self.autoscale, addresses=self.addresses,
            registry=self.registry)

    def _training_source(self, ds: Any, addresses: list[str]) -> BatchSource:
        """Where training batches come from: the merged streams of the input workers (each
        bundled as its worker registered it), else the in-process pipeline bundled by
        ``runconfig.input_bundle``. Logs the bundling and keeps it for performance.json
        (:attr:`ingest_info`)."""
        setting = self.rc.get("input_bundle", "auto")
        if addresses:
            registry = self.wait_workers()
            plans = {i: r.get("bundling") or {"batches_per_element": r.get("bundle", 1)}
                     for i, r in sorted(registry.items())}
            first = plans[min(plans)]
            same = all(p.get("batches_per_element") == first.get("batches_per_element") for p in plans.values())
            log.info("input bundling: %s", first.get("reason", "?") if same else
                     "; ".join(f"worker {i}: {p.get('reason', '?')}" for i, p in plans.items()))
            self.ingest_info["input_bundle"] = {
                "setting": setting, "batch_bytes": first.get("batch_bytes"),
                "batches_per_element": {str(i): p.get("batches_per_element") for i, p in plans.items()},
                "reason": first.get("reason")}
            self.addresses, self.registry = list(addresses), registry
            if self.autoscale is not None:
                n = self.autoscale.initial
                log.info("autoscale (%s policy, %g s windows): reading input workers 0..%d of %d slot(s), "
                         "between %d and %d at a time", self.autoscale.policy, self.autoscale.window_s, n - 1,
                         len(addresses), self.autoscale.min_workers, self.autoscale.max_workers)
                if self._receiver is not None:
                    return dataplane_source.chief_source(self.rendezvous, self._receiver, registry, n)
                return ServiceSource(self.rendezvous, addresses[:n], registry, queue_size=2)  # a short buffer
            if self._receiver is not None:
                return dataplane_source.chief_source(self.rendezvous, self._receiver, registry)
            return ServiceSource(self.rendezvous, addresses, registry)
        plan = plan_bundle(ds.element_spec, setting)
        log.info("input bundling (in-process pipeline): %s", plan.reason)
        self.ingest_info["input_bundle"] = {
            "setting": setting, "batch_bytes": plan.batch_bytes,
            "batches_per_element": {"in-process": plan.bundle}, "reason": plan.reason}
        return LocalSource(limit_threads(ds, self.role.cpus_per_task), plan)

    @property
    def rendezvous(self) -> Rendezvous:
        """The job step's rendezvous; only a chief with input workers has one."""
        if self.rdv is None:
            raise RuntimeError(f"{self.role.describe()} has no rendezvous (no input workers)")
        return self.rdv

    def _start_dispatchers(self) -> list[str]:
        """One tf.data service dispatcher per input worker, published in the rendezvous;
        returns their ``host:port`` addresses (dispatcher ``i`` serves worker ``i``). With
        ``runconfig.transport: dataplane``: one data-plane receiver instead, its endpoint
        published for every worker (:func:`csrun_runtime.dataplane_source.start_for_chief`)."""
        if self.rc.get("transport") == dataplane_source.TRANSPORT:
            self._receiver, addresses = dataplane_source.start_for_chief(
                self.rendezvous, self.role.host, self.num_workers, {
                    "num_workers": self.num_workers, "mode": self.mode,
                    "chief": {"node": self.role.node, "host": self.role.host, "pid": os.getpid()}})
            return addresses
        self._servers, ports = start_dispatchers(self.num_workers)
        addresses = [f"{self.role.host}:{p}" for p in ports]
        self.rendezvous.publish_dispatchers(addresses, {
            "num_workers": self.num_workers, "mode": self.mode,
            "chief": {"node": self.role.node, "host": self.role.host, "pid": os.getpid()}})
        log.info("tf.data service: %d dispatcher(s) on %s, one per input worker",
                 len(addresses), self.role.host)
        return addresses

    def wait_workers(self) -> dict[int, dict[str, Any]]:
        """Wait until every input worker registered ``status: ok`` in the rendezvous; returns
        ``{worker index: registration}``; the seconds it waited are kept in
        ``ingest_info["workers_registered_secs"]``. Raises ``Refused`` (a worker's contract
        violations) or :class:`csrun_runtime.service.InputStalled` after
        ``runconfig.worker_start_timeout_secs`` seconds."""

        timeout = float(self.rc["worker_start_timeout_secs"])
        t0 = time.monotonic()
        last_log = t0
        while True:
            regs = {i: self.rendezvous.worker(i) for i in range(self.num_workers)}
            failed = {i: r for i, r in regs.items() if r and r.get("status") == "failed"}
            if failed:
                problems = []
                for i, r in sorted(failed.items()):
                    for v in r.get("violations", []):
                        problems.append(f"input worker {i} on {r.get('node')}: {v}")
                raise Refused(problems)
            ok = {i: r for i, r in regs.items() if r and r.get("status") == "ok"}
            if len(ok) == self.num_workers:
                self.ingest_info["workers_registered_secs"] = round(time.monotonic() - t0, 3)
                log.info("all %d input worker(s) registered in %.1f s: %s", self.num_workers,
                         time.monotonic() - t0,
                         ", ".join(f"{i} on {r.get('node')}" for i, r in sorted(ok.items())))
                self._check_job_files(ok)
                return ok
            now = time.monotonic()
            if now - t0 > timeout:
                missing = [i for i in range(self.num_workers) if i not in ok]
                hb = {i: self.rendezvous.age(f"workers/{i}") for i in missing}
                raise InputStalled(
                    f"input worker(s) {', '.join(map(str, missing))} did not register within "
                    f"{timeout:.0f} s (runconfig.worker_start_timeout_secs); heartbeat ages: "
                    + ", ".join(f"{i}: {'none' if a is None else f'{a:.0f} s'}" for i, a in hb.items())
                    + "; registered: " + (", ".join(f"{i} on {r.get('node')}"
                                                    for i, r in sorted(ok.items())) or "none"))
            if now - last_log > 15:
                log.info("waiting for input workers: %d of %d registered", len(ok),
                         self.num_workers)
                last_log = now
            time.sleep(0.25)

    def _check_job_files(self, registrations: dict[int, dict[str, Any]]) -> None:
        """Rule 7 on the job's real input workers: the files each registered as read
        (``pipeline_files``) against the whole set (logged; with ``runconfig.strict`` a
        problem refuses the run)."""
        files = {i: r.get("pipeline_files") for i, r in registrations.items()}
        if self.num_workers < 2 or any(f is None for f in files.values()):
            return
        cov = check_job_files({i: list(f or []) for i, f in files.items()}, self.plan, self._all_files,
                              self._shards)
        log.info("the %d input workers read %d distinct training file(s): %s", self.num_workers,
                 len(set().union(*map(set, cov.files.values()))), cov.verdict)
        for p in cov.problems:
            log.warning("train_input: %s", p)
        if cov.problems and self.rc.get("strict"):
            raise Refused([f"train_input: {p}" for p in cov.problems])
