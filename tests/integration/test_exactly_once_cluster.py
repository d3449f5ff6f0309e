"""Exactly-once input across faults (issue 41, docs/RESILIENCE.md "The input position"), through
``csrun_wse`` on the Slurm test cluster with real frameworks. Each test is one run with all three
faults (tests/integration/judge.py ``run_with_faults``): an input worker SIGKILLed mid-pass,
``--requeue``'s signal mid-pass, and the chief SIGKILLed and the run resubmitted; the model logs
the sample ids it trains with its global step, and the judge checks that every step was trained
and every trained batch is the next unread batch of its worker's uninterrupted stream."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .judge import judge, logged_after, pt_streams, run_with_faults, tf_streams, trained, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PT_RUN = str(REPO / "tests" / "fixtures" / "exactly_once" / "pt_run.py")
TF_RUN = str(REPO / "tests" / "fixtures" / "exactly_once" / "tf_run.py")
LAYOUT = ["--total-nodes", "4", "--tasks-per-node", "1", "--cpus-per-task", "1"]  # chief + 3 input workers
STEPS, EVERY = 1000, 100
#: Seconds each step sleeps in the first allocation (a replacement resumes 10-20 s after the kill
#: here: the kill and the requeue fall in the same pass and allocation), then in the others.
SLOW, FAST = 0.05, 0.01


def _write(path: Path, params: dict, pace: float) -> None:
    import yaml

    params["model"]["step_pace_ms"] = pace * 1000
    path.write_text(yaml.safe_dump(params))


def _params(root: Path, **train_input) -> tuple[Path, dict]:
    tdir = root / "trained"
    tdir.mkdir()
    params = {"train_input": {"batch_size": 8, "shuffle_seed": 5, "num_samples": 400, **train_input},
              "model": {"trained_dir": str(tdir)},
              "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.01},
              "runconfig": {"max_steps": STEPS, "log_steps": 25, "checkpoint_steps": EVERY}}
    path = root / "params.yaml"
    _write(path, params, SLOW)
    return path, params


def _check_the_record(out: str, md: Path, world: int = 1, worker: int = 1) -> dict:
    """What every test's run said and recorded: the replacement's resume line (input worker
    ``worker``'s), one line for each
    restart's resume (the requeue's, from the step it stopped at, 0 steps lost; the resubmission's,
    from a periodic checkpoint), three launches, and performance.json's ``input_positions`` of the
    last allocation (``world`` trainer ranks: a batch each a step). Returns performance.json."""
    assert f"input worker {worker} (replacement 1) resumed its stream at batch " in out, out[-4000:]
    resumed = [line for line in out.splitlines() if "input resumed at the positions of checkpoint" in line]
    m = re.search(r"stopped by SIGUSR2 at global step (\d+): checkpoint model-ckpt-\1 saved", out)
    assert m and f"training from global step {m.group(1)} to {STEPS}" in out, out[-3000:]  # 0 steps lost
    assert out.count("Launching: srun ") == 3 and "launching again (requeue 1 of 3)" in out
    # each launch's done.json as the input workers read it: the requeue's chief "stopped" (both
    # frameworks: csrun_runtime.lifecycle), the SIGKILLed one none, the last "ok"; with several
    # trainer ranks a rank that outlived the SIGKILLed one may say "failed" first, naming the collective
    # (or be ended by srun before it writes)
    done = [json.loads(p.read_text()) for p in md.glob(".csrun/*/done.json")]
    statuses = {d["status"] for d in done}
    assert statuses - {"failed"} == {"ok", "stopped"} and ("failed" not in statuses or world > 1), done
    assert all("another rank died" in d["reason"] for d in done if d["status"] == "failed"), done
    perf = json.loads((md / "performance" / "performance.json").read_text())
    pos = perf["input_positions"]
    restored = pos["restored_step"]
    assert len(resumed) == 2 and f"model-ckpt-{m.group(1)}:" in resumed[0], resumed
    assert f"model-ckpt-{restored}:" in resumed[1] and restored % EVERY == 0, resumed
    assert sum(pos["start"].values()) == world * restored and sum(pos["end"].values()) == world * STEPS, pos
    assert not any(pos["batches_missing"].values()), pos
    return perf


def test_pytorch_map_style_input_is_trained_exactly_once_through_every_fault(cli_env, tmp_path):
    """Input worker 0 runs in the chief's task (``--chief-input-cpus 1``) and streams through a
    shared-memory ring (docs/DATAPLANE.md "Co-located input workers"); it is the worker killed, and
    its replacement streams through a ring of its own: the judge's sample ids came out of the rings
    intact. Workers 1 and 2 are tasks on the other nodes, over TCP."""
    pytest.importorskip("torch")
    path, params = _params(tmp_path, num_workers=1)  # DataLoader worker processes
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task",
            "1", "--chief-input-cpus", "1", "python-pt", PT_RUN, "--params", str(path),
            "--model_dir", str(md), "--mode", "train"]
    codes = run_with_faults(argv, cli_env, tmp_path, log, md, tmp_path / "trained", kill_worker_at=75, worker=0,
                            speed_up=lambda: _write(path, params, FAST))
    out = log.read_text()
    assert codes[0] != 0 and codes[1] == 0, (codes, out[-4000:])
    # the judge: every step, each batch the next unread one of its worker's stream
    given = judge(trained(tmp_path / "trained")[0], pt_streams(params, range(3), 3, STEPS), STEPS)
    assert sum(given.values()) == STEPS and all(given.values()), given
    perf = _check_the_record(out, md, worker=0)
    assert "skipped at the sampler, no sample read" in out
    # the last allocation: worker 0 through its ring, the others (other nodes) over TCP
    shared = perf["dataplane_shm"]
    assert shared["ring_bytes"] == 256 << 20 and set(shared["bundles_per_worker"]) == {"0"}, shared
    assert "a shared-memory ring of 256 MiB for each input worker on this node" in out


def _tf_params(root: Path, transport: str) -> tuple[Path, dict]:
    """The TensorFlow fixture's params: 9 TFRecord files of 40 records, 3 files a worker (sharded
    by TF_CONFIG), a 64-record shuffle buffer, batches of 8, 8 batches a bundle."""
    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "modelzoo_style"))
    from make_data import write

    write(str(root / "data"), files=9, records=40)
    tdir = root / "trained"
    tdir.mkdir()
    params = {"train_input": {"data_dir": str(root / "data"), "batch_size": 8, "shuffle_seed": 5,
                              "shuffle_buffer": 64, "n_parallel_reads": 2},
              "model": {"trained_dir": str(tdir)},
              "runconfig": {"max_steps": STEPS, "log_steps": 25, "checkpoint_steps": EVERY, "jit_compile": False,
                            "transport": transport, "input_bundle": 8}}
    path = root / "params.yaml"
    _write(path, params, SLOW)
    return path, params


@pytest.mark.parametrize("transport", ["dataplane", "service"])
def test_tensorflow_sharded_shuffled_input_is_trained_exactly_once_through_every_fault(cli_env, tmp_path, transport):
    pytest.importorskip("tensorflow")
    path, params = _tf_params(tmp_path, transport)
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", *LAYOUT, "python-ws", TF_RUN, "--params", str(path),
            "--model_dir", str(md), "--mode", "train"]
    codes = run_with_faults(argv, cli_env, tmp_path, log, md, tmp_path / "trained", kill_worker_at=50,
                            speed_up=lambda: _write(path, params, FAST))
    out = log.read_text()
    assert codes[0] != 0 and codes[1] == 0, (codes, out[-4000:])
    streams = tf_streams(params, range(3), 3, STEPS, files_listed=transport == "dataplane")
    given = judge(trained(tmp_path / "trained")[0], streams, STEPS)
    assert sum(given.values()) == STEPS and all(given.values()), given
    perf = _check_the_record(out, md)
    # each launch on its own transport (the data plane's receiver, or a dispatcher per worker)
    plane, service = out.count("data plane: one receiver at tcp://"), out.count("tf.data service: ")
    assert (plane, service) == ((3, 0) if transport == "dataplane" else (0, 3)), (plane, service)
    if transport == "dataplane":
        assert perf["transport"] == "dataplane" and perf["dataplane_errors"] == []
        assert all(w["errors"] == 0 for w in perf["dataplane"].values()), perf["dataplane"]


def test_two_trainer_ranks_and_a_stateful_iterable_dataset_are_trained_exactly_once(slurm_cluster, tmp_path):
    """2 PyTorch trainer ranks (DDP, gloo) on one node, 2 input workers each (the job's 4 on 2
    nodes), each streaming an IterableDataset with state_dict / load_state_dict (DataLoader
    num_workers 0): its state is restored at each resume. Rank 0's input worker 2 is killed; the
    chief killed is rank 0's. Each rank's trained sequence is judged against its own workers'."""
    pytest.importorskip("torch")
    path, params = _params(tmp_path, num_workers=0, iterable=True)
    cfg = tmp_path / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n')  # the test cluster's gpu:1 is on node1 only
    env = dict(slurm_cluster["env"], CSRUN_CONFIG=str(cfg))
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", "--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task",
            "1", "--chief-nodes", "1", "--chief-tasks-per-node", "2", "python-pt", PT_RUN, "--params", str(path),
            "--model_dir", str(md), "--mode", "train"]
    codes = run_with_faults(argv, env, tmp_path, log, md, tmp_path / "trained", kill_worker_at=75, worker=1,
                            rank=0, speed_up=lambda: _write(path, params, FAST))
    out = log.read_text()
    assert codes[0] != 0 and codes[1] == 0, (codes, out[-4000:])
    by_rank = trained(tmp_path / "trained")
    streams = pt_streams(params, range(4), 4, STEPS)
    for r in (0, 1):  # rank r is fed by input workers r and r + 2
        given = judge(by_rank[r], {g: streams[g] for g in (r, r + 2)}, STEPS)
        assert sum(given.values()) == STEPS and all(given.values()), (r, given)
    _check_the_record(out, md, world=2)
    assert "restored its state_dict at batch " in out, out[-3000:]


def test_pytorch_autoscale_keeps_every_slots_position_through_a_requeue(cli_env, tmp_path):
    """``--autoscale --initial-workers 1`` (docs/AUTOSCALE.md "What a pass covers"): 3 slots whose
    workers make a batch in 30 ms each, a chief that trains one in 5 ms, so the autoscaler adds
    workers; after an add, ``--requeue``'s signal: the next allocation opens one slot again and
    adds the others, each resuming its stream where it was (a slot not opened keeps its position).
    The judge checks every batch as in the other tests; the autoscaler's record as before."""
    pytest.importorskip("torch")
    path, params = _params(tmp_path, num_workers=0, pace_ms=30)
    _write(path, params, 0.005)
    md, log = tmp_path / "md", tmp_path / "csrun_wse.log"
    argv = [str(BIN / "csrun_wse"), "--requeue", *LAYOUT, "--autoscale", "--initial-workers", "1",
            "--autoscale-window", "3", "python-pt", PT_RUN, "--params", str(path), "--model_dir", str(md),
            "--mode", "train"]
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    try:
        at = wait_for("an add", lambda: logged_after(log, "autoscale: add input worker 1 on ", 0), proc, log)
        wait_for("a step after it", lambda: logged_after(log, "global_step = ", at), proc, log)
        jobs = subprocess.run(["squeue", "--noheader", "--format=%i", "--name=csrun_wse"], env=cli_env,
                              capture_output=True, text=True).stdout.split()
        subprocess.run(["scancel", "--signal=USR2", *sorted({j.split("+")[0] for j in jobs})], env=cli_env,
                       check=True, capture_output=True)
        code = proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    out = log.read_text()
    assert code == 0 and "launching again (requeue 1 of 3)" in out, out[-4000:]
    given = judge(trained(tmp_path / "trained")[0], pt_streams(params, range(3), 3, STEPS), STEPS)
    assert sum(given.values()) == STEPS and given[0] and given[1], given
    assert out.count("autoscale (rate policy, 3 s windows): reading input workers 0..0 of 3 slot(s), "
                     "between 1 and 3") == 2
    perf = json.loads((md / "performance" / "performance.json").read_text())
    pos = perf["input_positions"]
    assert sum(pos["end"].values()) == STEPS and not any(pos["batches_missing"].values()), pos
    auto = perf["autoscale"]  # the second allocation's autoscaler, as the first's
    assert (auto["initial_workers"], auto["min_workers"], auto["max_workers"]) == (1, 1, 3)
    assert auto["windows"] and auto["windows"][0]["workers"] == 1, auto["windows"]
    adds = [e for e in auto["events"] if e["action"] == "add"]
    assert adds and adds[0]["worker"] == 1 and adds[0]["input_wait_fraction"] > 0.1, auto["events"]
    assert "AutoScaler estimate" in adds[0]["reason"] and adds[0]["workers"] >= 2, auto["events"]
    last = {e["worker"]: e["action"] for e in auto["events"]}
    assert perf["workers_paused"] == sorted(i for i, a in last.items() if a == "remove"), auto["events"]
