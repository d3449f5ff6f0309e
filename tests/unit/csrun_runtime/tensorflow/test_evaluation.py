"""csrun_runtime/tensorflow/evaluation.py with real TensorFlow in one process (the tiny model of
tiny.py, a temporary model_dir): one pass over the eval input with the model's test step, the
metrics returned and written (``eval/results.json`` with its history, ``eval/`` TensorBoard
scalars), ``runconfig.eval_steps``, the eval input's contract refusals, ``input_fn(params,
mode="eval")`` when there is no eval_input_fn, and the verdict of an ``eval`` run."""
from __future__ import annotations

import json
import logging

import pytest

from csrun_runtime.tensorflow.contract import Refused
from csrun_runtime.tensorflow.evaluation import Evaluator
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf


def evaluator(tmp_path, eval_input_fn=tiny.eval_input_fn, input_fn=tiny.input_fn, **runconfig) -> Evaluator:
    params = tiny.resolved(tmp_path, "eval", **runconfig).params
    return Evaluator(input_fn, eval_input_fn, params, tmp_path / "md")


def model():
    """The tiny model, built (its weights made) as the chief builds it before evaluating."""
    m = tiny.model_fn({})
    m(tiny.tf.zeros((tiny.BATCH, 4)))
    return m


def test_one_pass_returns_and_writes_the_metrics_with_a_history(tmp_path):
    ev, m = evaluator(tmp_path), model()
    first = ev.evaluate(m, 3)
    second = ev.evaluate(m, 6)
    assert set(first) == {"loss", "accuracy"} and first == second  # the same weights, the same pass
    res = json.loads((tmp_path / "md" / "eval" / "results.json").read_text())
    assert (res["global_step"], res["eval_samples"], res["eval_batches"]) == (6, tiny.EVAL_SAMPLES, 3)
    assert res["metrics"] == second and [h["global_step"] for h in res["history"]] == [3, 6]
    assert ev.last == {k: v for k, v in res.items() if k != "history"}
    assert list((tmp_path / "md" / "eval").glob("events.out.tfevents.*"))


def test_eval_steps_bound_the_pass(tmp_path):
    ev = evaluator(tmp_path, eval_steps=2)
    ev.evaluate(model(), 1)
    assert (ev.last["eval_batches"], ev.last["eval_samples"]) == (2, 2 * tiny.BATCH)


def test_without_an_eval_input_fn_the_input_fn_is_asked_for_mode_eval(tmp_path):
    asked = []

    def input_fn(params, mode="train"):
        asked.append(mode)
        return tiny.input_fn(params) if mode == "train" else tiny.eval_input_fn(params)

    ev = evaluator(tmp_path, eval_input_fn=None, input_fn=input_fn)
    ev.evaluate(model(), 1)
    assert asked == ["eval"] and ev.last["eval_samples"] == tiny.EVAL_SAMPLES


def test_the_eval_inputs_contract_is_checked_once_and_refused_naming_eval_input(tmp_path):
    def no_params():
        return tiny.eval_input_fn({})

    def raises(params):
        raise KeyError("eval_input.data_dir")

    def repeats(params):
        return tiny.eval_input_fn(params).repeat()

    for fn, says in ((no_params, "eval_input: "), (raises, "eval_input: the input function raised KeyError"),
                     (repeats, "eval_input: the eval Dataset repeats indefinitely")):
        with pytest.raises(Refused) as e:
            evaluator(tmp_path, eval_input_fn=fn).dataset()
        assert e.value.problems and e.value.problems[0].startswith(says), e.value.problems
    ev = evaluator(tmp_path)
    assert ev.dataset() is ev.dataset() and ev.info["batch_size"] == tiny.BATCH


def test_an_eval_input_without_a_batch_is_refused(tmp_path):
    def empty(params):
        return tiny.eval_input_fn(params).take(0)

    with pytest.raises(Refused, match="eval_input: "):
        evaluator(tmp_path, eval_input_fn=empty).evaluate(model(), 1)


def test_the_verdict_of_an_eval_run_says_what_was_evaluated(tmp_path, caplog):
    ev = evaluator(tmp_path)
    ev.evaluate(model(), 4)
    with caplog.at_level(logging.INFO, logger="csrun.runtime"):
        ev.verdict()
    first, second = [r.getMessage() for r in caplog.records if r.name == "csrun.runtime"][-2:]
    assert first.startswith(f"verdict (eval done): evaluated the checkpoint at global step 4: {tiny.EVAL_SAMPLES} "
                            "samples in 3 batches in ")
    assert second.startswith("  no training in mode eval") and second.endswith("eval/results.json")
