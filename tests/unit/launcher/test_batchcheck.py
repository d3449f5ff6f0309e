"""One batch before queueing (issue 33 item 9): launcher/batchcheck.py's decision (when the check
runs, its argv, its bound) and its run (a child process group killed over the bound), on real
run.py files: a PyTorch Dataset that raises and a TensorFlow ``map`` function that raises
(through the subprocess, as csrun_wse runs it)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from csrun_common.env import BATCH_CHECK_SECS
from csrun_common.errors import CsrunError
from launcher import batchcheck
from tests.unit.paths import REPO

RUN_PT = REPO / "tests" / "fixtures" / "first_batch" / "run_pt.py"
RUN_TF = REPO / "tests" / "fixtures" / "first_batch" / "run_tf.py"


def _plan(command, **kw):
    args = {"secs": 20, "container": False, "workers": 3, "cpus": 1, "cwd": REPO}
    return batchcheck.plan(command, **{**args, **kw})


def test_a_training_run_py_is_checked_as_input_worker_0_of_the_jobs_w():
    check = _plan(["/usr/bin/python3", str(RUN_PT), "--params", "p.yaml", "--mode", "train"], workers=5)
    assert check is not None and check.secs == 20
    assert check.argv == ("/usr/bin/python3", "-m", "csrun_runtime.first_batch", "--workers", "5", "--cpus", "1",
                          str(RUN_PT), "--params", "p.yaml", "--mode", "train")
    no_mode = _plan(["python", str(RUN_PT.relative_to(REPO))])  # the params' mode: the runtime decides
    assert no_mode is not None and no_mode.argv[-1] == str(RUN_PT.relative_to(REPO))
    assert _plan(["python", str(RUN_PT), "--mode=train_and_eval"]) is not None


def test_the_cpus_are_capped_at_this_hosts():
    import os

    check = _plan(["python", str(RUN_PT)], cpus=10_000)
    assert check is not None and check.argv[6] == str(len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("command,kw", [
    (["python", str(RUN_PT)], {"skipped_by": "--no-batch-check"}),
    (["python", str(RUN_PT)], {"skipped_by": "--dry-run"}),
    (["python", str(RUN_PT)], {"secs": 0}),  # checks.batch_secs = 0 / CSRUN_BATCH_CHECK_SECS=0
    (["python", str(RUN_PT)], {"container": True}),  # this host's Python may lack the image's packages
    (["python", str(RUN_PT), "--mode", "validate_only"], {}),
    (["python", str(RUN_PT), "--mode", "eval"], {}),
    (["python", str(RUN_PT), "--compile_only"], {}),
    (["python", "-m", "csrun_runtime.supervise", str(RUN_PT)], {}),
    (["bash", "-c", "true"], {}),
    (["python", str(REPO / "tests" / "fixtures" / "report_task.py")], {}),  # not a csrun run.py: it would run whole
    (["python", "no_such_run.py"], {}),
])
def test_when_the_check_does_not_run(command, kw):
    assert _plan(command, **kw) is None


def test_the_bound_comes_from_the_environment_over_the_site_key():
    assert batchcheck.bound(30, {}) == 30
    assert batchcheck.bound(30, {BATCH_CHECK_SECS: "0"}) == 0
    assert batchcheck.bound(30, {BATCH_CHECK_SECS: "5"}) == 5
    assert batchcheck.bound(30, {BATCH_CHECK_SECS: ""}) == 30
    for bad in ("-1", "soon"):
        with pytest.raises(CsrunError, match=f"^{BATCH_CHECK_SECS}='{bad}': must be a whole number"):
            batchcheck.bound(30, {BATCH_CHECK_SECS: bad})


def test_over_the_bound_the_process_group_is_killed_and_a_note_says_so(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f" open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start = time.monotonic()
    out = batchcheck.run(batchcheck.BatchCheck(argv=(sys.executable, "-c", code), secs=1))
    assert out.status == "timeout" and time.monotonic() - start < 5
    assert batchcheck.note(out, 1) == (f"no batch of the training input within 1 s on this host (checks.batch_secs "
                                       f"or {BATCH_CHECK_SECS}): not checked before queueing")
    pid = int(pid_file.read_text())
    for _ in range(50):  # the grandchild (a DataLoader worker's place) went with the group
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {pid} of the check's group survived")


def _params(tmp_path: Path, **train_input) -> Path:
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"train_input": {"batch_size": 4, **train_input},
                                 "runconfig": {"max_steps": 2, "model_dir": str(tmp_path / "md")}}))
    return p


def test_a_raising_dataset_is_shown_with_its_type_message_and_frame(tmp_path):
    pytest.importorskip("torch")
    params = _params(tmp_path, mistake="getitem")
    check = _plan([sys.executable, str(RUN_PT), "--params", str(params), "--mode", "train"], workers=2)
    out = batchcheck.run(check, cwd=tmp_path)
    assert out.status == "user_error", out
    lines = out.text.splitlines()
    assert lines[0] == "train_input: the DataLoader raised ValueError: sample 0: no label (in __getitem__)"
    assert lines[1].strip() == f'File "{RUN_PT}", line 27, in __getitem__'
    assert lines[2].strip() == 'raise ValueError(f"sample {i}: no label")' and len(lines) == 3


def test_a_tensorflow_map_function_that_raises_exits_2(tmp_path):
    pytest.importorskip("tensorflow")
    check = _plan([sys.executable, str(RUN_TF), "--params", str(_params(tmp_path, mistake="map")), "--mode", "train"],
                  secs=120)
    out = batchcheck.run(check, cwd=tmp_path)
    assert out.status == "user_error", out
    lines = out.text.splitlines()
    assert lines[0] == "train_input: input_fn raised KeyError: \"feature 'pixels' missing\" (in parse)", out.text
    raise_line = RUN_TF.read_text().splitlines().index('    raise KeyError("feature \'pixels\' missing")') + 1
    assert lines[-2].strip() == f'File "{RUN_TF}", line {raise_line}, in parse'
    assert lines[-1].strip() == "raise KeyError(\"feature 'pixels' missing\")"
