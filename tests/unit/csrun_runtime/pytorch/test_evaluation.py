"""csrun_runtime/pytorch/evaluation.py with real torch (a tiny module on CPU, a temporary model_dir):
one pass over the eval DataLoader built as streamer 0 of 1 — the mean loss and the module's
``eval_metrics`` weighted by batch size, ``runconfig.eval_steps``, ``eval/results.json`` with its
history, the eval params and events — and the contract's refusals (no eval_data_fn, no batch)."""
from __future__ import annotations

import json

import pytest
import yaml

from csrun_runtime.params import resolve_params
from csrun_runtime.pytorch.contract import ContractError
from csrun_runtime.pytorch.evaluation import Evaluator

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

X = torch.arange(10, dtype=torch.float32).reshape(10, 1)


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w

    def eval_metrics(self, batch):
        return {"mean_x": batch[0].mean()}


def forward_loss(model, batch):
    """The squared error against 0: the mean of x² over the batch."""
    return (model(batch[0]) ** 2).mean()


def eval_data_fn(params):
    return DataLoader(TensorDataset(X), batch_size=params["eval_input"]["batch_size"])


def evaluator(tmp_path, data_fn=eval_data_fn, **runconfig) -> Evaluator:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train_input": {"batch_size": 4}, "eval_input": {"batch_size": 4},
                                    "runconfig": {"model_dir": str(tmp_path / "md"), **runconfig}}))
    params = resolve_params(["--params", str(path), "--mode", "eval"], run_py=None).params
    return Evaluator(data_fn, params, tmp_path / "md", torch.device("cpu"), forward_loss)


def test_one_pass_weights_each_batch_by_its_size_and_keeps_a_history(tmp_path):
    ev = evaluator(tmp_path)
    first = ev.evaluate(Scale(), 3)
    assert first["loss"] == pytest.approx(float((X ** 2).mean())) and first["mean_x"] == pytest.approx(4.5)
    ev.evaluate(Scale(), 6)
    md = tmp_path / "md"
    res = json.loads((md / "eval" / "results.json").read_text())
    assert (res["global_step"], res["eval_samples"], res["eval_batches"]) == (6, 10, 3)
    assert [h["global_step"] for h in res["history"]] == [3, 6]
    assert (md / "eval" / "params_eval.yaml").is_file() and list((md / "eval").glob("events.out.tfevents.*"))


def test_eval_steps_bound_the_pass(tmp_path):
    ev = evaluator(tmp_path, eval_steps=1)
    assert ev.evaluate(Scale(), 1)["mean_x"] == pytest.approx(1.5)  # the first batch: 0, 1, 2, 3


def test_no_eval_data_fn_or_no_batch_is_a_contract_error(tmp_path):
    with pytest.raises(ContractError, match=r"^eval_input: run\(\) was given no eval_data_fn$"):
        evaluator(tmp_path, data_fn=None).evaluate(Scale(), 1)

    def empty(params):
        return DataLoader(TensorDataset(X[:0]), batch_size=4)

    with pytest.raises(ContractError, match=r"eval_input: "):
        evaluator(tmp_path, data_fn=empty).evaluate(Scale(), 1)
