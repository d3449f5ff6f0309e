"""A PyTorch-only install runs the README's PyTorch commands (issue 33, item 2): a fresh venv
with ``pip install -e '.[pt]'`` (the local ``torch==2.13.0+cpu`` wheel; no TensorFlow, no
scikit-learn), then ``examples/digits_pt/prepare_data.py`` and the README's ``csrun_wse
--total-nodes 4 --tasks-per-node 1 python-pt examples/digits_pt/run.py --mode train`` on the test
cluster, with that venv's csrun_wse and Python (100 steps instead of the README's 300)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0+cpu"  # scripts/setup.sh's wheel (pip's find-links / cache: no download)


def test_a_pt_only_venv_prepares_and_trains_the_pytorch_example(cli_env, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = {k: v for k, v in cli_env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "-e", f"{REPO}[pt]", TORCH], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    absent = subprocess.run([str(py), "-c", "import importlib.util as u; print([m for m in ('tensorflow', 'sklearn') "
                             "if u.find_spec(m)])"], env=env, capture_output=True, text=True, timeout=60)
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr  # only what the pt extra installs
    data = tmp_path / "data"
    prep = subprocess.run([str(py), str(REPO / "examples/digits_pt/prepare_data.py"), "--out-dir", str(data)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert prep.returncode == 0, prep.stderr[-3000:]
    assert sorted(p.name for p in data.iterdir()) == ["digits-eval.npz", "digits-train.npz"]
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "examples/digits_pt/configs/params.yaml").read_text()
                      .replace("data_dir:", f"data_dir: {data}  # was:", 2))
    md = tmp_path / "md"
    run = subprocess.run([str(venv / "bin" / "csrun_wse"), "--total-nodes", "4", "--tasks-per-node", "1", "python-pt",
                          str(REPO / "examples/digits_pt/run.py"), "--params", str(params), "--mode", "train",
                          "--max_steps", "100", "--model_dir", str(md)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["framework"] == "pytorch" and perf["global_step_end"] == 100
    assert sorted(perf["batches_per_worker"]) == ["0", "1", "2"]  # the chief and 3 input workers
