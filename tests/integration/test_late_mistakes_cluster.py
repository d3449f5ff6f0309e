"""Issue 24's "mistakes found late", through the real csrun_wse / csrun_cpu on the test cluster.

Each mistake used to cost a queued job (and 12-26 s, exit 143, one error per task); now it is
refused before anything is submitted, with exit 2 and one line naming the path and the flag or
params field, and the queue is unchanged: ``--params nope.yaml``, a misspelled script, a wrong
``train_input.data_dir``, on the srun and the sbatch path. A csrun option after the command is
not refused (the user's script may take the same name) but warned about once. And
``--mode validate_only`` opens every input file a lazy pipeline lists.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
DIGITS_RUN = str(REPO / "examples" / "digits" / "run.py")
REPORT = str(REPO / "tests" / "fixtures" / "report_task.py")


def csrun(cli, args, env, cwd, timeout=120):
    return subprocess.run([str(BIN / cli), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def mine(env, cwd: Path) -> set[str]:
    """Jobs submitted from ``cwd`` (the test's own directory)."""
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%Z"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return {line.split("|")[0] for line in out.splitlines() if line.partition("|")[2] == str(cwd)}


@pytest.fixture()
def wrong_data_params(tmp_path) -> Path:
    p = yaml.safe_load((REPO / "examples" / "digits" / "configs" / "params.yaml").read_text())
    p["train_input"]["data_dir"] = str(tmp_path / "no_such_data")
    p["eval_input"]["data_dir"] = str(tmp_path / "no_such_data")
    p["runconfig"]["model_dir"] = str(tmp_path / "model_dir")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


@pytest.mark.parametrize("use_sbatch", [False, True])
@pytest.mark.parametrize("mistake", ["params", "script", "data_dir"])
def test_late_mistakes_are_refused_before_submitting(cli_env, tmp_path, wrong_data_params, mistake, use_sbatch):
    args, expect = {
        "params": (["python-ws", DIGITS_RUN, "--params", "nope.yaml", "--mode", "train"],
                   f"csrun_wse: error: --params nope.yaml: {tmp_path / 'nope.yaml'}: no such file ("),
        "script": (["python-ws", "examples/digits/rn.py", "--params", str(wrong_data_params), "--mode", "train"],
                   "csrun_wse: error: script examples/digits/rn.py: "),
        "data_dir": (["python-ws", DIGITS_RUN, "--params", str(wrong_data_params), "--mode", "train"],
                     f"csrun_wse: error: train_input.data_dir (--params {wrong_data_params}): "
                     f"{tmp_path / 'no_such_data'}: no such file or directory ("),
    }[mistake]
    t0 = time.monotonic()
    proc = csrun("csrun_wse", ["--total-nodes", "2", *(["--use-sbatch"] if use_sbatch else []), *args], cli_env,
                 tmp_path)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and proc.stderr.startswith(expect), proc.stderr
    assert "--no-path-checks" in proc.stderr and "Traceback" not in proc.stderr
    assert elapsed < 10, elapsed  # ~0.2 s measured; refused without waiting for any job
    assert mine(cli_env, tmp_path) == set()  # other sessions' jobs may come and go: ours only
    assert not (tmp_path / "model_dir").exists()


def test_a_csrun_option_after_the_command_is_warned_about(cli_env, tmp_path):
    """Not refused (the command may take an option of the same name) but said once, on stderr;
    the command gets its argv unchanged."""
    dry = csrun("csrun_wse", ["--dry-run", "python", REPORT, str(tmp_path), "--total-nodes", "4"], cli_env, tmp_path)
    assert dry.returncode == 0 and dry.stdout.startswith("srun ")
    (line,) = dry.stderr.splitlines()
    assert line.startswith("csrun_wse: warning: --total-nodes after the command python: passed to the command, "
                           "not to csrun_wse; csrun_wse's options go before the command")
    assert mine(cli_env, tmp_path) == set()
    run = csrun("csrun_wse", ["--total-nodes", "2", "--tasks-per-node", "1", "python", REPORT, str(tmp_path),
                              "--total-nodes", "4"], cli_env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("csrun_wse: warning: --total-nodes after the command") == 1
    argvs = [yaml.safe_load(p.read_text())["argv"] for p in tmp_path.glob("task-*.json")]
    assert len(argvs) == 2 and all(a == ["--total-nodes", "4"] for a in argvs)  # 2 nodes: the flag went nowhere else


def test_no_path_checks_lets_the_job_through(cli_env, tmp_path):
    """The escape hatch for clusters whose login node does not see the compute nodes' paths:
    the job is submitted (and here fails on the node, as it would have before)."""
    proc = csrun("csrun_wse", ["--no-path-checks", "--use-sbatch", "--total-nodes", "2", "python", "rn.py"], cli_env,
                 tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), proc.stderr
    job = proc.stdout.strip()
    subprocess.run(["scancel", job], env=cli_env, capture_output=True)


@pytest.fixture(scope="module")
def digits_data(tmp_path_factory) -> Path:
    return helpers.prepare_digits(tmp_path_factory.mktemp("digits") / "data")


def test_validate_only_opens_every_file_a_lazy_pipeline_lists(cli_env, tmp_path, digits_data):
    """The digits pipeline takes ``train_input.data_files`` as given (lazily: a missing file
    fails at the first read, after the launch). validate_only now opens each one."""
    real = sorted(digits_data.glob("train-*.tfrecord"))[0]
    missing = tmp_path / "it's gone.tfrecord"
    params = helpers.digits_params(tmp_path, digits_data, train_input={"data_files": [str(real), str(missing)]},
                                   model_dir=str(tmp_path / "model_dir"))
    args = ["python", DIGITS_RUN, "--params", str(params), "--mode", "validate_only"]
    refused = csrun("csrun_cpu", args, cli_env, tmp_path)  # the launcher sees it first
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"csrun_cpu: error: train_input.data_files (--params {params}): {str(missing)!r}: no such file or directory")
    proc = csrun("csrun_cpu", ["--no-path-checks", *args], cli_env, tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    report = (tmp_path / "model_dir" / "validate_report.txt").read_text()
    (line,) = [ln for ln in report.splitlines() if "input file(s)" in ln]
    assert line.startswith("ERROR: train_input: 1 of the 2 input file(s) the pipeline lists cannot be opened: ")
    assert f"{str(missing)!r} (No such file or directory)" in line and str(real) not in line
    params = helpers.digits_params(tmp_path, digits_data, model_dir=str(tmp_path / "model_dir"))
    ok = csrun("csrun_cpu", args, cli_env, tmp_path, timeout=300)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]


# issue 33 items 7 and 9: PyTorch mistakes found in the job, by the chief or on an input worker,
# each reported once and ending csrun_wse with exit 2 (the chief's own status, not srun's 143 for
# the tasks it ended after it); a raising Dataset.__getitem__ with its type, message and frames.
MISTAKES = str(REPO / "tests" / "fixtures" / "pytorch_mistakes" / "run.py")


@pytest.mark.parametrize("mistake,expect", [
    ("loss", "model: [Unsupported PyTorch] The module's forward(batch) must return the loss"),  # the chief
    ("list", "train_input: [Unsupported PyTorch] The data function must return a torch.utils.data.DataLoader, "
             "got list"),  # an input worker, at its build
    ("drop_last", "train_input: [Unsupported PyTorch] Inconsistent batch sizes detected"),
    ("getitem", "train_input: the DataLoader raised ValueError: sample 5: label out of range (in __getitem__)"),
])
def test_pytorch_mistakes_in_the_job_exit_2_shown_once(cli_env, tmp_path, mistake, expect):
    pytest.importorskip("torch")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "train_input": {"batch_size": 4, "shuffle_seed": 1, "mistake": mistake},
        "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.01},
        "runconfig": {"model_dir": str(tmp_path / "md"), "max_steps": 4, "log_steps": 2}}))
    proc = csrun("csrun_wse", ["--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1", "python-pt",
                               MISTAKES, "--params", str(params), "--mode", "train"], cli_env, tmp_path, timeout=300)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 2, shown[-3000:]
    assert shown.count(expect) == 1 and "Traceback" not in shown, shown[-3000:]
    assert re.search(r"csrun_wse: task 0 \(het group 0, chief\) on node1 failed first: Exited with exit code 2",
                     shown), shown[-3000:]
    if mistake == "getitem":  # the frame in the user's code, after the message
        lines = shown.splitlines()
        at = next(i for i, ln in enumerate(lines) if expect in ln)
        assert lines[at + 1].strip() == f'File "{MISTAKES}", line 25, in __getitem__', shown[-3000:]
        assert lines[at + 2].strip() == 'raise ValueError(f"sample {i}: label out of range")'
        assert "site-packages" not in shown


# issue 33 item 9: before queueing, csrun_wse pulls one batch of the training input on the login
# node (launcher/batchcheck.py): a raising Dataset is refused in seconds with its type, message and
# frame, nothing submitted; a data function slower than the bound gets one note and is queued.
# (The suite's other launches run with CSRUN_BATCH_CHECK_SECS=0: tests/conftest.py.)
FIRST_BATCH_PT = str(REPO / "tests" / "fixtures" / "first_batch" / "run_pt.py")


def _first_batch_params(tmp_path: Path, **train_input) -> Path:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train_input": {"batch_size": 4, **train_input},
                                      "runconfig": {"model_dir": str(tmp_path / "md"), "max_steps": 4}}))
    return params


def test_a_raising_dataset_is_refused_before_queueing(cli_env, tmp_path):
    pytest.importorskip("torch")
    params = _first_batch_params(tmp_path, mistake="getitem")
    start = time.monotonic()
    proc = csrun("csrun_wse", ["--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1", "python-pt",
                               FIRST_BATCH_PT, "--params", str(params), "--mode", "train"],
                 {**cli_env, "CSRUN_BATCH_CHECK_SECS": "60"}, tmp_path)
    elapsed = time.monotonic() - start
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 2, shown[-3000:]
    expect = "csrun_wse: error: train_input: the DataLoader raised ValueError: sample 0: no label (in __getitem__)"
    assert shown.count("sample 0: no label") == 1 and proc.stderr.startswith(expect), shown[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[1].strip() == f'File "{FIRST_BATCH_PT}", line 27, in __getitem__'
    assert lines[2].strip() == 'raise ValueError(f"sample {i}: no label")'
    assert lines[3] == "  (one batch pulled on this host before queueing: nothing submitted; --no-batch-check " \
                       "skips this check)" and len(lines) == 4
    assert "Traceback" not in shown and proc.stdout == ""
    assert elapsed < 30, elapsed  # ~3 s measured: torch's import and one batch
    assert mine(cli_env, tmp_path) == set()  # nothing queued
    assert not (tmp_path / "md").exists()


def test_a_data_function_slower_than_the_bound_is_noted_and_queued(cli_env, tmp_path):
    pytest.importorskip("torch")
    params = _first_batch_params(tmp_path, mistake="slow", sleep=60)
    start = time.monotonic()
    proc = csrun("csrun_wse", ["--use-sbatch", "--total-nodes", "2", "--tasks-per-node", "1", "python-pt",
                               FIRST_BATCH_PT, "--params", str(params), "--mode", "train"],
                 {**cli_env, "CSRUN_BATCH_CHECK_SECS": "1"}, tmp_path)
    elapsed = time.monotonic() - start
    job = proc.stdout.strip()
    try:
        assert proc.returncode == 0 and job.isdigit(), proc.stderr
        assert proc.stderr.count("csrun_wse: note: no batch of the training input within 1 s on this host "
                                 "(checks.batch_secs or CSRUN_BATCH_CHECK_SECS): not checked before queueing") == 1
        assert elapsed < 15, elapsed  # the bound, not the data function's 60 s
        assert {j.split("+")[0] for j in mine(cli_env, tmp_path)} == {job}  # queued (a het job: 91+0, 91+1)
    finally:
        if job.isdigit():
            subprocess.run(["scancel", job], env=cli_env, capture_output=True)
