"""Several PyTorch trainer ranks through ``csrun_wse python-pt`` on the Slurm test cluster
(issue 32, docs/MULTI-RANK.md): 2 chief nodes × 2 ranks (world size 4, gloo on CPU) and 8 input
workers, 2 per rank (each rank's own with ``--chief-input-cpus 1``, and 4 on 2 worker nodes).
One job, shared by every assertion (module-scoped): it trains the tap fixture
(tests/fixtures/pytorch_tap: each input worker taps the sample ids its DataLoader reads) with
``--requeue``; once training runs, the input worker of rank 1 on a worker node (worker 5, rank
1's slot 1) is killed and replaced, then ``scancel --signal=USR2`` (``--requeue``'s signal)
stops all ranks, csrun_wse launches again and the second allocation trains to ``max_steps``
(at full pace: the params file is rewritten before the signal). The site config leaves the
chief's GRES empty (gpu:1 is on node1 only).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TAP = str(REPO / "tests" / "fixtures" / "pytorch_tap" / "run.py")
LAYOUT = ["--total-nodes", "4", "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-nodes", "2",
          "--chief-tasks-per-node", "2", "--chief-input-cpus", "1"]
WORLD, WORKERS, SAMPLES, BATCH, MAX_STEPS = 4, 8, 800, 10, 1000


def _params(path: Path, tap: Path, pace_ms: int) -> None:
    import yaml

    path.write_text(yaml.safe_dump({
        "train_input": {"batch_size": BATCH, "shuffle_seed": 77, "num_workers": 0, "tap_dir": str(tap),
                        "num_samples": SAMPLES},
        "model": {"step_pace_ms": pace_ms},
        "runconfig": {"max_steps": MAX_STEPS, "log_steps": 50, "checkpoint_steps": 0}}))


def _wait(what: str, ok, proc: subprocess.Popen, log: Path, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        assert proc.poll() is None, f"csrun_wse ended ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.3)


def _tapped(tap: Path, pid: int) -> int:
    """Sample ids process ``pid``'s DataLoader read so far (its tap file's lines)."""
    files = list(tap.glob(f"*-{pid}.ids"))
    return len(files[0].read_text().split()) if files else 0


def _registration(md: Path, rank: int, slot: int, attempt: int) -> dict | None:
    for f in md.glob(f".csrun/*.rank{rank}/workers/{slot}.json"):
        try:
            reg = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if int(reg.get("attempt") or 0) == attempt and reg.get("status") == "ok":
            return reg
    return None


@pytest.fixture(scope="module")
def ranks_job(slurm_cluster, tmp_path_factory):
    """The one job (module docstring): its exit status, output, model_dir, tap and the killed
    worker's registration."""
    root = tmp_path_factory.mktemp("ranks")
    tap, md, params, log = root / "tap", root / "md", root / "params.yaml", root / "csrun_wse.log"
    tap.mkdir()
    _params(params, tap, pace_ms=40)
    cfg = root / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n')
    env = dict(slurm_cluster["env"], CSRUN_CONFIG=str(cfg))
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "csrun_wse"), "--requeue", *LAYOUT, "python-pt", TAP, "--params",
                                 str(params), "--model_dir", str(md), "--mode", "train"], env=env, cwd=root,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait("global step 50", lambda: "csrun:global_step = 50," in log.read_text(), proc, log)
        killed = _wait("rank 1's worker 5", lambda: _registration(md, 1, 1, 0), proc, log)
        os.kill(int(killed["pid"]), signal.SIGKILL)
        new = _wait("worker 5's replacement", lambda: _registration(md, 1, 1, 1), proc, log)
        # it streams: its tap holds a first pass (it reads ahead of training), then rank 1 trains on it a while
        _wait("the replacement's reads", lambda: _tapped(tap, new["pid"]) >= SAMPLES // WORKERS, proc, log, 120.0)
        time.sleep(3.0)
        job = re.search(r"srun: job (\d+)", log.read_text()) or re.search(r"job (\d+)", log.read_text())
        _params(params, tap, pace_ms=0)  # the next allocation reads it: trains the rest at full pace
        jobs = subprocess.run(["squeue", "--noheader", "--format=%i", "--name=csrun_wse"], env=env,
                              capture_output=True, text=True).stdout.split()
        targets = sorted({j.split("+")[0] for j in jobs}) or ([job.group(1)] if job else [])
        assert targets, log.read_text()[-3000:]
        subprocess.run(["scancel", "--signal=USR2", *targets], env=env, check=True, capture_output=True)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    return {"code": code, "out": log.read_text(), "md": md, "tap": tap, "killed": killed,
            "seconds": time.monotonic() - t0}


def _allocations(md: Path) -> list[dict]:
    return json.loads((md / "performance" / "allocations.json").read_text())["allocations"]


def test_four_ranks_train_to_the_end_with_identical_weights(ranks_job):
    out = ranks_job["out"]
    assert ranks_job["code"] == 0, out[-4000:]
    perf = json.loads((ranks_job["md"] / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS and perf["world_size"] == WORLD
    ranks = perf["ranks"]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    assert all(r["global_step_end"] == MAX_STEPS and r["steps"] == perf["steps"] for r in ranks), ranks
    assert len({r["weights_sha256"] for r in ranks}) == 1 and perf["weights_identical"] is True
    assert all(r["samples_per_sec"] > 0 for r in ranks)
    assert perf["world_samples_per_sec"] == pytest.approx(sum(r["samples_per_sec"] for r in ranks), abs=0.05)
    for r in range(WORLD):  # the verdict names each rank's input wait, then the slowest rank
        assert re.search(rf"rank {r} \(node\d\): input wait [0-9.]+ %", out), out[-3000:]
    assert "slowest rank: " in out and "weights identical on every rank" in out


def test_one_set_of_artifacts_written_by_rank_zero(ranks_job):
    md = ranks_job["md"]
    assert sorted(p.relative_to(md) for p in md.rglob("performance.json")) == [Path("performance/performance.json")]
    assert {p.parent for p in md.rglob("*.pt")} == {md}
    assert len(list(md.rglob("params_train.yaml"))) == 1
    events = list(md.rglob("events.out.tfevents.*"))
    assert len(events) == len(_allocations(md)) == 2 and {p.parent for p in events} == {md}, events


def test_each_ranks_first_pass_is_disjoint_and_the_union_covers_the_data(ranks_job):
    md, tap = ranks_job["md"], ranks_job["tap"]
    job1 = _allocations(md)[0]["job_id"]
    share = SAMPLES // WORKERS
    by_rank: dict[int, list[int]] = {r: [] for r in range(WORLD)}
    for r in range(WORLD):
        reports = list(md.glob(f".csrun/{job1}.*.rank{r}/workers/*.report.json"))
        assert len(reports) == WORKERS // WORLD, reports
        for rep_file in reports:
            rep = json.loads(rep_file.read_text())
            g = int(rep_file.name.split(".")[0]) * WORLD + r
            assert rep["streaming_rank"] == g and rep["num_streamers"] == WORKERS, rep
            pid = ranks_job["killed"]["pid"] if rep["attempt"] else rep["pid"]  # worker 5: its first process's
            (ids,) = [f for f in tap.glob(f"*-{pid}.ids")]
            first = [int(x) for x in ids.read_text().split()[:share]]
            assert len(first) == share
            by_rank[r] += first
    seen = [s for ids in by_rank.values() for s in ids]
    assert len(set(seen)) == len(seen) == SAMPLES and set(seen) == set(range(SAMPLES))  # disjoint, covering


def test_a_killed_worker_of_rank_one_is_replaced_and_rank_one_trains_on(ranks_job):
    md, out, killed = ranks_job["md"], ranks_job["out"], ranks_job["killed"]
    job1 = _allocations(md)[0]["job_id"]
    (report,) = md.glob(f".csrun/{job1}.*.rank1/workers/1.report.json")
    rep = json.loads(report.read_text())
    assert rep["attempt"] == 1 and rep["batches"] > 0 and rep["torch_seed"] == killed["torch_seed"]
    assert re.search(rf"\[rank 1 node\d\] .*input worker 1 on {killed['node']} \(pid {killed['pid']}\) lost", out)
    assert _allocations(md)[0]["end_step"] > 50  # every rank, rank 1 too, trained past the kill


def test_requeue_resumes_all_four_ranks_from_the_same_step(ranks_job):
    out = ranks_job["out"]
    allocs = _allocations(ranks_job["md"])
    assert "launching again (requeue 1 of" in out, out[-3000:]
    assert len(allocs) == 2 and allocs[0]["stopped_by"] == "SIGUSR2" and allocs[1]["requeue"] == 1, allocs
    step = allocs[0]["end_step"]
    assert step == allocs[1]["start_step"] > 0 and allocs[1]["end_step"] == MAX_STEPS  # 0 steps lost
    assert f"restored {ranks_job['md']}/model-ckpt-{step}.pt (global step {step})" in out  # rank 0's line
    # every rank resumed from that step: each trained the rest, to the target (csrun_wse shows the
    # other ranks' warnings only, so their own "restored" lines are not in its output)
    ranks = json.loads((ranks_job["md"] / "performance" / "performance.json").read_text())["ranks"]
    assert [(r["steps"], r["global_step_end"]) for r in ranks] == [(MAX_STEPS - step, MAX_STEPS)] * WORLD, ranks
    print(f"ranks job: {ranks_job['seconds']:.0f} s")
