"""Single-process mode (``python run.py ...`` without csrun): the digits example trains on real
data, evaluates on held-out data (accuracy >= 0.90), writes the model_dir artifacts of the
Cerebras document "Weight Streaming Quickstart" with consistent figures, and restores its
checkpoints."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    data = helpers.prepare_digits(tmp / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["train_examples"] == 1437 and manifest["eval_examples"] == 360
    assert len(manifest["train"]) == 8 and len(manifest["eval"]) == 2
    return tmp, data


@pytest.fixture(scope="module")
def trained(digits):
    """The TensorFlow path without PyTorch (issue 25: "the TensorFlow path without PyTorch: test
    both"): the run sees a ``torch`` package that raises ImportError, as where torch is not
    installed, so every test below also proves that the TensorFlow path does not need it."""
    tmp, data = digits
    params = helpers.digits_params(tmp, data, log_steps=50, checkpoint_steps=150,
                                   eval_frequency=150)
    md = tmp / "md"
    no_torch = tmp / "no_torch" / "torch"
    no_torch.mkdir(parents=True)
    (no_torch / "__init__.py").write_text('raise ImportError("No module named torch (csrun test: PyTorch absent)")\n')
    proc = helpers.run_py(["--params", str(params), "--mode", "train_and_eval",
                           "--max_steps", "300", "--model_dir", str(md), "--cs_ip", "10.0.0.1"],
                          env={"PYTHONPATH": os.pathsep.join([str(no_torch.parent), str(helpers.REPO)])})
    return params, md, proc


def test_train_and_eval_reaches_accuracy(trained):
    _, md, proc = trained
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"global_step = 1, loss = [0-9.e+-]+", out)
    assert re.search(r"global_step = 300, loss = [0-9.e+-]+", out)
    assert re.search(r"Training finished with 19200 samples in [0-9.]+ seconds, "
                     r"[0-9.]+ samples/second\.", out)
    res = json.loads((md / "eval" / "results.json").read_text())
    assert res["global_step"] == 300 and res["eval_samples"] == 360
    assert res["metrics"]["accuracy"] >= 0.90, res
    assert [h["global_step"] for h in res["history"]] == [150, 300]


def test_performance_json_is_consistent(trained):
    _, md, proc = trained
    perf = json.loads((md / "performance" / "performance.json").read_text())
    for key in ("compile_time", "est_samples_per_sec", "programming_time", "samples_per_sec",
                "suspected_input_bottleneck", "total_samples", "total_time",
                "input_wait_fraction"):
        assert key in perf, key
    assert perf["total_samples"] == 300 * 64 == perf["steps"] * perf["batch_size"]
    assert perf["samples_per_sec"] == pytest.approx(perf["total_samples"] / perf["total_time"],
                                                    rel=1e-3)
    assert 0 <= perf["input_wait_fraction"] <= 1
    assert perf["suspected_input_bottleneck"] == (perf["input_wait_fraction"] > 0.10)
    assert perf["programming_time"] > 0 and perf["compile_time"] >= 0
    assert perf["est_samples_per_sec"] > 0
    assert perf["batches_per_worker"] == {"in-process": 300}


def test_artifacts(trained):
    params, md, _ = trained
    names = {p.name for p in md.iterdir()}
    assert {"model-ckpt-150.index", "model-ckpt-300.index", "checkpoint"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert any(p.name.startswith("events.out.tfevents") for p in (md / "eval").iterdir())
    saved = yaml.safe_load((md / "train" / "params_train.yaml").read_text())
    assert saved["runconfig"]["max_steps"] == 300 and saved["runconfig"]["cs_ip"] == "10.0.0.1"
    assert saved["runconfig"]["model_dir"] == str(md)
    # TensorBoard scalars: loss and samples_per_sec
    import tensorflow as tf
    tags = set()
    for ev in md.glob("events.out.tfevents*"):
        for rec in tf.compat.v1.train.summary_iterator(str(ev)):
            for v in rec.summary.value:
                tags.add(v.tag)
    assert {"loss", "samples_per_sec", "input_wait_fraction"} <= tags


def test_checkpoints_restore(trained, tmp_path):
    params, md, _ = trained
    # autoload_last_checkpoint: train 20 more steps from 300
    proc = helpers.run_py(["--params", str(params), "--mode", "train", "--max_steps", "320",
                           "--model_dir", str(md)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Restored checkpoint" in out and "at global step 300" in out
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_start"] == 300 and perf["global_step_end"] == 320
    assert perf["total_samples"] == 20 * 64
    # eval mode on the latest checkpoint
    proc = helpers.run_py(["--params", str(params), "--mode", "eval", "--model_dir", str(md)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    m = re.search(r"Eval results at global step 320: .*accuracy = ([0-9.]+)", out)
    assert m and float(m.group(1)) >= 0.90, out
    assert (md / "eval" / "params_eval.yaml").exists()
    # checkpoint_path into a fresh model_dir reproduces the metric of step 300
    res300 = [h for h in json.loads((md / "eval" / "results.json").read_text())["history"]
              if h["global_step"] == 300][0]
    md2 = tmp_path / "md2"
    proc = helpers.run_py(["--params", str(params), "--mode", "eval", "--model_dir", str(md2),
                           "--checkpoint_path", str(md / "model-ckpt-300")])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    res = json.loads((md2 / "eval" / "results.json").read_text())
    assert res["global_step"] == 300
    assert res["metrics"]["accuracy"] == pytest.approx(res300["metrics"]["accuracy"], abs=1e-6)


def test_eval_without_checkpoint_fails(digits, tmp_path):
    tmp, data = digits
    params = helpers.digits_params(tmp_path, data)
    proc = helpers.run_py(["--params", str(params), "--mode", "eval", "--model_dir",
                           str(tmp_path / "empty")])
    assert proc.returncode == 2
    assert "needs a checkpoint" in proc.stderr


def test_invalid_runconfig_fails_naming_the_key(digits, tmp_path):
    tmp, data = digits
    params = helpers.digits_params(tmp_path, data, checkpoint_steps="often", foo=1)
    proc = helpers.run_py(["--params", str(params), "--model_dir", str(tmp_path / "x")])
    assert proc.returncode == 2
    assert "runconfig.checkpoint_steps" in proc.stderr
