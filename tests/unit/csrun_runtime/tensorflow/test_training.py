"""csrun_runtime/tensorflow/training.py with real TensorFlow in one process (the tiny model of
tiny.py, a temporary model_dir, the in-process pipeline bundled 4 batches per element): a scalar
written with core TF ops as TensorBoard's ``scalars`` plugin reads it; the step backend training a
chunk in one call; and the core's loop over it from the global step to the target, saving and
evaluating through the chief's callables, its loss scalars in the model_dir."""
from __future__ import annotations

import json

import pytest

from csrun_runtime.tensorflow import chief_model
from csrun_runtime.tensorflow.bundling import plan_bundle
from csrun_runtime.tensorflow.sources import LocalSource
from csrun_runtime.tensorflow.steps import TrainSteps
from csrun_runtime.tensorflow.training import LoopContext, TFStepBackend, training_loop, write_scalar
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = [pytest.mark.tf, pytest.mark.usefixtures("quiet_task")]
tf = tiny.tf


def events(directory) -> list[tuple[str, int, float, str]]:
    """``(tag, step, value, plugin)`` of every summary value in the event files of ``directory``."""
    out = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for v in event.summary.value:
                out.append((v.tag, event.step, float(tf.make_ndarray(v.tensor)), v.metadata.plugin_data.plugin_name))
    return out


def test_a_scalar_is_a_float32_summary_of_the_scalars_plugin(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        write_scalar("loss", 0.25, 7)
    writer.flush()
    assert events(tmp_path) == [("loss", 7, 0.25, "scalars")]


class Chief:
    """The chief's side of :class:`LoopContext`: its checkpoint and evaluation, recorded."""

    def __init__(self, tmp_path, **runconfig):
        self.resolved = tiny.resolved(tmp_path, "train_and_eval", **runconfig)
        self.params, self.model_dir = self.resolved.params, tmp_path / "md"
        self.saved: list[int] = []
        self.evaluated: list[int] = []

    def context(self) -> LoopContext:
        return LoopContext(
            rc=self.params["runconfig"], model_dir=self.model_dir, mode="train_and_eval", t_proc=0.0, node=None,
            num_input_workers=0, params_path=self.resolved.params_path, save=self.save,
            evaluate=lambda model, step: self.evaluated.append(step),
            train_steps=lambda model, step_var: TrainSteps(model, allow_fallback=False, counter=step_var),
            jit_note=lambda: "")

    def save(self, mgr, step: int) -> None:
        self.saved.append(step)
        mgr.save(checkpoint_number=step)


def setup(tmp_path, **runconfig):
    chief = Chief(tmp_path, **runconfig)
    ds = tiny.input_fn(chief.params)
    model = chief_model.build_model(tiny.model_fn, chief.params, ds.element_spec)
    model.jit_compile = False
    step_var, _, mgr, _ = chief_model.checkpointing(model, chief.model_dir, chief.params["runconfig"])
    return chief, model, step_var, mgr, LocalSource(ds, plan_bundle(ds.element_spec, 4))


def test_the_step_backend_trains_a_chunk_in_one_call_advancing_the_global_step(tmp_path):
    chief, model, step_var, mgr, source = setup(tmp_path)
    backend = TFStepBackend(chief.context(), model, step_var, mgr, source, tiny.BATCH)
    chunk = backend.next_chunk(3, None, None)
    assert (chunk.worker, chunk.offset, chunk.steps) == (0, 0, 3)
    last, losses = backend.train(chunk)
    assert int(step_var.numpy()) == 3 and len(losses) == 3 and float(last) == float(losses[-1]) > 0
    assert backend.info() == {"xla": False, "xla_note": ""}
    backend.save(3)
    assert chief.saved == [3] and (tmp_path / "md" / "model-ckpt-3.index").is_file()
    backend.end_input()


def test_the_loop_trains_to_the_target_saving_and_evaluating_through_the_chief(tmp_path):
    chief, model, step_var, mgr, source = setup(tmp_path, max_steps=8, checkpoint_steps=4, log_steps=4,
                                                eval_frequency=4)
    training_loop(chief.context(), model, step_var, mgr, source, tiny.BATCH, evaluating=True).run()
    assert int(step_var.numpy()) == 8
    assert chief.saved == [4, 8] and chief.evaluated == [4, 8]
    perf = json.loads((tmp_path / "md" / "performance" / "performance.json").read_text())
    assert (perf["steps"], perf["batch_size"], perf["global_step_end"]) == (8, tiny.BATCH, 8)
    assert perf["batches_per_worker"] == {"in-process": 8}
    losses = [step for tag, step, _, plugin in events(tmp_path / "md") if tag == "loss" and plugin == "scalars"]
    assert losses and max(losses) == 8
