"""csrun_runtime/tensorflow/runner.py: ``run()``, the one call a run.py makes, in one process with
real TensorFlow (single-process mode, the tiny model of tiny.py, a temporary model_dir, ``exit=False``):
its exit codes (0 trained and evaluated, 2 for bad params or a contract violation, each named in
one line), what the TensorFlow backend's :class:`Hooks` supply the lifecycle, and that importing
the runner sets the quiet logging default without importing TensorFlow."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from csrun_common import exits
from csrun_runtime.tensorflow.contract import Refused
from csrun_runtime.tensorflow.ranks import RankSetupError
from csrun_runtime.tensorflow.runner import Hooks, run
from tests.unit.csrun_runtime.tensorflow import tiny
from tests.unit.paths import REPO

pytestmark = [pytest.mark.tf, pytest.mark.usefixtures("quiet_task")]


def argv(tmp_path, mode: str, *extra: str, **runconfig) -> list[str]:
    return ["--params", str(tiny.write_params(tmp_path, **runconfig)), "--mode", mode, *extra]


def errors(capfd) -> list[str]:
    """The task's error lines on stderr (the lifecycle logs there, as every task does)."""
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR")]


def test_train_and_eval_returns_0_with_the_models_artifacts(tmp_path):
    code = run(tiny.input_fn, tiny.model_fn, tiny.eval_input_fn, argv=argv(tmp_path, "train_and_eval"), exit=False)
    md = tmp_path / "md"
    assert code == 0 and (md / "model-ckpt-6.index").is_file()
    res = json.loads((md / "eval" / "results.json").read_text())
    assert (res["global_step"], res["eval_samples"]) == (6, tiny.EVAL_SAMPLES)
    assert json.loads((md / "performance" / "performance.json").read_text())["mode"] == "train_and_eval"


def test_bad_params_exit_2_naming_the_key(tmp_path, capfd):
    code = run(tiny.input_fn, tiny.model_fn, argv=argv(tmp_path, "train", log_steps=0), exit=False)
    assert code == exits.USAGE
    assert [line for line in errors(capfd) if line.endswith("runconfig.log_steps must be an integer >= 1, got 0")]
    assert not (tmp_path / "md").exists()


def test_a_contract_violation_exits_2_with_each_violation_in_a_line(tmp_path, capfd):
    def model_fn(params):
        return "not a model"

    code = run(tiny.input_fn, model_fn, argv=argv(tmp_path, "train"), exit=False)
    assert code == exits.USAGE
    assert [line for line in errors(capfd) if line.endswith("model: model_fn must return a keras.Model, got str")]
    assert not list((tmp_path / "md").glob("model-ckpt-*"))


def test_the_hooks_map_the_backends_exceptions_and_supply_its_parts():
    hooks = Hooks(tiny.input_fn, tiny.model_fn)
    assert hooks.functions() == (tiny.input_fn, tiny.model_fn, None) and hooks.warnings({}) == []
    refused = hooks.failure(Refused(["train_input: a", "model: b"]), None)
    assert (refused.code, refused.lines, refused.reason) == (exits.USAGE, ("train_input: a", "model: b"),
                                                             "train_input: a; model: b")
    ranks = hooks.failure(RankSetupError("TF_CONFIG: no cluster"), None)
    assert (ranks.code, ranks.lines) == (exits.FAILED, ("TF_CONFIG: no cluster",))
    assert hooks.failure(ValueError("x"), None) is None  # the lifecycle's own ladder decides
    assert hooks.facts.name == "tensorflow"


def test_importing_the_runner_sets_quiet_logging_without_importing_tensorflow():
    code = ("import os, sys; os.environ.pop('TF_CPP_MIN_LOG_LEVEL', None); import csrun_runtime.tensorflow.runner; "
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'], 'tensorflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSRUN_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "False"], out.stderr
