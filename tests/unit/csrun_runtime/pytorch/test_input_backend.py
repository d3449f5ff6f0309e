"""The PyTorch input backend (csrun_runtime/pytorch/input_backend.py, chosen by
analyzer.probe_worker.backend_for): what the analyzer's probes build and iterate, inside the
pinned CPUs, without TensorFlow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analyzer.probe_worker import backend_for  # noqa: E402
from csrun_runtime.capture import load_entry  # noqa: E402
from csrun_runtime.input_backend import InputBuildError  # noqa: E402
from tests.unit.paths import REPO  # noqa: E402

RUN_PY = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from csrun_runtime.pytorch import run, num_streamers, get_streaming_rank

    def train_data_fn(params):
        ti = params["train_input"]
        ds = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(64, 1))
        extra = {"prefetch_factor": ti["prefetch_factor"]} if ti.get("always_prefetch") else {}
        return DataLoader(ds, batch_size=ti["batch_size"], drop_last=True, num_workers=ti["num_workers"], **extra)

    def model_fn(params):
        return torch.nn.Linear(1, 1)

    def default_params_fn(params):
        params["train_input"].setdefault("num_workers", 0)
        return {"train_input": {"batch_size": 8, "prefetch_factor": 2}}

    if __name__ == "__main__":
        run(model_fn, train_data_fn, None, default_params_fn)
        raise SystemExit("run() returned: capture mode must not train")
''')


def _run_py(tmp_path: Path, always_prefetch: bool = False) -> Path:
    (tmp_path / "run.py").write_text(RUN_PY)
    ti = "runconfig:\n  max_steps: 10\ntrain_input:\n  batch_size: 4\n"
    ti += "  always_prefetch: true\n" if always_prefetch else ""
    (tmp_path / "params.yaml").write_text(ti)
    return tmp_path / "run.py"


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_backend_builds_the_dataloader_with_the_probe_points_workers_inside_the_pinned_cpus(tmp_path):
    entry = load_entry(_run_py(tmp_path), ["--params", str(tmp_path / "params.yaml")])
    backend = backend_for(entry)
    assert backend.framework == "pytorch"
    cpus = sorted(os.sched_getaffinity(0))
    mine = {cpus[0]}
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, mine)
    try:
        built = backend.build(0, 1, 1, dataloader_workers=2)
        seen = [built.measure(next(built.batches)) for _ in range(40)]  # 16 batches a pass: 2 passes and more
        info = built.info
        built.close()
    finally:
        os.sched_setaffinity(0, set(cpus))
        torch.set_num_threads(threads)
    assert seen[0] == (4, 4 * 4)  # 4 samples of one float32
    assert info["dataloader_workers"] == 2 and info["torch_threads"] == 1
    assert info["dataloader_worker_processes"] == 2
    assert all(set(a) == mine for a in info["dataloader_worker_cpus"])  # inherited or pinned: the probe's CPUs
    assert built.restarts[0] >= 2


def test_a_point_the_data_function_cannot_build_is_an_input_build_error(tmp_path):
    """A processor that passes prefetch_factor even at num_workers 0 (torch 2 rejects it)."""
    entry = load_entry(_run_py(tmp_path, always_prefetch=True), ["--params", str(tmp_path / "params.yaml")])
    backend = backend_for(entry)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(InputBuildError, match="prefetch_factor"):
            backend.build(0, 1, 1, dataloader_workers=0)
        built = backend.build(0, 1, 1, dataloader_workers=1)
        assert built.measure(next(built.batches))[0] == 4
        built.close()
    finally:
        torch.set_num_threads(threads)


def test_a_pytorch_pipeline_probe_never_imports_tensorflow(tmp_path):
    """The probe process's whole PyTorch path: load run.py, build through the backend, measure."""
    run_py = _run_py(tmp_path)
    script = textwrap.dedent(f'''
        import json, sys
        from pathlib import Path
        from analyzer.probe_worker import ProbedPipeline, run_probe
        entry = ProbedPipeline({str(run_py)!r}, ["--params", {str(tmp_path / "params.yaml")!r}])
        cmd = {{"seq": 0, "kind": "pipeline", "tasks": 1, "cpus_per_task": 1, "warmup_s": 0.2, "measure_s": 0.3,
               "dataloader_workers": 1}}
        res = run_probe(entry, cmd, 0, sorted(__import__("os").sched_getaffinity(0)), Path({str(tmp_path)!r}))
        print(json.dumps({{"framework": entry.framework, "samples": res["samples"], "input": res["input"],
                          "tensorflow": "tensorflow" in sys.modules}}))
    ''')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["framework"] == "pytorch" and got["samples"] > 0
    assert got["input"]["dataloader_workers"] == 1 and got["input"]["torch_threads"] == 1
    assert got["tensorflow"] is False


def test_a_pytorch_served_probe_streams_over_the_data_plane_without_tensorflow(tmp_path):
    """The served probe's two processes (csrun_runtime/pytorch/probe.py): input worker 1 streams its DataLoader
    with a data-plane Sender, the chief (0) drains it through the PyTorch chief's RemoteSource; each
    measures its own CPU."""
    run_py = _run_py(tmp_path)
    (tmp_path / "bar").mkdir()
    script = textwrap.dedent(f'''
        import json, os, sys
        from pathlib import Path
        from analyzer.probe_worker import ProbedPipeline, run_probe
        index = int(sys.argv[1])
        entry = ProbedPipeline({str(run_py)!r}, ["--params", {str(tmp_path / "params.yaml")!r}])
        cmd = {{"seq": 0, "kind": "served", "tasks": 2, "cpus_per_task": 1, "warmup_s": 0.3, "measure_s": 0.5,
               "barrier_timeout_s": 60, "dataloader_workers": 1}}
        res = run_probe(entry, cmd, index, sorted(os.sched_getaffinity(0)), Path({str(tmp_path)!r}))
        print(json.dumps({{"res": res, "tensorflow": "tensorflow" in sys.modules}}))
        os._exit(0)
    ''')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    chief, worker = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert chief["res"]["samples"] > 0 and chief["res"]["samples_per_sec"] > 0  # batches of 4 delivered
    assert chief["res"]["samples"] % 4 == 0 and chief["res"]["cpu_seconds"] >= 0  # 10 ms ticks: may read 0
    assert worker["res"]["samples"] == 0 and worker["res"]["cpu_seconds"] > 0  # it sends; the chief counts
    assert worker["res"]["input"]["dataloader_workers"] == 1  # built as the pipeline probe builds it
    assert chief["res"]["synchronized"] and worker["res"]["synchronized"]
    assert not chief["tensorflow"] and not worker["tensorflow"]
