"""Exactly-once input across faults (issue 41, docs/RESILIENCE.md "The input position"), through
``csrun_wse`` on the Slurm test cluster with real frameworks. Each test is one run with all three
faults (tests/integration/judge.py ``run_with_faults``): an input worker SIGKILLed mid-pass,
``--requeue``'s signal mid-pass, and the chief SIGKILLed and the run resubmitted; the model logs
the sample ids it trains with its global step, and the judge checks that every step was trained
and every trained batch is the next unread batch of its worker's uninterrupted stream."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .judge import judge, pt_streams, run_with_faults, tf_streams, trained

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PT_RUN = str(REPO / "tests" / "fixtures" / "exactly_once" / "pt_run.py")
TF_RUN = str(REPO / "tests" / "fixtures" / "exactly_once" / "tf_run.py")
LAYOUT = ["--total-nodes", "4", "--tasks-per-node", "1", "--cpus-per-task", "1"]  # chief + 3 input workers
STEPS, EVERY = 600, 100
TF_STEPS = 800  # a TensorFlow worker's replacement takes ~20 s to stream again here


def _params(root: Path, **train_input) -> tuple[Path, dict]:
    import yaml

    tdir = root / "trained"
    tdir.mkdir()
    params = {"train_input": {"batch_size": 8, "shuffle_seed": 5, "num_samples": 400, **train_input},
              "model": {"trained_dir": str(tdir), "step_pace_ms": 25},
              "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.01},
              "runconfig": {"max_steps": STEPS, "log_steps": 25, "checkpoint_steps": EVERY}}
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path, params


def _allocation_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "input resumed at the positions of checkpoint" in line]


def test_pytorch_map_style_input_is_trained_exactly_once_through_every_fault(cli_env, tmp_path):
    pytest.importorskip("torch")
    path, params = _params(tmp_path, num_workers=1)  # DataLoader worker processes
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", *LAYOUT, "python-pt", PT_RUN, "--params", str(path),
            "--model_dir", str(md), "--mode", "train"]
    codes = run_with_faults(argv, cli_env, tmp_path, log, md, tmp_path / "trained", kill_worker_at=75)
    out = log.read_text()
    assert codes[0] != 0 and codes[1] == 0, (codes, out[-4000:])
    # the judge: every step, each batch the next unread one of its worker's stream
    given = judge(trained(tmp_path / "trained")[0], pt_streams(params, range(3), 3, STEPS), STEPS)
    assert sum(given.values()) == STEPS and all(given.values()), given
    # what the terminal said: the replacement's resume, and each restart's
    assert "input worker 1 (replacement 1) resumed its stream at batch " in out, out[-4000:]
    assert "skipped at the sampler, no sample read" in out
    resumed = _allocation_lines(out)
    perf = json.loads((md / "performance" / "performance.json").read_text())
    pos = perf["input_positions"]
    restored = pos["restored_step"]
    assert len(resumed) == 2 and f"model-ckpt-{restored}:" in resumed[1] and restored % EVERY == 0, resumed
    assert sum(pos["start"].values()) == restored and sum(pos["end"].values()) == STEPS, pos
    assert not any(pos["batches_missing"].values()), pos
    allocs = json.loads((md / "performance" / "allocations.json").read_text())["allocations"]
    assert allocs[0]["stopped_by"] == "SIGUSR2" and allocs[-1]["end_step"] == STEPS, allocs


def _tf_params(root: Path, transport: str) -> tuple[Path, dict]:
    """The TensorFlow fixture's params: 9 TFRecord files of 40 records, 3 files a worker (sharded
    by TF_CONFIG), a 64-record shuffle buffer, batches of 8."""
    import yaml

    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "modelzoo_style"))
    from make_data import write

    write(str(root / "data"), files=9, records=40)
    tdir = root / "trained"
    tdir.mkdir()
    params = {"train_input": {"data_dir": str(root / "data"), "batch_size": 8, "shuffle_seed": 5,
                              "shuffle_buffer": 64, "n_parallel_reads": 2},
              "model": {"trained_dir": str(tdir), "step_pace_ms": 40},
              "runconfig": {"max_steps": TF_STEPS, "log_steps": 25, "checkpoint_steps": EVERY, "jit_compile": False,
                            "transport": transport, "input_bundle": 8}}
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path, params


@pytest.mark.parametrize("transport", ["dataplane"])
def test_tensorflow_sharded_shuffled_input_is_trained_exactly_once_through_every_fault(cli_env, tmp_path, transport):
    pytest.importorskip("tensorflow")
    path, params = _tf_params(tmp_path, transport)
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", *LAYOUT, "python-ws", TF_RUN, "--params", str(path),
            "--model_dir", str(md), "--mode", "train"]
    codes = run_with_faults(argv, cli_env, tmp_path, log, md, tmp_path / "trained", kill_worker_at=50)
    out = log.read_text()
    assert codes[0] != 0 and codes[1] == 0, (codes, out[-4000:])
    streams = tf_streams(params, range(3), 3, TF_STEPS, files_listed=transport == "dataplane")
    given = judge(trained(tmp_path / "trained")[0], streams, TF_STEPS)
    assert sum(given.values()) == TF_STEPS and all(given.values()), given
    assert "input worker 1 (replacement 1) resumed its stream at batch " in out, out[-4000:]
    resumed = _allocation_lines(out)
    perf = json.loads((md / "performance" / "performance.json").read_text())
    pos = perf["input_positions"]
    assert len(resumed) == 2 and f"model-ckpt-{pos['restored_step']}:" in resumed[1], resumed
    assert sum(pos["start"].values()) == pos["restored_step"] and sum(pos["end"].values()) == TF_STEPS, pos
    assert not any(pos["batches_missing"].values()), pos
