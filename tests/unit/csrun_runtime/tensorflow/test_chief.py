"""csrun_runtime/tensorflow/chief.py in one process with real TensorFlow (single-process mode, the
tiny model of tiny.py, a temporary model_dir): each mode's outcome — train writes its checkpoints,
params and performance.json and resumes from the newest checkpoint; eval restores it, evaluates on
the chief and refuses without one; compile_only reports and trains nothing; a model_fn that does
not compile is refused — and the input worker 0 a chief was asked for but never started. The chief
with input workers runs on the test cluster (tests/integration/test_main_job.py)."""
from __future__ import annotations

import json
import time

import pytest

from csrun_common.env import CHIEF_INPUT_CPUS
from csrun_runtime.params import ParamsError
from csrun_runtime.tensorflow.chief import Chief, Refused
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = [pytest.mark.tf, pytest.mark.usefixtures("quiet_task")]


def chief(tmp_path, mode: str, model_fn=tiny.model_fn, **runconfig) -> Chief:
    """The chief of ``run.py --mode mode`` by hand; its model_dir made, as the lifecycle makes it."""
    (tmp_path / "md").mkdir(exist_ok=True)
    return Chief(tiny.single_role(), tiny.resolved(tmp_path, mode, **runconfig), tiny.input_fn, model_fn,
                 tiny.eval_input_fn, time.time())


def test_train_writes_checkpoints_params_and_performance_then_eval_restores_the_newest(tmp_path):
    md = tmp_path / "md"
    assert chief(tmp_path, "train").run_mode() == 0
    assert sorted(p.name for p in md.glob("model-ckpt-*.index")) == ["model-ckpt-3.index", "model-ckpt-6.index"]
    assert (md / "train" / "params_train.yaml").is_file() and not (md / "eval").exists()
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert (perf["mode"], perf["steps"], perf["batch_size"], perf["global_step_end"]) == ("train", 6, tiny.BATCH, 6)
    assert perf["batches_per_worker"] == {"in-process": 6} and perf["ended"] == "target reached"

    assert chief(tmp_path, "eval").run_mode() == 0
    res = json.loads((md / "eval" / "results.json").read_text())
    assert (res["global_step"], res["eval_samples"], res["eval_batches"]) == (6, tiny.EVAL_SAMPLES, 3)
    assert set(res["metrics"]) == {"loss", "accuracy"} and (md / "eval" / "params_eval.yaml").is_file()

    assert chief(tmp_path, "train", max_steps=8).run_mode() == 0  # autoload_last_checkpoint: from step 6
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert (perf["global_step_start"], perf["global_step_end"], perf["steps"]) == (6, 8, 2)


def test_eval_without_a_checkpoint_names_what_is_missing(tmp_path):
    with pytest.raises(ParamsError, match=r"^mode eval needs a checkpoint: none in .*/md and no "
                                          r"runconfig.checkpoint_path / --checkpoint_path$"):
        chief(tmp_path, "eval").run_mode()


def test_compile_only_reports_the_step_and_trains_nothing(tmp_path):
    md = tmp_path / "md"
    assert chief(tmp_path, "compile_only").run_mode() == 0
    rep = json.loads((md / "compile_report.json").read_text())
    assert (rep["timed_steps"], rep["batch_size"], rep["xla"], rep["parameters"]) == (2, tiny.BATCH, False, 15)
    assert rep["compile_time"] >= 0 and rep["est_samples_per_sec"] > 0
    assert "compile time:" in (md / "compile_report.txt").read_text()
    assert not list(md.glob("model-ckpt-*")) and not (md / "performance").exists()


def test_a_model_fn_that_does_not_compile_is_refused_in_every_training_mode(tmp_path):
    def uncompiled(params):
        return tiny.keras.Sequential([tiny.keras.Input((4,)), tiny.keras.layers.Dense(3)])

    for mode in ("compile_only", "train"):
        with pytest.raises(Refused) as e:
            chief(tmp_path, mode, model_fn=uncompiled).run_mode()
        assert [p for p in e.value.problems if "compiled model" in p], e.value.problems
    assert not list((tmp_path / "md").glob("model-ckpt-*"))


def test_an_input_worker_0_asked_for_but_never_started_writes_no_report(tmp_path, monkeypatch):
    c = chief(tmp_path, "train")
    assert c.missing_reports() == 0
    monkeypatch.setenv(CHIEF_INPUT_CPUS, "1")
    assert c.missing_reports() == 1 and c.chief_input is None  # single-process: nothing to start
