"""csrun_runtime/pytorch/training.py on CPU: the step keeps the loss on the device and a NaN is named
by its step at the logging cadence."""
from __future__ import annotations

import logging
import time

import pytest

from tests.unit.csrun_runtime.pytorch.test_devicefeed import ListSource  # noqa: E402

torch = pytest.importorskip("torch")


# --------------------------------------------------------------------------- the loss at the cadence
def _backend(tmp_path, losses):
    from csrun_runtime.pytorch.training import TorchStepBackend

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, b):
            return self.w * b.sum()

    seq = iter(losses)
    return TorchStepBackend(model=M(), opt=None, source=ListSource([]), rc={"keep_checkpoint_max": 1},
                            model_dir=tmp_path, device=torch.device("cpu"), evaluate=lambda m, s: None,
                            forward_loss=lambda m, b: m.w * 0 + torch.tensor(next(seq)))


class _Opt:
    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def test_the_step_keeps_the_loss_on_the_device_and_a_nan_is_named_at_the_next_read(tmp_path):
    from csrun_runtime.pytorch.training import DeviceLoss, OneBatch

    b = _backend(tmp_path, [1.0, 2.0, float("nan"), 4.0, 5.0])
    b.opt = _Opt()
    out = [b.train(OneBatch(torch.ones(2), 0))[0] for _ in range(5)]  # no exception: nothing read
    assert all(isinstance(v, DeviceLoss) for v in out) and float(out[1]) == 2.0
    with pytest.raises(RuntimeError, match=r"loss is nan at global step 3 \(read at global step 5\)"):
        float(out[4])
    with pytest.raises(RuntimeError, match="global step 3"):
        b.save(5)  # a checkpoint reads it too: no NaN model saved
    assert not list(tmp_path.glob("model-ckpt-*"))


def test_the_loop_reports_a_nan_loss_at_its_log_line_naming_the_step(tmp_path, caplog):
    from csrun_runtime.loop import LoopSetup, TrainingDriver
    from csrun_runtime.pytorch.training import OneBatch

    b = _backend(tmp_path, [1.0, 0.5, float("inf"), 0.25, 0.1, 0.1])
    b.opt = _Opt()
    b.source = ListSource([torch.ones(2)] * 6)
    b.next_chunk = lambda limit, timeout, what: OneBatch(*b.source.next())  # type: ignore[method-assign]
    rc = {"log_steps": 4, "checkpoint_steps": 0, "max_steps": 6, "keep_checkpoint_max": 1}
    setup = LoopSetup(rc=rc, model_dir=tmp_path, mode="train", start=0, t_proc=time.time(), node=None,
                      num_input_workers=0, params_path=None, evaluating=False)
    caplog.set_level(logging.INFO, "csrun.runtime")
    with pytest.raises(RuntimeError, match=r"loss is inf at global step 3 \(read at global step 4\)"):
        TrainingDriver(setup, b).run()
    assert "global_step = 1, loss = 1" in caplog.text and "global_step = 4" not in caplog.text
    perf = (tmp_path / "performance" / "performance.json").read_text()
    assert "loss is inf at global step 3" in perf
