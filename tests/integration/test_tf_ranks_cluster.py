"""Several TensorFlow trainer ranks through ``csrun_wse python-ws`` on the Slurm test cluster
(issue 32, docs/MULTI-RANK.md "TensorFlow"): 2 chief nodes × 2 ranks (world size 4,
``MultiWorkerMirroredStrategy``, its AUTO collectives RING on CPU) and 8 input workers, 2 per rank
(each rank's own with ``--chief-input-cpus 1``, and 4 tasks on 2 worker nodes), training the
digits example in ``train_and_eval`` with a BatchNormalization after each hidden layer
(``model.batch_norm``, issue 44).

One job, shared by every assertion (module-scoped). It must show that the four ranks train the
same steps and end with identical trainable weights (the per-rank digests in rank 0's
performance.json), BatchNormalization's moving statistics reported as per-replica statistics and
the checkpoint holding their mean,
that rank 0 alone writes the artifacts and evaluates once, and that the input is split across
the ranks (each rank's own rendezvous with its 2 slots) while the data's sharding stays
job-wide (input worker ``g`` builds its input as TF_CONFIG task ``g`` of 8, seed ``base + g``).
The site config leaves the chief's GRES empty (gpu:1 is on node1 only).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

BIN, DIGITS = helpers.BIN, str(helpers.REPO / "examples" / "digits" / "run.py")
LAYOUT = ["--total-nodes", "4", "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-nodes", "2",
          "--chief-tasks-per-node", "2", "--chief-input-cpus", "1"]
WORLD, WORKERS, MAX_STEPS, SEED = 4, 8, 200, 1234


@pytest.fixture(scope="module")
def tf_ranks_job(slurm_cluster, tmp_path_factory):
    """The one job (module docstring): its exit status, output, model_dir and seconds."""
    root = tmp_path_factory.mktemp("tf_ranks")
    data = helpers.prepare_digits(root / "data")
    params = helpers.digits_params(root, data, train_input={"shuffle_seed": SEED}, model={"batch_norm": True},
                                   log_steps=50, checkpoint_steps=0, eval_frequency=None)
    cfg = root / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n')
    md = root / "md"
    t0 = time.monotonic()
    res = subprocess.run([str(BIN / "csrun_wse"), *LAYOUT, "python-ws", DIGITS, "--params", str(params),
                          "--mode", "train_and_eval", "--max_steps", str(MAX_STEPS), "--model_dir", str(md)],
                         env=dict(slurm_cluster["env"], CSRUN_CONFIG=str(cfg)), cwd=root, capture_output=True,
                         text=True, timeout=600)
    return {"code": res.returncode, "out": res.stdout + res.stderr, "md": md, "seconds": time.monotonic() - t0}


def test_four_ranks_train_the_same_steps_to_identical_weights(tf_ranks_job):
    out, md = tf_ranks_job["out"], tf_ranks_job["md"]
    assert tf_ranks_job["code"] == 0, out[-5000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS and perf["world_size"] == WORLD
    ranks = perf["ranks"]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    assert all(r["global_step_end"] == MAX_STEPS and r["steps"] == perf["steps"] for r in ranks), ranks
    digests = {r["weights_sha256"] for r in ranks}
    assert len(digests) == 1 and digests.pop().startswith("sha256:") and perf["weights_identical"] is True
    assert "trainer rank 0 of 4: MultiWorkerMirroredStrategy (AUTO collectives" in out
    assert perf["num_workers"] == WORKERS and sorted(perf["batches_per_worker"], key=int) == [
        str(g) for g in range(WORKERS)]  # every rank's input workers, by job-wide index


def test_batchnorm_statistics_are_reported_as_statistics_and_averaged_for_the_checkpoint(tf_ranks_job):
    """Issue 44, problem 6: each rank's moving mean and variance come from its own batches; the
    trainable weights are identical and said so, the statistics are named as statistics, and
    before rank 0 saves every rank takes their mean (what tf.distribute saves for an aggregated
    variable), so the checkpoint and every rank end with the same statistics."""
    out, md = tf_ranks_job["out"], tf_ranks_job["md"]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    synced = perf["statistics_synchronized"]
    assert any(n.endswith("moving_mean") for n in synced) and any(n.endswith("moving_variance") for n in synced)
    assert perf["statistics_identical"] is True and "mean over the ranks" in perf["statistics_kept"]
    assert "trainable weights identical on every rank" in out and "WEIGHTS DIFFER" not in out
    assert "per-replica statistic(s) differed between ranks" in out
    for r in range(WORLD):  # the verdict names each rank's input wait
        assert re.search(rf"rank {r} \(node\d\): input wait [0-9.]+ %", out), out[-3000:]
    print(f"tf ranks job: {tf_ranks_job['seconds']:.0f} s")


def test_rank_zero_alone_writes_the_artifacts_and_evaluates_once(tf_ranks_job):
    md, out = tf_ranks_job["md"], tf_ranks_job["out"]
    mine = [p for p in md.rglob("*") if ".csrun" not in p.relative_to(md).parts and p.is_file()]
    assert [p.relative_to(md) for p in mine if p.name == "performance.json"] == [Path("performance/performance.json")]
    assert {p.name for p in mine if p.name.startswith("model-ckpt-")} == {
        f"model-ckpt-{MAX_STEPS}.index", f"model-ckpt-{MAX_STEPS}.data-00000-of-00001",
        f"model-ckpt-{MAX_STEPS}.input.json"}  # the input positions of every rank's workers, rank 0's file
    positions = json.loads((md / f"model-ckpt-{MAX_STEPS}.input.json").read_text())
    assert positions["num_streams"] == WORKERS and sum(positions["streams"].values()) == WORLD * MAX_STEPS
    assert len([p for p in mine if p.name == "params_train.yaml"]) == 1
    events = [p.relative_to(md) for p in mine if p.name.startswith("events.out.tfevents.")]
    assert sorted(len(p.parts) for p in events) == [1, 2] and events, events  # train (md/) and eval (md/eval/)
    results = json.loads((md / "eval" / "results.json").read_text())
    assert results["global_step"] == MAX_STEPS and len(results["history"]) == 1
    assert len(re.findall(r"Eval results at global step", out)) == 1


def test_each_rank_reads_its_own_workers_and_the_sharding_is_job_wide(tf_ranks_job):
    md = tf_ranks_job["md"]
    seen: dict[int, dict] = {}
    for r in range(WORLD):
        (rdv,) = md.glob(f".csrun/*.rank{r}")
        # the rank's slots 0 and 1, named by their job-wide index (workers r and r + 4)
        assert json.loads((rdv / "chief.json").read_text())["batches_per_worker"].keys() == {str(r), str(r + WORLD)}
        for slot in range(WORKERS // WORLD):
            reg = json.loads((rdv / "workers" / f"{slot}.json").read_text())
            g = slot * WORLD + r  # worker g feeds rank g % world as slot g // world
            assert reg["index"] == slot and reg["status"] == "ok"
            assert reg["tf_config"]["task"]["index"] == g and len(reg["tf_config"]["cluster"]["worker"]) == WORKERS
            assert reg["shuffle_seed"] == SEED + g
            seen[g] = reg
    assert sorted(seen) == list(range(WORKERS))
