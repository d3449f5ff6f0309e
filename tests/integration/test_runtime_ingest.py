"""The chief's ingest path with real TensorFlow: bundling small batches into tf.data service
elements (csrun_runtime.tensorflow.bundling.plan_bundle, register_stream), handing them out as chunks in
each worker's order (ServiceSource, LocalSource), several training steps per call
(csrun_runtime.tensorflow.steps.TrainSteps) equal to train_on_batch step by step, and the training
loop's cadence (logs, checkpoints, evaluations, exact step count) with chunks."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")

from csrun_runtime import rendezvous  # noqa: E402
from csrun_runtime.bundles import MAX_BUNDLE  # noqa: E402
from csrun_runtime.tensorflow import bundling, service, sources  # noqa: E402
from csrun_runtime.tensorflow.steps import TrainSteps  # noqa: E402


def spec(*shapes, dtype=None):
    dtype = dtype or tf.float32
    return tuple(tf.TensorSpec(s, dtype) for s in shapes)


def test_plan_bundle_aims_at_one_mib_elements():
    digits = (tf.TensorSpec([64, 64], tf.float32), tf.TensorSpec([64], tf.int32))  # 16,640 bytes
    plan = bundling.plan_bundle(digits)
    assert plan.batch_bytes == 16640 and plan.bundle == (1 << 20) // 16640 == 63
    assert "63 batches" in plan.reason
    assert bundling.plan_bundle(spec([64, 1024])).bundle == 4               # 256 KiB -> 1 MiB
    assert bundling.plan_bundle(spec([64, 3000])).bundle == 1               # 750 KB: already big
    assert bundling.plan_bundle(spec([2, 2])).bundle == MAX_BUNDLE  # tiny: capped
    assert bundling.plan_bundle(digits, 1).bundle == 1 and "off" in bundling.plan_bundle(digits, 1).reason
    assert bundling.plan_bundle(digits, 7).bundle == 7


def test_plan_bundle_leaves_a_short_run_to_every_worker():
    """300 steps and 6 input workers: at most 300 // 24 = 12 batches per element, so every
    worker can contribute (the merge is first come, first served by element)."""
    digits = (tf.TensorSpec([64, 64], tf.float32), tf.TensorSpec([64], tf.int32))
    plan = bundling.plan_bundle(digits, "auto", max_batches=300 // (4 * 6))
    assert plan.bundle == 12 and "capped by the run's length" in plan.reason
    assert bundling.plan_bundle(digits, "auto", max_batches=10_000).bundle == 63  # no effect on long runs
    assert bundling.plan_bundle(digits, "auto", max_batches=0).bundle == 1
    assert bundling.plan_bundle(digits, 40, max_batches=12).bundle == 40           # an explicit N is kept


def test_plan_bundle_never_stacks_what_batch_cannot():
    for s in (spec([64, None]), (tf.TensorSpec([64], tf.string), tf.TensorSpec([64], tf.int32)),
              (tf.RaggedTensorSpec([64, None], tf.float32), tf.TensorSpec([64], tf.int32))):
        plan = bundling.plan_bundle(s, 8)
        assert plan.bundle == 1 and plan.batch_bytes is None and "static" in plan.reason


def numbered(first: int, batch: int = 4) -> tf.data.Dataset:
    """Batches whose features are ``[seq, seq, ...]`` for seq = first, first + 1, ..."""
    return tf.data.Dataset.range(first, 1 << 40).map(
        lambda i: (tf.fill([batch, 3], tf.cast(i, tf.float32)), tf.fill([batch], tf.cast(i, tf.int32))))


def seqs(chunk) -> list[int]:
    x, _ = chunk.batches
    return [int(x[i, 0, 0]) for i in range(chunk.offset, chunk.offset + chunk.steps)]


def test_local_source_hands_out_chunks_in_order():
    plan = bundling.plan_bundle(numbered(0).element_spec, 5)
    src = sources.LocalSource(numbered(0), plan)
    got = []
    for limit in (3, 10, 1, 7, 5, 2):
        c = src.get_chunk(limit, 1)
        assert 1 <= c.steps <= limit and c.worker == 0
        got += seqs(c)
    _, (x, y) = src.get(1)  # a single batch, the next one
    got.append(int(x[0, 0]))
    assert got == list(range(len(got)))
    assert src.describe()["batches_per_worker"] == {"in-process": len(got)}
    assert src.describe()["batches_per_element"] == {"in-process": 5}


def test_service_source_merges_bundled_and_unbundled_streams_in_each_workers_order(tmp_path):
    """Two input workers (WorkerServers in this process): worker 0 bundles 4 batches per
    element, worker 1 sends single batches; the chief's chunks keep each worker's order,
    lose nothing, and count batches."""
    servers, ports = service.start_dispatchers(2)
    addresses = [f"localhost:{p}" for p in ports]
    workers = [service.start_worker_server(a, "localhost") for a in addresses]
    counters = [[0], [0]]
    registry = {}
    for i, (address, bundle) in enumerate(zip(addresses, (4, 1), strict=True)):
        ds = numbered(1000 * i)
        plan = bundling.plan_bundle(ds.element_spec, bundle)
        service.register_stream(address, ds, plan, counters[i])
        registry[i] = {"node": f"node{i + 2}", "pid": 0, "bundle": plan.bundle}
    rdv = rendezvous.Rendezvous(tmp_path, "job.0")
    rdv.reset()
    src = service.ServiceSource(rdv, addresses, registry)
    by_worker: dict[int, list[int]] = {0: [], 1: []}
    limits = [1, 3, 8, 2, 5, 4, 1, 6] * 8
    for limit in limits:
        c = src.get_chunk(limit, 30)
        assert 1 <= c.steps <= limit
        assert c.steps <= (4 if c.worker == 0 else 1)
        by_worker[c.worker] += seqs(c)
    for _ in range(10):
        i, (x, _) = src.get(30)
        by_worker[i].append(int(x[0, 0]))
    for i, got in by_worker.items():
        assert got == list(range(1000 * i, 1000 * i + len(got))), (i, got[:20])
    desc = src.describe()
    assert desc["batches_per_worker"] == {"0": len(by_worker[0]), "1": len(by_worker[1])}
    assert desc["batches_per_element"] == {"0": 4, "1": 1}
    assert sum(len(v) for v in by_worker.values()) > 0 and min(len(v) for v in by_worker.values()) > 0
    assert counters[0][0] >= len(by_worker[0]) // 4  # the worker counted its service elements
    src.close()
    helpers.keep_alive(servers, workers)  # deleting a WorkerServer can deadlock


def test_service_source_gains_a_stream_while_training(tmp_path):
    """add_stream (issue 12's replacement and growth): a source opened on worker 0 alone
    gains worker 2 (index 1 never opened counts as stopped) between chunks; batches of both
    come in each worker's order, counted by index; re-adding a worker reported lost forgets
    its failure, and an error of the stream it replaced is not reported."""
    servers, ports = service.start_dispatchers(2)
    addresses = [f"localhost:{p}" for p in ports]
    workers = [service.start_worker_server(a, "localhost") for a in addresses]
    for i, address in enumerate(addresses):
        ds = numbered(1000 * i)
        service.register_stream(address, ds, bundling.plan_bundle(ds.element_spec, 2), [0])
    rdv = rendezvous.Rendezvous(tmp_path, "job.0")
    rdv.reset()
    src = service.ServiceSource(rdv, addresses[:1], {0: {"node": "node2", "pid": 0, "bundle": 2}})
    got: dict[int, list[int]] = {0: [], 2: []}
    for _ in range(5):
        c = src.get_chunk(8, 30)
        got[c.worker] += seqs(c)
    assert got[0] and not got[2]
    src.add_stream(2, addresses[1], {"node": "node4", "pid": 0, "bundle": 2})
    assert src.n == 3 and 1 in src.announced
    deadline = 200
    while not got[2] and deadline:
        c = src.get_chunk(8, 30)
        got[c.worker] += seqs(c)
        deadline -= 1
    for _ in range(20):
        c = src.get_chunk(8, 30)
        got[c.worker] += seqs(c)
    assert got[0] == list(range(len(got[0])))
    assert got[2] == list(range(1000, 1000 + len(got[2]))) and got[2]
    desc = src.describe()
    assert desc["batches_per_worker"] == {"0": len(got[0]), "1": 0, "2": len(got[2])}
    assert desc["worker_nodes"]["2"] == "node4" and desc["workers_stopped"] == [1]
    # worker 2 reported lost, then re-added: a late error of its old stream is old news
    src._handle_error(2, tf.errors.UnavailableError(None, None, "gone"))
    assert 2 in src.failed
    old = src._generation[2]
    src.add_stream(2, addresses[1])
    assert 2 not in src.failed and 2 not in src.announced
    with src._q.mutex:  # the queue is full (the readers keep it so): the old error goes first
        src._q.queue.appendleft((2, old, tf.errors.UnavailableError(None, None, "the old stream ends"), None))
    for _ in range(10):
        src.get_chunk(8, 30)
    assert 2 not in src.failed
    src.close()
    helpers.keep_alive(servers, workers)  # deleting a WorkerServer can deadlock

def small_model(jit: bool):
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)
    model.jit_compile = jit
    return model


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_train_steps_equal_train_on_batch_step_by_step(jit):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 16, 8)).astype(np.float32)
    y = rng.integers(0, 4, size=(12, 16)).astype(np.int32)
    ref = small_model(jit)
    ref_losses = [ref.train_on_batch(x[i], y[i], return_dict=True)["loss"] for i in range(12)]
    model = small_model(jit)
    step = tf.Variable(0, dtype=tf.int64)
    steps = TrainSteps(model, counter=step)
    element = (tf.constant(x), tf.constant(y))
    losses = []
    for offset, n in ((0, 1), (1, 4), (5, 2), (7, 5)):  # chunks of one element, as the loop cuts them
        logs, chunk_losses = steps(element, offset, n)
        assert len(chunk_losses) == n
        losses += [float(v) for v in chunk_losses]  # read on the host only when asked (issue 31)
    assert int(step.numpy()) == 12 and int(model.optimizer.iterations.numpy()) == 12
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert float(logs["loss"]) == pytest.approx(ref_losses[-1], rel=1e-5)
    for a, b in zip(ref.trainable_variables, model.trainable_variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_training_cadence_and_step_count_with_chunks(tmp_path):
    """Chunks of up to 63 steps still log at step 1, every log_steps and the target,
    checkpoint at every checkpoint_steps and the end, evaluate at every eval_frequency and the
    end, and stop exactly at max_steps."""
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, log_steps=25, checkpoint_steps=40, eval_frequency=60,
                                   keep_checkpoint_max=10)
    md = tmp_path / "md"
    proc = helpers.run_py(["--params", str(params), "--mode", "train_and_eval", "--max_steps", "130",
                           "--model_dir", str(md)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    logged = [int(s) for s in re.findall(r"global_step = (\d+), loss = ", out)]
    assert logged == [1, 25, 50, 75, 100, 125, 130]
    saved = [int(s) for s in re.findall(r"Saving checkpoint at global step (\d+)", out)]
    assert saved == [40, 80, 120, 130]
    evals = [int(s) for s in re.findall(r"Eval results at global step (\d+)", out)]
    assert evals == [60, 120, 130]
    assert "input bundling (in-process pipeline): auto: 63 batches" in out
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["steps"] == 130 and perf["global_step_end"] == 130 and perf["total_samples"] == 130 * 64
    spe = perf["steps_per_execution"]
    assert spe["setting"] == "auto" and sum(int(k) * v for k, v in spe["calls_by_steps"].items()) == 130
    assert 1 < spe["calls"] < 130 and max(int(k) for k in spe["calls_by_steps"]) <= 63
    assert perf["input_bundle"]["batches_per_element"] == {"in-process": 63}
    ckpt = tf.train.load_checkpoint(str(md / "model-ckpt-130"))
    assert int(ckpt.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")) == 130


def test_bundling_and_steps_per_execution_can_be_set(tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, log_steps=50, checkpoint_steps=0, input_bundle=1,
                                   steps_per_execution=1)
    proc = helpers.run_py(["--params", str(params), "--mode", "train", "--max_steps", "20",
                           "--model_dir", str(tmp_path / "md")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    perf = json.loads((tmp_path / "md" / "performance" / "performance.json").read_text())
    assert perf["input_bundle"]["batches_per_element"] == {"in-process": 1}
    assert perf["steps_per_execution"]["calls_by_steps"] == {"1": 20}
    bad = helpers.digits_params(tmp_path, data, input_bundle=0, steps_per_execution="many")
    proc = helpers.run_py(["--params", str(bad), "--mode", "train", "--max_steps", "5",
                           "--model_dir", str(tmp_path / "md2")])
    assert proc.returncode == 2
    assert "runconfig.input_bundle" in proc.stderr and "runconfig.steps_per_execution" in proc.stderr
