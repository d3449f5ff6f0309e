"""csrun_runtime/pytorch/report.py with real torch (a tiny module on CPU): compile_only's report
(one forward and backward, then timed forwards: ``compile_report.txt`` / ``.json``) and
validate_only's (one batch of the training and of the eval DataLoader; a DataLoader that yields
none refused naming ``train_input``)."""
from __future__ import annotations

import json

import pytest

from csrun_runtime.pytorch.contract import ContractError
from csrun_runtime.pytorch.report import compile_report, validate_report

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def test_compile_only_measures_one_step_and_the_forwards(tmp_path):
    model = torch.nn.Linear(3, 1)
    batch = (torch.ones(4, 3), torch.zeros(4, 1))

    def forward_loss(m, b):
        return torch.nn.functional.mse_loss(m(b[0]), b[1])

    compile_report(model, torch.optim.SGD(model.parameters(), 0.1), batch, torch.device("cpu"), forward_loss, 3,
                   tmp_path)
    rec = json.loads((tmp_path / "compile_report.json").read_text())
    assert (rec["framework"], rec["module"], rec["parameters"], rec["optimizer"], rec["batch_size"]) == \
        ("pytorch", "Linear", 4, "SGD", 4)
    assert rec["first_step_time"] > 0 and rec["est_forward_samples_per_sec"] > 0
    assert all(p.grad is not None for p in model.parameters())  # the backward ran
    assert (tmp_path / "compile_report.txt").read_text().startswith("compile_only (PyTorch, no compiler: eager cpu)")


def test_validate_only_reads_one_batch_of_each_dataloader(tmp_path):
    train = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4, drop_last=True)
    validate_report(train, lambda: DataLoader(TensorDataset(torch.zeros(6, 2)), batch_size=3), tmp_path,
                    ["input workers' files: sharded"])
    assert (tmp_path / "validate_report.txt").read_text().splitlines() == [
        "validate_only: the run.py contract holds (PyTorch)",
        "train_input: DataLoader ok: batch_size 4, 2 batch(es) per pass, num_workers 0, drop_last True",
        "eval_input: DataLoader ok: batch_size 3", "input workers' files: sharded"]
    with pytest.raises(ContractError, match=r"^train_input: the DataLoader yielded no batch$"):
        validate_report(DataLoader(TensorDataset(torch.zeros(0, 2)), batch_size=4), None, tmp_path)
