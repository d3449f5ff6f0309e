"""The TensorFlow trainer ranks' collectives (csrun_runtime/tensorflow/ranks.py) between two
real processes on this machine: ``MultiWorkerMirroredStrategy`` from the ``TF_CONFIG`` of
:func:`csrun_common.ranks.trainer_env`, the chief's :class:`TrainSteps` through
``strategy.run``, and the chunk agreement when the ranks' elements differ in size (rank 0
receives elements of 5 batches, rank 1 of 3: each call trains the minimum of what both hold,
the rest waits for the next call). No Slurm: the cluster test is tests/integration/test_tf_ranks_cluster.py.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.unit.paths import REPO

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tf]


RANK = r'''
import json, os, sys
rank, port = int(sys.argv[1]), int(sys.argv[2])
from csrun_common.ranks import trainer_env
os.environ.update(trainer_env(rank, 0, 2, 1, ["localhost", "localhost"], port))
from csrun_common.roles import Role
from csrun_runtime.rankgroup import leave
from csrun_runtime.tensorflow.ranks import TFRanks
from csrun_runtime.tensorflow.sources import ChunkedSource
from csrun_runtime.tensorflow.steps import TrainSteps

ranks = TFRanks(Role(kind="chief", worker_index=None, num_input_workers=0, rank=rank, world_size=2))
import keras
import tensorflow as tf

def build():
    keras.utils.set_random_seed(7 + rank)  # different seeds: the strategy broadcasts worker 0's values
    m = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    m.optimizer.build(m.trainable_variables)
    return m

model = ranks.build(build)
size = 5 if rank == 0 else 3

class Elements(ChunkedSource):
    def __init__(self):
        super().__init__()
        self._bundles, self.made = {0: size}, 0
    def _next_element(self, timeout, what):
        self.made += 1
        g = tf.random.Generator.from_seed(100 * rank + self.made)
        return 0, (g.normal([size, 2, 4]), g.normal([size, 2, 3]))

source, step = Elements(), tf.Variable(0, dtype=tf.int64)
train = TrainSteps(model, counter=step, strategy=ranks.strategy)
trained = []
for _ in range(4):
    chunk = ranks.next_chunk(source, 4, 10.0, "test")
    assert ranks.agree(0) == 0  # the core's stop agreement comes between the two
    taken = ranks.settle(chunk)
    logs, losses = train(taken.batches, taken.offset, taken.steps)
    trained.append(chunk.steps)
before, steps_done = ranks.digest(), int(step.numpy())
synced = ranks.sync_statistics()  # each rank's BatchNormalization saw its own batches
after = ranks.digest()
ranks.sync_batchnorm = True  # runconfig.sync_batchnorm: the moments all-reduced in each step
model = ranks.build(build)
train = TrainSteps(model, counter=step, strategy=ranks.strategy)
for _ in range(2):
    chunk = ranks.next_chunk(source, 4, 10.0, "test")
    assert ranks.agree(0) == 0
    taken = ranks.settle(chunk)
    train(taken.batches, taken.offset, taken.steps)
print(json.dumps({"trained": trained, "step": steps_done, "digest": before, "synced": synced,
                  "after": after, "sync_batchnorm": ranks.digest(),
                  "agree": ranks.agree(rank + 3), "gather": ranks.gather({"rank": rank, "word": "é" * rank}),
                  "losses": len(losses), "leave": leave(ranks, 0, True)}))
'''


def _free_ports(n: int) -> int:
    """A port ``p`` with ``p + 1 .. p + n`` free now (TF_CONFIG's workers: ``p + 1 + i``)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            p = s.getsockname()[1]
        if p + n < 65535 and all(_bindable(p + 1 + i) for i in range(n)):
            return p
    raise RuntimeError("no free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("localhost", port))
            return True
        except OSError:
            return False


def test_two_ranks_agree_on_each_calls_steps_and_end_with_identical_weights(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = _free_ports(2)
    env = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    # elements of 5 and 3, at most 4 a call: min(4, 3), min(2, 3), min(4, 1), min(4, 3)
    assert outs[0]["trained"] == outs[1]["trained"] == [3, 2, 1, 3]
    assert outs[0]["step"] == outs[1]["step"] == 9
    # the trainable weights are identical; BatchNormalization's moving statistics are each rank's own
    # until sync_statistics() sets both ranks' to their mean (what the checkpoint then holds)
    (w0, s0), (w1, s1) = outs[0]["digest"], outs[1]["digest"]
    assert w0 == w1 and w0.startswith("sha256:") and s0 != s1
    names = ["sequential/batch_normalization/moving_mean", "sequential/batch_normalization/moving_variance"]
    assert outs[0]["synced"] == outs[1]["synced"] == names
    assert outs[0]["after"] == outs[1]["after"] and outs[0]["after"][0] == w0
    # runconfig.sync_batchnorm (BatchNormalization's synchronized=True): identical without a sync
    assert outs[0]["sync_batchnorm"] == outs[1]["sync_batchnorm"]
    assert outs[0]["agree"] == outs[1]["agree"] == 4  # the maximum of 3 and 4
    assert outs[0]["gather"] == outs[1]["gather"] == [{"rank": 0, "word": ""}, {"rank": 1, "word": "é"}]
    assert [o["leave"] for o in outs] == [0, 0]
