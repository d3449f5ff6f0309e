"""The input_fn contract ("Limitations of the CerebrasEstimator") with its messages: every violation caught, in-process
(csrun_runtime.tensorflow.contract) and through ``run.py --mode validate_only`` (exit 0 or 2 listing
every violation). Also capture.load_entry and compile_only."""
from __future__ import annotations

import json

import pytest

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.tf

tf = pytest.importorskip("tensorflow")

from csrun_runtime.tensorflow import contract  # noqa: E402
from csrun_runtime.tensorflow.contract import (  # noqa: E402
    MSG_BATCH,
    MSG_NOT_DATASET,
    MSG_REPEAT,
    MSG_SHARED_SEED,
    MSG_SINGLE_PARAM,
    MSG_STRUCTURE,
)
from tests.fixtures.runtime import bad_inputs  # noqa: E402

FIX = helpers.REPO / "tests" / "fixtures" / "runtime"
PARAMS = {"train_input": {"batch_size": 8, "shuffle_seed": 5}, "runconfig": {}}


def check(name, purpose="train", eval_steps=None):
    ds = bad_inputs.VARIANTS[name](PARAMS)
    return contract.check_dataset(ds, purpose, eval_steps=eval_steps, batch_size=8)


def test_good_input_passes():
    rep = check("good")
    assert rep.ok and rep.warnings == []
    assert rep.info["train_input"]["batch_size"] == 8
    assert rep.info["train_input"]["cardinality"] == tf.data.INFINITE_CARDINALITY


@pytest.mark.parametrize("name", ["labels_none", "dict_features"])
def test_allowed_structures(name):
    assert check(name).ok, check(name).violations


def test_not_a_dataset():
    rep = check("not_dataset")
    assert rep.violations == [f"train_input: {MSG_NOT_DATASET} (got list)"]
    assert MSG_NOT_DATASET == "[Unsupported TensorFlow] Input function must return a Dataset"


def test_single_params_argument():
    assert contract.check_signature(bad_inputs.good) == []
    msgs = contract.check_signature(bad_inputs.two_params)
    assert len(msgs) == 1 and msgs[0].startswith(MSG_SINGLE_PARAM)
    # Model Zoo style: an optional mode parameter is fine
    assert contract.check_signature(lambda params, mode="train": None) == []


@pytest.mark.parametrize("name", ["no_drop_remainder", "unbatched", "mixed_batch"])
def test_inconsistent_batch_sizes(name):
    rep = check(name)
    assert len(rep.violations) == 1
    assert MSG_BATCH in rep.violations[0]
    assert "drop_remainder=True" in rep.violations[0]


def test_batch_message_is_the_seeds():
    assert MSG_BATCH == ("[Unsupported TensorFlow] Inconsistent batch sizes detected. To ensure a "
                         "fixed batch size across all steps, set `drop_remainder=True` when "
                         "batching your Dataset in the input function.")


@pytest.mark.parametrize("name", ["features_only", "three_tuple"])
def test_structure(name):
    rep = check(name)
    assert len(rep.violations) == 1 and MSG_STRUCTURE in rep.violations[0]


def test_training_input_must_repeat():
    rep = check("no_repeat")
    assert len(rep.violations) == 1 and MSG_REPEAT in rep.violations[0]
    assert "8 batch(es)" in rep.violations[0]
    # ... but a finite dataset is right for evaluation
    assert check("no_repeat", purpose="eval").ok


def test_eval_input_that_repeats_needs_eval_steps():
    rep = check("good", purpose="eval")
    assert any("eval_steps" in v for v in rep.violations)
    assert check("good", purpose="eval", eval_steps=3).ok


def test_shared_shuffle_seed_is_warned():
    unseeded = {"train_input": {"batch_size": 8}, "runconfig": {}}
    rep = contract.check_shuffle_seeds(bad_inputs.shared_seed, unseeded)
    assert len(rep.warnings) == 1 and MSG_SHARED_SEED in rep.warnings[0]
    assert "seed2=42" in rep.warnings[0]
    # per-worker seeds from params: no warning
    assert contract.check_shuffle_seeds(bad_inputs.good, PARAMS).warnings == []
    # with a base seed every worker gets its own global seed (base + index), so even a
    # hard-coded op seed shuffles differently per worker: no warning
    assert contract.check_shuffle_seeds(bad_inputs.shared_seed, PARAMS).warnings == []


def test_validate_lists_every_violation():
    params = {"train_input": {"batch_size": 8}, "runconfig": {}}
    run_variant = helpers.REPO / "tests" / "fixtures" / "runtime" / "run_variant.py"
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_variant_fixture", run_variant)
    mod = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(run_variant.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(run_variant.parent))
    rep = contract.validate(bad_inputs.no_repeat_no_drop_remainder, mod.model_fn, params)
    assert len(rep.violations) == 2
    assert any(MSG_BATCH in v for v in rep.violations)
    assert any(MSG_REPEAT in v for v in rep.violations)
    rep = contract.validate(bad_inputs.good, mod.model_fn,
                            {"train_input": {"batch_size": 8, "shuffle_seed": 1}, "runconfig": {}})
    assert rep.ok, rep.violations
    # a model that does not fit the input's shapes is a violation too
    import keras

    def wrong_model(params):
        m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    rep = contract.validate(bad_inputs.good, wrong_model,
                            {"train_input": {"batch_size": 8, "shuffle_seed": 1}, "runconfig": {}})
    assert len(rep.violations) == 1 and rep.violations[0].startswith("model:")

    def uncompiled(params):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])

    rep = contract.validate(bad_inputs.good, uncompiled,
                            {"train_input": {"batch_size": 8, "shuffle_seed": 1}, "runconfig": {}})
    assert any("compiled model" in v for v in rep.violations)


def variant_run(tmp_path, variant, *argv, unseeded=False, model=None):
    import yaml
    p = yaml.safe_load((FIX / "params_variant.yaml").read_text())
    p["train_input"]["variant"] = variant
    if model:
        p["model"] = {"variant": model}
    if unseeded:
        p["train_input"].pop("shuffle_seed", None)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return helpers.run_py(["--params", str(path), "--model_dir", str(tmp_path / "md"), *argv],
                          script=FIX / "run_variant.py", timeout=180)


def test_validate_only_exit_2_lists_every_violation(tmp_path):
    proc = variant_run(tmp_path, "no_repeat_no_drop_remainder", "--mode", "validate_only")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert MSG_BATCH in out and MSG_REPEAT in out
    assert "validate_only: 2 violation(s)" in out
    report = (tmp_path / "md" / "validate_report.txt").read_text()
    assert report.count("ERROR:") == 2


def test_validate_only_exit_0_and_shared_seed_warning(tmp_path):
    proc = variant_run(tmp_path, "shared_seed", "--validate_only", unseeded=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert MSG_SHARED_SEED in out


def test_a_run_refuses_to_train_on_a_bad_input_fn(tmp_path):
    proc = variant_run(tmp_path, "not_dataset", "--mode", "train")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert MSG_NOT_DATASET in out
    assert not (tmp_path / "md" / "performance").exists()


def test_validate_only_on_the_digits_example(tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data)
    proc = helpers.run_py(["--params", str(params), "--model_dir", str(tmp_path / "md"),
                           "--mode", "validate_only"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "satisfy the contract" in out and "train_input: batch_size 64" in out


def test_load_entry_captures_without_training(tmp_path):
    from csrun_runtime.capture import CaptureError, load_entry

    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data)
    entry = load_entry(helpers.DIGITS / "run.py",
                       ["--params", str(params), "--mode", "train", "--max_steps", "7",
                        "--model_dir", str(tmp_path / "md")])
    assert entry.mode == "train" and entry.params["runconfig"]["max_steps"] == 7
    assert entry.input_fn.__name__ == "input_fn" and entry.model_fn.__name__ == "model_fn"
    assert entry.eval_input_fn.__name__ == "eval_input_fn"
    assert not (tmp_path / "md").exists()  # nothing ran
    wp = entry.worker_params(1, 3)
    assert wp["train_input"]["worker_index"] == 1 and wp["train_input"]["shuffle_seed"] == 1235
    ds = entry.input_fn(wp)
    assert ds.element_spec[0].shape.as_list() == [64, 64]
    # a second run.py with its own helper modules does not collide with the first
    e2 = load_entry(FIX / "run_variant.py", ["--params", str(FIX / "params_variant.yaml")])
    assert e2.input_fn(e2.params).element_spec[0].shape.as_list() == [8, 4]
    bad = tmp_path / "norun.py"
    bad.write_text("x = 1\n")
    with pytest.raises(CaptureError, match="did not call"):
        load_entry(bad, [])


def test_compile_only_writes_a_report(tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data)
    md = tmp_path / "md"
    proc = helpers.run_py(["--params", str(params), "--model_dir", str(md), "--mode", "compile_only"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    text = (md / "compile_report.txt").read_text()
    assert "compile time:" in text and "estimated samples/s:" in text
    rec = json.loads((md / "compile_report.json").read_text())
    assert rec["compile_time"] >= 0 and rec["est_samples_per_sec"] > 0
    assert rec["batch_size"] == 64 and rec["timed_steps"] == 20
    assert isinstance(rec["xla"], bool)
    assert not list(md.glob("model-ckpt*"))  # no training


def test_compile_only_says_when_xla_falls_back(tmp_path):
    proc = variant_run(tmp_path, "good", "--mode", "compile_only", model="no_xla")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "XLA compile failed" in out and "falling back" in out
    rec = json.loads((tmp_path / "md" / "compile_report.json").read_text())
    assert rec["xla"] is False and rec["xla_note"].startswith("XLA compile failed")
    assert "TF graph without XLA" in (tmp_path / "md" / "compile_report.txt").read_text()
