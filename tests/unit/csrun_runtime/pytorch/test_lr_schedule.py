"""``optimizer.learning_rate`` in the Model Zoo's forms (issue 33, item 3;
csrun_runtime/pytorch/lr_schedule.py): the rate at given steps, pure and through torch's
``LambdaLR`` on a real optimizer stepped by the PyTorch chief's step backend."""
from __future__ import annotations

import math

import pytest

from csrun_runtime.pytorch.contract import ContractError, build_optimizer
from csrun_runtime.pytorch.lr_schedule import Schedule, ScheduleError, parse_learning_rate

#: bert_base_classifier_sst2.yaml's optimizer block (Model Zoo R1.6.x), as YAML loads it
SST2 = {"optimizer_type": "AdamW", "weight_decay_rate": 0.01, "epsilon": "1e-6", "max_gradient_norm": 1.0,
        "learning_rate": [{"scheduler": "Linear", "steps": 2000, "initial_learning_rate": 0.0,
                           "end_learning_rate": 0.00001},
                          {"scheduler": "Constant", "learning_rate": 0.00001}],
        "loss_scaling_factor": "dynamic"}
#: params_gpt2_xl.yaml's warm-up then cosine decay
GPT2 = {"learning_rate": [{"scheduler": "Linear", "initial_learning_rate": 0.0, "steps": 10779,
                           "end_learning_rate": 1.0e-4},
                          {"scheduler": "CosineDecay", "initial_learning_rate": 1.0e-4, "end_learning_rate": 0,
                           "decay_steps": 3073099}]}


def rate(spec, step):
    s = parse_learning_rate(spec)
    assert isinstance(s, Schedule)
    return s.rate(step)


def test_a_number_and_a_numeric_string_are_constant_rates():
    assert parse_learning_rate({"learning_rate": 0.001}) == 0.001
    assert parse_learning_rate({"learning_rate": "1e-5"}) == 1e-5  # YAML's reading of 1e-5
    assert parse_learning_rate({}) == 0.01


def test_the_sst2_warm_up_then_constant():
    assert rate(SST2, 0) == 0.0
    assert rate(SST2, 1000) == pytest.approx(5e-6)
    assert rate(SST2, 1999) == pytest.approx(1e-5 * 1999 / 2000)
    assert rate(SST2, 2000) == pytest.approx(1e-5)
    assert rate(SST2, 20000) == pytest.approx(1e-5)


def test_the_gpt2_warm_up_then_cosine_decay():
    assert rate(GPT2, 10779) == pytest.approx(1e-4)
    assert rate(GPT2, 10779 + 3073099 // 2) == pytest.approx(5e-5, rel=1e-6)
    assert rate(GPT2, 10779 + 3073099) == pytest.approx(0.0, abs=1e-12)
    assert rate(GPT2, 10 ** 8) == pytest.approx(0.0, abs=1e-12)


def test_exponential_smooth_staircase_and_as_a_piece_of_a_list():
    exp = {"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5}
    assert rate({"learning_rate": exp}, 5) == pytest.approx(0.1 * 0.5 ** 0.5)
    stair = {"learning_rate": [{**exp, "staircase": True}]}
    assert [rate(stair, s) for s in (0, 9, 10, 25)] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    seq = {"learning_rate": [{**exp, "steps": 20}, {"scheduler": "Constant", "learning_rate": 0.01}]}
    assert rate(seq, 19) == pytest.approx(0.1 * 0.5 ** 1.9)
    assert rate(seq, 20) == pytest.approx(0.01)


def test_linear_polynomial_piecewise_and_global_steps():
    assert rate({"learning_rate": {"scheduler": "Polynomial", "initial_learning_rate": 1.0, "end_learning_rate": 0.0,
                                   "steps": 10, "power": 2}}, 5) == pytest.approx(0.25)
    pw = {"learning_rate": [{"scheduler": "PiecewiseConstant", "values": [1.0, 0.5, 0.1], "boundaries": [10, 20]}]}
    assert [rate(pw, s) for s in (0, 9, 10, 19, 20, 99)] == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    two = [{"scheduler": "Constant", "learning_rate": 1.0, "steps": 10},
           {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 20}]
    assert rate({"learning_rate": two}, 15) == pytest.approx(0.75)  # the piece's own step 5 of 20
    assert rate({"learning_rate": two, "disable_lr_steps_reset": True}, 15) == pytest.approx(0.25)  # step 15 of 20


@pytest.mark.parametrize("lr, match", [
    (0, r"optimizer\.learning_rate must be a number > 0"),
    ("fast", r"optimizer\.learning_rate must be a number > 0"),
    ([{"scheduler": "Cyclic", "learning_rate": 1}], r"optimizer\.learning_rate\[0\]\.scheduler 'Cyclic' is not"),
    ([{"scheduler": "Constant", "learning_rate": 1}, {"scheduler": "Constant", "learning_rate": 2}],
     r"optimizer\.learning_rate\[0\]\.steps is missing"),
    ([{"scheduler": "Linear", "initial_learning_rate": 1, "steps": 5}], r"\[0\]\.end_learning_rate is missing"),
    ([{"scheduler": "Exponential", "initial_learning_rate": 1, "decay_rate": 0.5, "decay_steps": 0}],
     r"\[0\]\.decay_steps must be an integer >= 1, got 0"),
    ([], r"optimizer\.learning_rate must be a number > 0 or a schedule"),
])
def test_bad_schedules_name_the_key_and_the_value(lr, match):
    with pytest.raises(ScheduleError, match=match):
        parse_learning_rate({"learning_rate": lr})


def test_the_optimizer_rule_reports_a_bad_schedule_as_a_contract_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(ContractError, match=r"optimizer\.learning_rate\[0\]\.steps is missing"):
        build_optimizer(torch.nn.Linear(1, 1), {"optimizer": {"learning_rate": [
            {"scheduler": "Constant", "learning_rate": 1}, {"scheduler": "Constant", "learning_rate": 2}]}})


def test_torch_steps_the_rate_from_the_global_step_a_run_starts_at(tmp_path):
    torch = pytest.importorskip("torch")
    from csrun_runtime.pytorch.contract import build_lr_scheduler
    from csrun_runtime.pytorch.training import OneBatch, TorchStepBackend

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def forward(self, b):
            return self.lin(b).pow(2).mean()

    params = {"optimizer": SST2}
    for start in (0, 1500, 2500):  # a fresh run, and runs resumed inside and after the warm-up
        model = M()
        opt = build_optimizer(model, params)
        assert isinstance(opt, torch.optim.AdamW) and opt.defaults["eps"] == 1e-6
        sched = build_lr_scheduler(model, opt, params, start)
        assert opt.param_groups[0]["lr"] == pytest.approx(rate(SST2, start))
        backend = TorchStepBackend(model=model, opt=opt, source=None, rc={"keep_checkpoint_max": 1},
                                   model_dir=tmp_path, device=torch.device("cpu"), evaluate=lambda m, s: None,
                                   forward_loss=lambda m, b: m(b), start=start, scheduler=sched)
        for _ in range(3):
            backend.train(OneBatch(torch.ones(4, 2), 0))
        assert opt.param_groups[0]["lr"] == pytest.approx(rate(SST2, start + 3))
        assert math.isfinite(opt.param_groups[0]["lr"])
    assert build_lr_scheduler(M(), build_optimizer(M(), {"optimizer": {"learning_rate": 0.1}}),
                              {"optimizer": {"learning_rate": 0.1}}, 0) is None
