"""csrun_runtime/tensorflow/chief_model.py with real TensorFlow (the tiny model of tiny.py, a
temporary model_dir): the model built seeded and its optimizer built, a model_fn that does not
return a compiled Keras model refused, and the checkpoints: the newest restored with its global
step, ``runconfig.checkpoint_path`` taken and refused when missing, one of another model refused."""
from __future__ import annotations

import pytest

from csrun_runtime.params import ParamsError
from csrun_runtime.tensorflow import chief_model
from csrun_runtime.tensorflow.contract import Refused
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf
keras = tiny.keras


def build(tmp_path, model_fn=tiny.model_fn, **runconfig):
    params = tiny.resolved(tmp_path, "train", **runconfig).params
    return chief_model.build_model(model_fn, params, tiny.input_fn(params).element_spec), params["runconfig"]


def test_the_seed_makes_the_same_model_and_the_optimizer_is_built(tmp_path):
    a, _ = build(tmp_path)
    b, _ = build(tmp_path)
    assert a.built and a.optimizer.built and len(a.optimizer.variables) > 1
    assert all((x == y).all() for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


@pytest.mark.parametrize("returned, says", [
    (lambda p: "a model", "model: model_fn must return a keras.Model, got str"),
    (lambda p: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]), "model: model_fn must return a compiled"),
])
def test_a_model_fn_without_a_compiled_model_is_refused(tmp_path, returned, says):
    with pytest.raises(Refused) as e:
        build(tmp_path, returned)
    assert e.value.problems[0].startswith(says)


def test_the_newest_checkpoint_is_restored_with_its_step(tmp_path):
    model, rc = build(tmp_path)
    step, _, mgr, restored = chief_model.checkpointing(model, tmp_path, rc)
    assert restored is None and int(step.numpy()) == 0
    step.assign(5)
    mgr.save(checkpoint_number=5)
    weights = model.get_weights()
    again, rc = build(tmp_path, seed=2)  # other initial weights
    step, _, _, restored = chief_model.checkpointing(again, tmp_path, rc)
    assert restored.endswith("model-ckpt-5") and int(step.numpy()) == 5
    assert all((x == y).all() for x, y in zip(again.get_weights(), weights, strict=True))
    fresh, rc = build(tmp_path, autoload_last_checkpoint=False)
    assert chief_model.checkpointing(fresh, tmp_path, rc)[3] is None


def test_a_checkpoint_path_that_is_missing_or_of_another_model_is_refused(tmp_path):
    model, rc = build(tmp_path)
    _, _, mgr, _ = chief_model.checkpointing(model, tmp_path / "a", rc)
    mgr.save(checkpoint_number=1)
    model, rc = build(tmp_path, checkpoint_path=str(tmp_path / "nowhere"))
    with pytest.raises(ParamsError, match=r"^runconfig.checkpoint_path: no checkpoint at .*/nowhere$"):
        chief_model.checkpointing(model, tmp_path / "b", rc)

    def deeper(params):  # the checkpoint's layer and one more: a variable the checkpoint does not hold
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(3)])
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    model, rc = build(tmp_path, deeper, checkpoint_path=str(tmp_path / "a"))
    with pytest.raises(ParamsError, match=r"^checkpoint .*model-ckpt-1 does not match the model: "):
        chief_model.checkpointing(model, tmp_path / "c", rc)
