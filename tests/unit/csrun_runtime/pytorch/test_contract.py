"""The PyTorch run.py contract (csrun_runtime/pytorch/contract.py, docs/PYTORCH.md): sharding and
seeds for 1..64 streamers, contract errors, epochs, ``to_torch``, a whole local run (stop and
requeue signals) and no TensorFlow import."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from csrun_runtime.pytorch import checkpoint, streamers  # noqa: E402
from csrun_runtime.pytorch import contract as c  # noqa: E402
from csrun_runtime.pytorch.contract import epochs, to_torch  # noqa: E402
from csrun_runtime.pytorch.events import read_scalars  # noqa: E402
from tests.unit.paths import REPO  # noqa: E402

N = 1437  # the digits training set


def _shares(num: int, seed_of, drop_last: bool, epoch: int = 0) -> list[list[int]]:
    ds = range(N)
    out = []
    for rank in range(num):
        s = DistributedSampler(ds, num_replicas=num, rank=rank, shuffle=True, seed=seed_of(rank), drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("num", [1, 2, 3, 5, 6, 7, 8, 16, 31, 64])
def test_job_wide_seed_makes_distributed_sampler_shares_disjoint_and_covering(num):
    params = {"train_input": {"shuffle_seed": 1234, "num_workers": 3}}
    seeds = [c.process_params(params, r, num, True)["train_input"]["shuffle_seed"] for r in range(num)]
    assert seeds == [1234] * num  # the YAML's seed, unchanged on every streamer
    shares = _shares(num, lambda r: seeds[r], drop_last=True)
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat)), "two streamers read the same sample"
    assert len(set(range(N)) - set(flat)) == N % num  # only the remainder is dropped
    padded = [i for s in _shares(num, lambda r: seeds[r], drop_last=False) for i in s]
    assert set(padded) == set(range(N))  # without drop_last: every sample, W-1 at most twice
    assert len(padded) - N < num
    assert _shares(num, lambda r: 1234, True, epoch=1) != shares or num == N  # a new shuffle each pass


def test_a_per_worker_seed_would_make_shares_overlap():
    """The rule's reason (issue 25): ``shuffle_seed + rank`` in a sampler that splits."""
    flat = [i for s in _shares(6, lambda r: 1234 + r, drop_last=True) for i in s]
    assert len(flat) != len(set(flat))


def test_csrun_facts_stay_out_of_train_input():
    params = {"train_input": {"shuffle_seed": 7, "num_workers": 4, "prefetch_factor": 2}, "runconfig": {"seed": 1}}
    p = c.process_params(params, 2, 5, True)
    assert p["train_input"] == params["train_input"]  # num_workers: the DataLoader's processes
    assert p["csrun"] == {"streaming_rank": 2, "num_streamers": 5, "is_streamer": True, "torch_seed": 9,
                          "data_files": None}
    assert c.torch_seed({"runconfig": {"seed": 3}}, 4) == 7
    assert c.torch_seed({}, 4) is None


@pytest.mark.parametrize("num", [1, 2, 8, 64])
def test_torch_rng_and_dataloader_worker_seeds_differ_per_streamer(num):
    params = {"train_input": {"shuffle_seed": 1234}}
    draws, base_seeds = [], []
    for rank in range(num):
        c.seed_process(c.torch_seed(params, rank))
        draws.append(torch.rand(4).tolist())
        base_seeds.append(int(torch.empty((), dtype=torch.int64).random_().item()))  # as DataLoader draws it
    assert len({tuple(d) for d in draws}) == num
    assert len(set(base_seeds)) == num


def test_dataloader_worker_processes_get_the_streamers_seed():
    class Seeds(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor(torch.utils.data.get_worker_info().seed)

    seen = []
    for rank in range(2):
        c.seed_process(c.torch_seed({"train_input": {"shuffle_seed": 5}}, rank))
        dl = DataLoader(Seeds(), batch_size=2, num_workers=1, worker_init_fn=c.worker_init_fn)
        seen.append({int(x) for b in dl for x in b})
    assert seen[0] and seen[1] and not seen[0] & seen[1]


# ------------------------------------------------------------------ contract errors
def _loader(**kw):
    return DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4, **kw)


def test_contract_errors_name_the_rule():
    with pytest.raises(c.ContractError, match=r"train_input: .*must return a torch.utils.data.DataLoader, got list"):
        c.call_data_fn(lambda p: [1, 2], {}, "train_input")
    with pytest.raises(c.ContractError) as e:
        c.call_data_fn(lambda p: _loader(drop_last=False), {}, "train_input")
    assert "Inconsistent batch sizes detected. To ensure a fixed batch size across all steps" in str(e.value)
    assert "drop_last=True" in str(e.value)
    c.call_data_fn(lambda p: _loader(drop_last=False), {}, "eval_input")  # eval: a short last batch is fine
    with pytest.raises(c.ContractError, match=r"train_input: the data function raised ValueError: .*prefetch_factor"):
        c.call_data_fn(lambda p: _loader(drop_last=True, prefetch_factor=2), {}, "train_input")
    with pytest.raises(c.ContractError, match="must return a torch.nn.Module, got dict"):
        c.check_module({})
    with pytest.raises(c.ContractError, match=r"must return the loss.*got \(3,\)"):
        c.loss_of(torch.zeros(3))
    assert float(c.loss_of({"loss": torch.tensor([2.0])})) == 2.0
    m = torch.nn.Linear(2, 1)
    with pytest.raises(c.ContractError, match="optimizer.optimizer_type 'lamb' is not supported"):
        c.build_optimizer(m, {"optimizer": {"optimizer_type": "lamb"}})
    with pytest.raises(c.ContractError, match="optimizer.learning_rate must be a number > 0.*got -1"):
        c.build_optimizer(m, {"optimizer": {"optimizer_type": "sgd", "learning_rate": -1}})
    opt = c.build_optimizer(m, {"optimizer": {"optimizer_type": "Momentum", "learning_rate": 0.1}})
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9


def test_epochs_set_the_sampler_epoch_and_refuse_an_empty_loader():
    ds = TensorDataset(torch.arange(8))
    s = DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    it = epochs(DataLoader(ds, batch_size=2, sampler=s, drop_last=True))
    first = [int(x) for _ in range(2) for x in next(it)[0]]
    second = [int(x) for _ in range(2) for x in next(it)[0]]
    assert s.epoch == 1 and first != second  # pass 2 reshuffled (the same on every streamer: seed 3 + epoch)
    with pytest.raises(c.ContractError, match="yielded no batch"):
        next(epochs(DataLoader(TensorDataset(torch.zeros(3)), batch_size=4, drop_last=True)))


def test_batches_through_the_data_plane_framing():
    from csrun_runtime.dataplane import flatten, unflatten

    batch = {"x": torch.rand(4, 3), "y": (torch.arange(4), [torch.ones(4, dtype=torch.bool)])}
    tree, leaves = flatten(c.to_numpy(batch))
    back = c.to_torch(unflatten(tree, leaves))
    assert torch.equal(back["x"], batch["x"]) and torch.equal(back["y"][0], batch["y"][0])
    assert back["y"][1][0].dtype == torch.bool and c.batch_size_of(back) == 4


# ------------------------------------------------------------------ no TensorFlow
def test_import_in_a_launched_task_does_not_import_tensorflow(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nimport csrun_runtime.pytorch\nprint('tensorflow' in sys.modules)\n")
    env = {**os.environ, "CSRUN_ROLE": "chief"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_a_whole_local_run_never_imports_tensorflow(tmp_path):
    """The example trains, evaluates (accuracy reported) and writes its artifacts with a
    ``tensorflow`` package on the path that fails the run if anything imports it."""
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(textwrap.dedent(f"""
        open({str(tmp_path / 'TF_IMPORTED')!r}, "w").close()
        raise ImportError("tensorflow must not be imported by the PyTorch path")
    """))
    md = tmp_path / "md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSRUN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), str(REPO)])
    run_py = REPO / "examples" / "digits_pt" / "run.py"
    proc = subprocess.run([sys.executable, str(run_py), "--mode", "train_and_eval", "--max_steps", "60",
                           "--model_dir", str(md)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "TF_IMPORTED").exists()
    assert "Eval results at global step 60 (360 samples): loss = " in proc.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(md)] == [60]
    import json

    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["total_samples"] == 60 * 64 and perf["framework"] == "pytorch"
    assert perf["batches_per_worker"] == {"in-process": 60}
    assert {t for _, t, _ in read_scalars(next(md.glob("events.out.tfevents.*")))} >= {"loss", "samples_per_sec"}
    assert (md / "train" / "params_train.yaml").exists()
    res = json.loads((md / "eval" / "results.json").read_text())
    assert res["global_step"] == 60 and 0.0 <= res["metrics"]["accuracy"] <= 1.0
    # validate_only: drop_last false is the fixed-batch-size error, exit 2, no traceback
    bad = tmp_path / "bad.yaml"
    import yaml

    params = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    params["train_input"]["drop_last"] = False
    bad.write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, str(run_py), "--params", str(bad), "--mode", "validate_only",
                           "--model_dir", str(md)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Inconsistent batch sizes detected" in proc.stderr


def test_the_example_data_function_shards_with_csruns_facts():
    """examples/digits_pt's DataLoader built as each of 6 input workers (as the runtime builds it:
    the facts set, params per process): the samplers' shares are disjoint but for
    DistributedSampler's padding and cover the 1,437 training examples."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("digits_pt_data", REPO / "examples" / "digits_pt" / "data.py")
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    params = yaml.safe_load((REPO / "examples" / "digits_pt" / "configs" / "params.yaml").read_text())
    shares = []
    try:
        for rank in range(6):
            streamers.set_facts(streamers.StreamerFacts(6, rank, True))
            loader = c.call_data_fn(data.train_data_fn, c.process_params(params, rank, 6, True), "train_input")
            shares.append(list(loader.sampler))
            assert loader.num_workers == params["train_input"]["num_workers"]
    finally:
        streamers.set_facts(None)
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(N))
    assert len(flat) - len(set(flat)) == (-N) % 6  # the padding repeats, nothing else


def _signalled_run(tmp_path, sig: str, extra_env: dict | None = None, max_steps: int = 1000000) -> tuple[int, str]:
    """The example training in one process, sent ``sig`` once it logged step 50."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("CSRUN_")}
    env.update(PYTHONPATH=str(REPO), **(extra_env or {}))
    log = tmp_path / f"log-{sig}"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "examples/digits_pt/run.py"), "--mode", "train",
                                 "--max_steps", str(max_steps), "--model_dir", str(tmp_path / "md")], env=env,
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "global_step = 50," not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(getattr(signal, sig))
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, log.read_text()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_saves_a_checkpoint_and_says_so(tmp_path, sig):
    import json
    import signal

    code, log = _signalled_run(tmp_path, sig)
    assert code == 128 + getattr(signal, sig), log
    md = tmp_path / "md"
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["ended"] == f"stopped by {sig}" and perf["stopped_by"] == sig
    assert checkpoint.list_checkpoints(md)[-1][0] == perf["global_step_end"] > 50
    assert "Traceback" not in log


def test_requeue_signal_exits_75_and_the_next_allocation_loses_no_step(tmp_path):
    """csrun_wse --requeue's warning signal (``CSRUN_STOP_SIGNALS``, csrun_runtime.preemption):
    a checkpoint at the step reached, exit 75; the next start resumes from exactly that step."""
    import json

    code, log = _signalled_run(tmp_path, "SIGUSR2", {"CSRUN_STOP_SIGNALS": "USR2:TERM"})
    assert code == 75, log
    md = tmp_path / "md"
    first = json.loads((md / "performance" / "performance.json").read_text())
    saved = first["global_step_end"]
    assert first["stopped_by"] == "SIGUSR2" and checkpoint.list_checkpoints(md)[-1][0] == saved
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSRUN_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(REPO / "examples/digits_pt/run.py"), "--mode", "train",
                           "--max_steps", str(saved + 30), "--model_dir", str(md)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_start"] == saved and perf["global_step_end"] == saved + 30
    assert perf["allocations"] == 2 and perf["global_steps_per_allocation"] == [[0, saved], [saved, saved + 30]]


def test_to_torch_keeps_a_tensor_already_on_the_device():
    t = torch.arange(6).reshape(2, 3)
    out = to_torch({"x": t, "y": (np.ones(2, np.float32),)}, torch.device("cpu"))
    assert out["x"] is t  # already there: neither pinned nor copied
    assert out["y"][0].dtype == torch.float32
    assert to_torch(t, "cpu") is t
    if torch.cuda.is_available():  # issue 31: "cannot pin 'torch.cuda.ByteTensor'"
        g = torch.zeros(4, dtype=torch.uint8, device="cuda")
        assert to_torch(g, "cuda") is g and to_torch(g, torch.device("cuda", 0)) is g
