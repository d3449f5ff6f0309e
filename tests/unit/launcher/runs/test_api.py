"""launcher/runs/api.py, the Python API of recorded runs: a Run pickles and is attached again in
another process by its run id, job id or model_dir; launch takes csrun_wse's options typed."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runs import api

from .conftest import make_run

ENDED = {"state": "SUCCEEDED", "reason": "exit 0", "time": 1.0, "status": 0}


def test_a_run_pickles_and_attaches_in_another_process(store, tmp_path):
    rec = make_run(store, tmp_path, end=ENDED)
    Path(rec.model_dir).mkdir(parents=True)
    store.save(rec)
    run = api.attach(rec.model_dir)
    again = pickle.loads(pickle.dumps(run))
    assert again == run and again.state() == "SUCCEEDED"
    code = (f"import pickle, sys; from launcher.runs import attach; r = attach({rec.model_dir!r}); "
            "sys.stdout.buffer.write(pickle.dumps((r, r.state())))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd="/", env=os.environ.copy(),
                           timeout=60)
    attached, state = pickle.loads(other.stdout)
    assert attached == run and state == "SUCCEEDED"


def test_launch_takes_csrun_wses_options_typed():
    with pytest.raises(TypeError, match=r"launch\(\): .*nodez"):
        api.wse_flags(nodez=3)
    assert api.wse_flags(nodes=3, use_sbatch=True).layout["nodes"] == 3
    with pytest.raises(api.CsrunError, match="dry_run and check launch nothing"):
        api.launch(["python", "run.py"], dry_run=True)
