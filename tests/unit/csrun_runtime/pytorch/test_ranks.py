"""csrun_runtime/pytorch/ranks.py: a module's parameters and statistics digested apart (every rank
compares them at the end), and DistributedDataParallel's unused-parameter error in one line naming
the key that allows it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from csrun_runtime.pytorch.ranks import ddp_misuse, statistics_digest, weights_digest  # noqa: E402
from csrun_runtime.pytorch.tensorbytes import entry, split_state  # noqa: E402


def zoo_buffers() -> dict:
    """One buffer of each kind the digest must read: 0-dim int64 (BatchNorm's
    ``num_batches_tracked``), bool, int32, bfloat16, float16, complex, a 0-dim float, an empty one
    and a non-contiguous one (a transpose)."""
    return {"count": torch.tensor(7), "mask": torch.tensor([True, False, True]),
            "ints": torch.arange(5, dtype=torch.int32), "fp16": torch.ones(3, dtype=torch.float16) / 3,
            "bf16": torch.ones(2, 2, dtype=torch.bfloat16) / 7, "cplx": torch.tensor([1 + 2j, -3j]),
            "temp": torch.tensor(0.5), "empty": torch.zeros(0, 4), "nc": torch.arange(12.0).reshape(3, 4).t()}


def test_a_module_splits_into_parameters_and_statistics_and_both_are_digested():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(2)
            self.scale = torch.nn.Parameter(torch.tensor(2.0))  # 0-dim, learnable
            for k, v in zoo_buffers().items():
                self.register_buffer(k, v)

    m = M()
    params, stats = split_state(m)
    assert set(params) == {"bn.weight", "bn.bias", "scale"}
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "count", "nc"} <= set(stats)
    w, s = weights_digest(m), statistics_digest(m)
    m.bn.running_mean += 1  # a statistic: only the statistics' digest moves
    assert weights_digest(m) == w and statistics_digest(m) != s
    with torch.no_grad():
        m.scale += 1
    assert weights_digest(m) != w
    assert entry("extra", {"a": 1})[1:3] == ("object", ())  # a module's extra state: its pickle


def test_ddps_unused_parameter_error_becomes_one_line_naming_the_key():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    torch_text = ("Expected to have finished reduction in the prior iteration before starting a new one. ... "
                  "passing the keyword argument `find_unused_parameters=True` to "
                  "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all ...\n"
                  "Parameter indices which did not receive grad for rank 1: 2 3\n In addition, ...")
    line = ddp_misuse(RuntimeError(torch_text), m)
    assert line is not None and "\n" not in line
    assert line.startswith("runconfig.ddp.find_unused_parameters: the model's 1.weight, 1.bias got no gradient")
    assert "runconfig.ddp: {find_unused_parameters: true}" in line
    assert ddp_misuse(RuntimeError("CUDA out of memory"), m) is None


def test_the_digests_take_a_zero_dimensional_buffer():
    m = torch.nn.BatchNorm1d(3)  # num_batches_tracked: a 0-d int64 buffer (it failed: no byte view of a 0-d tensor)
    weights, stats = weights_digest(m), statistics_digest(m)
    m.num_batches_tracked += 1
    assert weights.startswith("sha256:") and stats.startswith("sha256:")
    assert weights_digest(m) == weights and statistics_digest(m) != stats  # a statistic, not a weight
