"""csrun_runtime/tensorflow/steps.py with real TensorFlow (the tiny model of tiny.py): several steps
in one call over an element of stacked batches from an offset, the global step advanced inside
the call, each step's loss a value read only when asked, and the model's own train step."""
from __future__ import annotations

import pytest

from csrun_runtime.tensorflow import chief_model
from csrun_runtime.tensorflow.steps import TrainSteps
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf
tf = tiny.tf


def element(bundle: int = 4):
    """``bundle`` batches of the training input stacked: x float32[bundle, 8, 4], y int32[bundle, 8]."""
    return next(iter(tiny.input_fn({}).batch(bundle)))


def test_a_call_trains_n_steps_from_the_offset_and_advances_the_counter():
    model = tiny.model_fn({})
    model(tf.zeros((tiny.BATCH, 4)))
    model.jit_compile = False
    counter = tf.Variable(10, dtype=tf.int64)
    steps = TrainSteps(model, allow_fallback=False, counter=counter)
    before = [w.numpy().copy() for w in model.trainable_weights]
    logs, losses = steps(element(), 1, 3)
    assert int(counter.numpy()) == 13 and len(losses) == 3 and steps.calls == 1
    assert all(float(loss) > 0 for loss in losses) and set(logs) >= {"loss"}
    assert any((w.numpy() != b).any() for w, b in zip(model.trainable_weights, before, strict=True))


def test_the_same_batches_give_the_same_losses_as_keras_train_on_batch():
    x, y = element(2)
    ours = tiny.model_fn({})
    ours(x[0])
    ours.jit_compile = False
    theirs = tiny.model_fn({})
    theirs(x[0])
    theirs.set_weights(ours.get_weights())
    _, losses = TrainSteps(ours, allow_fallback=False)((x, y), 0, 2)
    keras_losses = [theirs.train_on_batch(x[i], y[i], return_dict=True)["loss"] for i in range(2)]
    assert [float(v) for v in losses] == pytest.approx(keras_losses, rel=1e-5)


def test_the_chiefs_model_is_built_with_its_optimizer(tmp_path):
    params = tiny.resolved(tmp_path, "train").params
    model = chief_model.build_model(tiny.model_fn, params, tiny.input_fn(params).element_spec)
    assert model.built and model.optimizer.built
