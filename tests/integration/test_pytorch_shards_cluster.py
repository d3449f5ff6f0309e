"""What each PyTorch input worker reads, tapped, through ``csrun_wse python-pt`` on the Slurm
test cluster (issue 25: "files disjoint and covering across 6 workers (tap the sample ids)";
docs/PYTORCH.md "Seeds" and "Shard plans"): 6 input workers (the chief on a single-task node,
3 nodes × 2 tasks) each record the sample ids their DataLoader reads and the files it opens
(tests/fixtures/pytorch_tap/run.py). The data function is a Model Zoo-style processor's
``train_input_dataloader`` used as it is (tests/fixtures/modelzoo_pt, the R1.6.1 layout: it
learns its share from ``modelzoo.common.pytorch.cb_model``), with no binding line in run.py:
csrun binds ``cb_model`` itself (issue 33).

- ``DistributedSampler`` with the streamer facts ``cb_model`` answers and the job-wide
  ``shuffle_seed``: the first pass of the 6 workers is disjoint and covers the 600 samples; each
  worker read at most ``runconfig.input_read_ahead_batches`` (32) batches more than the chief
  trained from it.
- ``--shard-plan`` over a data_dir-only dataset: every worker's ``data_dir`` is its view of the
  plan, so it opens exactly its plan files (and one streamer's share of them is everything): the
  files are disjoint and cover the set, and so are the ids.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from csrun_runtime.pytorch.remote import READ_AHEAD_BATCHES

pytest.importorskip("torch")

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TAP = str(REPO / "tests" / "fixtures" / "pytorch_tap" / "run.py")
#: the chief alone on node1, 3 nodes × 2 input workers
LAYOUT = ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]
WORKERS, SAMPLES, BATCH = 6, 600, 10


def _launch(tmp: Path, env: dict, train_input: dict, extra: list[str] = ()) -> tuple[Path, Path]:
    import yaml

    tap = tmp / "tap"
    tap.mkdir()
    params = {"train_input": {"batch_size": BATCH, "shuffle_seed": 77, "num_workers": 0, "tap_dir": str(tap),
                              **train_input},
              "model": {"step_pace_ms": 20},
              "runconfig": {"max_steps": 300, "log_steps": 100, "checkpoint_steps": 0}}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    md = tmp / "md"
    proc = subprocess.run([str(BIN / "csrun_wse"), *LAYOUT, *extra, "python-pt", TAP, "--params", str(path),
                           "--model_dir", str(md), "--mode", "train"], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tap, md


def _by_worker(tap: Path, md: Path, suffix: str) -> dict[int, list[str]]:
    """Each input worker's tap (lines of ``<host>-<pid><suffix>``), keyed by its index (its
    report names its pid). One other process may build the DataLoader: the chief, which checks
    the contract of input worker 0's without iterating it (no ids)."""
    pids = {json.loads(p.read_text())["pid"]: int(p.name.split(".")[0])
            for p in md.glob(".csrun/*/workers/*.report.json")}
    out: dict[int, list[str]] = {}
    others = []
    for f in tap.glob(f"*{suffix}"):
        pid = int(f.name[:-len(suffix)].rsplit("-", 1)[1])
        if pid in pids:
            out[pids[pid]] = f.read_text().split()
        else:
            others.append(f.name)
    assert len(others) <= (1 if suffix == ".files" else 0), (others, sorted(pids))
    return out


def test_distributed_sampler_shares_are_disjoint_and_cover_the_samples(cli_env, tmp_path):
    tap, md = _launch(tmp_path, cli_env, {"num_samples": SAMPLES})
    got = _by_worker(tap, md, ".ids")
    assert sorted(got) == list(range(WORKERS))
    share = SAMPLES // WORKERS
    first = {i: [int(x) for x in ids[:share]] for i, ids in got.items()}  # the first pass (num_workers 0: in order)
    assert all(len(v) == share for v in first.values()), {i: len(v) for i, v in first.items()}
    seen = [s for v in first.values() for s in v]
    assert len(set(seen)) == len(seen) == SAMPLES  # disjoint
    assert set(seen) == set(range(SAMPLES))  # covering
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == 300
    assert sum(perf["batches_per_worker"].values()) == 300, perf["batches_per_worker"]
    # the read-ahead bound (runconfig.input_read_ahead_batches, default 32): what each worker took from
    # its DataLoader beyond what the chief trained from it (issue 33: 940 batches read for 60 steps)
    reports = {int(p.name.split(".")[0]): json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/*.report.json")}
    ahead = {i: r["batches"] - perf["batches_per_worker"].get(str(i), 0) for i, r in reports.items()}
    assert all(0 <= a <= READ_AHEAD_BATCHES for a in ahead.values()), ahead


def test_a_shard_plan_gives_each_worker_its_files_through_data_dir(cli_env, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    files = [data / f"part-{k:02d}.ids" for k in range(12)]
    for k, f in enumerate(files):
        f.write_text("".join(f"{k * 50 + j}\n" for j in range(50)))
    (data / "README.txt").write_text("not data: stays visible to every worker\n")
    plan = tmp_path / "plan.json"
    made = subprocess.run([str(BIN / "cs_input_analyzer"), "shard-plan", str(data / "*.ids"), "--workers",
                           str(WORKERS), "-o", str(plan)], env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    tap, md = _launch(tmp_path, cli_env, {"data_dir": str(data)}, ["--shard-plan", str(plan)])
    opened = _by_worker(tap, md, ".files")
    planned = {int(w["index"]): sorted(Path(f).name for f in w["files"])
               for w in json.loads(plan.read_text())["workers"]}
    assert {i: sorted(v) for i, v in opened.items()} == planned
    names = [n for v in opened.values() for n in v]
    assert len(set(names)) == len(names) == len(files)  # disjoint and covering
    ids = _by_worker(tap, md, ".ids")
    for i, v in ids.items():
        own = {int(n.split("-")[1].split(".")[0]) for n in planned[i]}
        assert {int(x) // 50 for x in v} == own, (i, planned[i])  # every id read comes from its own files
