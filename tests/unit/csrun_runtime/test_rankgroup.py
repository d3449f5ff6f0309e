"""Several trainer ranks in the core's loop (csrun_runtime/rankgroup.py) and PyTorch's ranks
(csrun_runtime/pytorch/ranks.py): the stop codes, the gathered per-rank record and the
verdict's lines (pure), the sharding by streamer index, and two real gloo ranks (two spawned
processes) training a DistributedDataParallel module through the core's loop: a stop seen by
one rank (its input's end, --requeue's signal) stops both at the same step, rank 0 alone
writes, and the ranks' weights are identical."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from csrun_common.roles import Role, resolve_role
from csrun_runtime import preemption
from csrun_runtime.rankgroup import (
    INPUT_ENDED,
    decode_stop,
    rank_lines,
    rank_record,
    stop_code,
    world_figures,
)


def test_stop_codes_rank_a_signal_above_an_input_end_and_round_trip():
    assert stop_code(False, 0, False) == 0 and stop_code(True, 0, False) == INPUT_ENDED
    usr2 = stop_code(True, int(signal.SIGUSR2), True)  # a signal outranks the input's end
    term = stop_code(False, int(signal.SIGTERM), False)
    assert decode_stop(usr2) == (True, int(signal.SIGUSR2), True)
    assert decode_stop(term) == (True, int(signal.SIGTERM), False)
    assert decode_stop(INPUT_ENDED) == (True, 0, False) and decode_stop(0) == (False, 0, False)
    assert max(usr2, term, INPUT_ENDED) == max(term, usr2)  # the agreement's MAX is one signal


def _rec(rate, wait, slow_slot, slow_rate, node="node5"):
    return {"steps": 40, "global_step_end": 40, "samples_per_sec": rate * 0.9, "steady_samples_per_sec": rate,
            "input_wait_fraction": wait,
            "verdict": {"slowest_input_worker": {"worker": slow_slot, "node": node, "samples_per_sec": slow_rate}}}


def test_the_world_sums_the_ranks_and_the_verdict_names_each_wait_and_the_slowest_rank():
    lost = [{"index": 3, "rank": 1, "slot": 1, "node": "node4"}]
    ranks = [rank_record(0, "node1", {**_rec(400.0, 0.02, "0", 410.0), "num_workers": 2,
                                      "batches_per_worker": {"0": 10, "2": 12}}, ("sha256:ab", "sha256:s0")),
             {**rank_record(1, "node2", {**_rec(250.0, 0.41, "3", 120.0, node="node4"), "num_workers": 2,
                                         "batches_per_worker": {"1": 9, "3": 7}, "workers_lost": lost,
                                         "workers_replaced": lost}, ("sha256:ab", "sha256:s1"), ["bn.running_mean"]),
              "rank_wait_fraction": 0.03}]
    assert ranks[1]["slowest_input_worker"]["worker"] == "3"  # job-wide already (workernames.renumber)
    world = world_figures(ranks, "their mean over the ranks")
    assert world["world_size"] == 2 and world["world_steady_samples_per_sec"] == 650.0
    assert world["world_samples_per_sec"] == pytest.approx(585.0)
    assert world["slowest_rank"]["rank"] == 1 and world["weights_identical"] is True
    # every rank's input workers, job-wide: rank 1's lost worker 3 is the job's
    assert world["num_workers"] == 4 and list(world["batches_per_worker"]) == ["0", "1", "2", "3"]
    assert world["workers_lost"] == lost and world["workers_replaced"] == lost
    assert world["statistics_identical"] is False and world["statistics_synchronized"] == ["bn.running_mean"]
    lines = rank_lines(world)
    assert lines[0].startswith("  ranks: 2 trainer ranks, world steady state 650.0 samples/s")
    assert "trainable weights identical on every rank" in lines[0]
    assert lines[1].startswith("  statistics (buffers, moving averages) differ between ranks at the end")
    assert "the checkpoint holds their mean over the ranks" in lines[1]
    assert "rank 0 (node1): input wait 2.0 %" in lines[2] and "rank 1 (node2): input wait 41.0 %" in lines[3]
    assert "slowest input worker 3 on node4 120.0 samples/s" in lines[3]
    assert lines[3].endswith("; input workers lost 3 (replaced)")
    assert "waits for the other ranks 3.0 %" in lines[3] and "waits for" not in lines[2]
    assert lines[4].startswith("  slowest rank: 1 (node2), input wait 41.0 %") and all(len(x) < 250 for x in lines)
    synced = world_figures([ranks[0], {**ranks[1], "statistics_sha256": "sha256:s0"}], "rank 0's")
    assert rank_lines(synced)[1] == ("  statistics: 1 per-replica statistic(s) differed between ranks (each rank's "
                                     "own batches: bn.running_mean), not an error; the checkpoint holds rank 0's")
    differ = world_figures([ranks[0], {**ranks[1], "weights_sha256": "sha256:cd"}])
    assert differ["weights_identical"] is False and "TRAINABLE WEIGHTS DIFFER" in rank_lines(differ)[0]


def test_an_input_worker_of_a_rank_shards_by_its_job_wide_index():
    """Worker g = 6 of W = 8 with 4 ranks: rank 2's slot 1 (its rendezvous view), streamer 6
    of 8 (the data's sharding: seeds, shard plan entry, the streamer facts)."""
    from csrun_runtime.pytorch.streamers import _from_env

    env = {"CSRUN_ROLE": "worker", "CSRUN_HET_GROUP": "1", "CSRUN_TASK_OFFSET": "4", "CSRUN_WORKER_OFFSET": "4",
           "CSRUN_NUM_WORKERS": "8", "CSRUN_WORLD_SIZE": "4", "CSRUN_LOCAL_WORLD_SIZE": "2",
           "SLURM_PROCID": "6", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    role = resolve_role(env)
    assert (role.rank, role.worker_index, role.num_input_workers) == (2, 1, 2)
    assert (role.streamer_index, role.num_streamers) == (6, 8) and role.rendezvous_key == "77.0.rank2"
    old = dict(os.environ)
    try:
        os.environ.update(env)
        facts = _from_env()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert (facts.num_streamers, facts.rank, facts.streamer) == (8, 6, True)


def test_a_ranks_own_input_worker_is_the_worker_of_its_rank():
    """--chief-input-cpus with several ranks: rank r's own input worker is worker g = r, its
    rank's slot 0 (csrun_runtime.chief_input.worker_env)."""
    from csrun_runtime.chief_input import CpuSplit, worker_env

    env = {"CSRUN_ROLE": "chief", "CSRUN_HET_GROUP": "0", "CSRUN_TASK_OFFSET": "0", "CSRUN_WORKER_OFFSET": "0",
           "CSRUN_NUM_WORKERS": "8", "CSRUN_WORLD_SIZE": "4", "CSRUN_LOCAL_WORLD_SIZE": "2", "SLURM_PROCID": "3",
           "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77", "CSRUN_CHIEF_INPUT_CPUS": "1"}
    chief = resolve_role(env)
    split = CpuSplit(training=(0,), input=(0,), pinned=False, threads=1, reason="shared")
    worker = resolve_role(worker_env(env, chief, split))
    assert (worker.kind, worker.rank, worker.worker_index, worker.streamer_index) == ("worker", 3, 0, 3)
    assert worker.rendezvous_key == chief.rendezvous_key == "77.0.rank3"


# ----------------------------------------------------------------------------- two real gloo ranks
class _Batches:
    """A rank's batch source: regression batches seeded by rank; ``end`` batches then the end
    (None), or ``signal_at``: this process sends itself SIGUSR2 (--requeue's) when asked for
    that batch."""

    def __init__(self, rank: int, end: int | None, signal_at: int | None):
        import numpy as np

        self.rng, self.n, self.end, self.signal_at, self.rank = np.random.default_rng(rank), 0, end, signal_at, rank
        self.die_at: int | None = None

    def next(self):
        self.n += 1
        if self.signal_at is not None and self.n == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if self.die_at is not None and self.n == self.die_at:
            os._exit(3)  # a rank lost mid-training (no clean-up, as SIGKILL)
        if self.end is not None and self.n > self.end:
            return None, self.rank
        x = self.rng.normal(size=(8, 4)).astype("float32")
        return {"x": x, "y": x.sum(axis=1, keepdims=True)}, 0

    def describe(self):
        return {"batches_per_worker": {"0": self.n}, "worker_nodes": {"0": "here"}}


def _zoo_model():
    """A Linear with what real models hold beside it (issues 40, 44): a BatchNorm (running
    statistics, a 0-dim int64 counter), a learnable 0-dim scale, and 0-dim and non-contiguous
    buffers of every dtype the digest reads."""
    import torch

    from tests.unit.csrun_runtime.pytorch.test_ranks import zoo_buffers

    class Zoo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = torch.nn.Linear(4, 1), torch.nn.BatchNorm1d(4)
            self.scale = torch.nn.Parameter(torch.tensor(1.0))
            for name, t in zoo_buffers().items():
                self.register_buffer(name, t)

        def forward(self, x):
            return self.lin(self.bn(x)) * self.scale

    return Zoo()


def _rank_main(rank: int, port: int, tmp: str, scenario: str) -> None:
    """One spawned rank: join a gloo group of 2, train a DDP Linear through the core's loop."""
    import torch

    from csrun_runtime.loop import LoopSetup, TrainingDriver
    from csrun_runtime.pytorch.ranks import TorchRanks
    from csrun_runtime.pytorch.training import TorchStepBackend
    from csrun_runtime.rankgroup import LoopRanks
    from csrun_runtime.task import flush_exit

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    preemption.reset()
    preemption.install(["USR2"])
    role = Role(kind="chief", worker_index=None, num_input_workers=1, rank=rank, world_size=2)
    rc = {"max_steps": 30, "log_steps": 5, "checkpoint_steps": 0, "keep_checkpoint_max": 2,
          "steps_per_execution": "auto", "input_timeout_secs": 20.0, "worker_start_timeout_secs": 20.0}
    ranks = TorchRanks.start(role, rc)
    torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's
    model = _zoo_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model_dir = Path(tmp) / f"dir{rank}"
    end = 7 if scenario == "input_end" and rank == 1 else None
    source = _Batches(rank, end, 4 if scenario == "signal" and rank == 1 else None)
    source.die_at = 5 if scenario == "die" and rank == 1 else None
    backend = TorchStepBackend(model=ranks.wrap(model), module=model, opt=opt, source=source, rc=rc,
                               model_dir=model_dir, device=ranks.device, evaluate=lambda m, s: {},
                               forward_loss=lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"]))
    setup = LoopSetup(rc=rc, model_dir=model_dir, mode="train", start=0, t_proc=time.time(), node=f"n{rank}",
                      num_input_workers=1, params_path=None, evaluating=False, ranks=LoopRanks(ranks, f"n{rank}"))
    driver = TrainingDriver(setup, backend)
    try:
        driver.run()
    except RuntimeError as e:  # the other rank died: one line, as the chief says it (exit 1)
        from csrun_runtime.pytorch.ranks import collective_failure
        from csrun_runtime.rankgroup import RankLost

        lost = e if isinstance(e, RankLost) else collective_failure(ranks, e)
        (Path(tmp) / f"result{rank}.json").write_text(json.dumps({"lost": str(lost) if lost else repr(e)}))
        flush_exit(0)
    t0 = time.perf_counter()
    for _ in range(50):
        ranks.agree(0)
    per_agree = (time.perf_counter() - t0) / 50
    result = {"step": driver.step, "exit": preemption.exit_code(), "signal": preemption.stop_signal(),
              "digest": ranks.digest(), "agree_s": per_agree}
    ranks.close()
    (Path(tmp) / f"result{rank}.json").write_text(json.dumps(result))
    # a chief leaves as run() does (csrun_runtime.task.flush_exit: os._exit after flushing): without
    # it the interpreter's teardown of the gloo group aborted ("terminate called without an active
    # exception", SIGABRT) in about 1 run in 5 of the signal case, after this rank's work was done
    flush_exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("scenario", ["input_end", "signal"])
def test_two_gloo_ranks_stop_together_and_rank_zero_alone_writes(tmp_path, scenario):
    """Rank 1's input ends after 7 batches / rank 1 alone gets --requeue's SIGUSR2 at its 4th
    batch: both ranks stop before the same step (the fetched batch is not trained), with the
    same exit status and stop signal; rank 0's model_dir has the checkpoint at that step and
    performance.json with both ranks (identical weights digests), rank 1's stays empty."""
    mp = pytest.importorskip("torch.multiprocessing")
    mp.spawn(_rank_main, args=(_free_port(), str(tmp_path), scenario), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1))
    want = 7 if scenario == "input_end" else 3
    assert r0["step"] == r1["step"] == want and r0["digest"] == r1["digest"] != ["", ""], (r0, r1)
    if scenario == "signal":
        assert r0["signal"] == r1["signal"] == "SIGUSR2" and r0["exit"] == r1["exit"] == preemption.REQUEUE_EXIT
    else:
        assert r0["exit"] == r1["exit"] == 0
    assert not (tmp_path / "dir1").exists() or not any((tmp_path / "dir1").rglob("*"))
    assert (tmp_path / "dir0" / f"model-ckpt-{want}.pt").is_file()
    perf = json.loads((tmp_path / "dir0" / "performance" / "performance.json").read_text())
    assert [r["rank"] for r in perf["ranks"]] == [0, 1] and perf["weights_identical"] is True
    assert {r["weights_sha256"] for r in perf["ranks"]} == {r0["digest"][0]}
    # each rank's BatchNorm saw its own batches; before the checkpoint rank 0's went to rank 1 (DDP's
    # broadcast_buffers), so the statistics end identical and the checkpoint is every rank's state
    assert perf["statistics_identical"] is True and {r["statistics_sha256"] for r in perf["ranks"]} == {r0["digest"][1]}
    assert {"bn.running_mean", "bn.running_var"} <= set(perf["statistics_synchronized"]), perf
    assert perf["ranks"][0]["statistics_synchronized"] == [] and "rank 0's" in perf["statistics_kept"]
    assert all(r["steps"] == want for r in perf["ranks"]) and perf["global_step_end"] == want
    assert perf["world_samples_per_sec"] == pytest.approx(sum(r["samples_per_sec"] for r in perf["ranks"]), abs=0.02)
    if scenario == "signal":
        assert perf["stopped_by"] == "SIGUSR2"


def test_a_rank_whose_peer_dies_ends_at_once_with_one_line(tmp_path):
    """Rank 1 exits abruptly at its 5th batch: rank 0, in DDP's all-reduce or the stop
    agreement, fails at once (gloo sees the connection close) with the one line the chief
    logs, instead of waiting for the collective timeout."""
    mp = pytest.importorskip("torch.multiprocessing")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(tmp_path), "die")) for r in (0, 1)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert procs[1].exitcode == 3 and procs[0].exitcode == 0
    lost = json.loads((tmp_path / "result0.json").read_text())["lost"]
    assert lost.startswith("trainer rank 0 of 2: ") and "another rank died" in lost and "\n" not in lost, lost
    assert time.monotonic() - t0 < 100  # far below the 360 s collective timeout
