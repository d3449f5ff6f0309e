"""csrun_runtime/capture.py with a PyTorch run.py: capture mode records the data functions and the
resolved params, trains nothing and imports no TensorFlow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from tests.unit.csrun_runtime.pytorch.test_input_backend import _run_py  # noqa: E402
from tests.unit.paths import REPO  # noqa: E402


def test_capture_records_pytorch_functions_and_resolved_params_without_training_or_tensorflow(tmp_path):
    run_py = _run_py(tmp_path)
    script = textwrap.dedent(f'''
        import json, sys
        from csrun_runtime.capture import load_entry
        e = load_entry({str(run_py)!r}, ["--params", {str(tmp_path / "params.yaml")!r},
                                          "--model_dir", {str(tmp_path / "md")!r}])
        print(json.dumps({{"framework": e.framework, "input_fn": e.input_fn.__name__,
                          "model_fn": e.model_fn.__name__, "eval": e.eval_input_fn,
                          "train_input": e.params["train_input"], "mode": e.mode,
                          "tensorflow": "tensorflow" in sys.modules}}))
    ''')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["framework"] == "pytorch"
    assert (got["input_fn"], got["model_fn"], got["eval"]) == ("train_data_fn", "model_fn", None)
    # default_params_fn applied as the runtime applies it: the YAML's batch_size wins
    assert got["train_input"]["batch_size"] == 4
    assert got["train_input"]["prefetch_factor"] == 2 and got["train_input"]["num_workers"] == 0
    assert got["tensorflow"] is False
    assert not (tmp_path / "md" / "checkpoints").exists()
