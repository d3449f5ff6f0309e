"""The file-coverage check for PyTorch DataLoaders (csrun_runtime/pytorch/coverage.py): the
files each streamer's DataLoader opens, watched while it is built and iterated, judged as for
TensorFlow (sharded, replicated, overlap, unknown); and through ``python -m
analyzer.file_coverage`` on a run.py, as cs_input_analyzer runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from csrun_runtime.pytorch.coverage import FIX_STREAMERS, check_dataloader_files  # noqa: E402
from csrun_runtime.pytorch.streamers import get_streaming_rank, num_streamers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FILES = 6


class PerFile(torch.utils.data.Dataset):
    """One sample per file, read in __getitem__."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i]) as f:
            return torch.tensor([float(f.read())])


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for k in range(FILES):
        (d / f"s{k}.txt").write_text(str(k))
    return sorted(str(p) for p in d.iterdir())


def _params(**ti):
    return {"train_input": {"batch_size": 1, "shuffle_seed": 3, "drop_last": True, "num_workers": 2,
                            "prefetch_factor": 2, **ti}, "runconfig": {}}


def _sampled(paths):
    ds = PerFile(paths)
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=num_streamers(), rank=get_streaming_rank(),
                                                  seed=3)
    return torch.utils.data.DataLoader(ds, batch_size=1, sampler=sampler, drop_last=True)


def test_a_distributed_sampler_over_files_is_sharded(data):
    cov = check_dataloader_files(lambda params: _sampled(data), _params())
    assert cov.verdict == "sharded" and cov.ok, cov
    assert set(cov.files[0]) | set(cov.files[1]) == set(data) and not set(cov.files[0]) & set(cov.files[1])
    assert "one pass" in cov.note and "cut" not in cov.note


def test_every_file_read_on_every_streamer_is_replicated(data):
    def fn(params):
        rows = []
        for p in data:  # every file read eagerly, the samples then split by the sampler
            with open(p) as f:
                rows.append(float(f.read()))
        ds = torch.utils.data.TensorDataset(torch.tensor(rows))
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=num_streamers(), rank=get_streaming_rank())
        return torch.utils.data.DataLoader(ds, batch_size=1, sampler=sampler, drop_last=True)

    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "replicated" and cov.ok and sorted(cov.all_files) == data


def test_the_same_half_on_every_streamer_is_an_overlap_with_the_fix(data):
    def fn(params):  # ignores the streamer facts' rank: both read the first half, nobody the rest
        return torch.utils.data.DataLoader(PerFile(data[:FILES // num_streamers()]), batch_size=1, drop_last=True)

    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "overlap" and len(cov.problems) == 1
    assert "3 of the 6 training file(s) are read by more than one of the 2 input workers" in cov.problems[0]
    assert "by none" in cov.problems[0] and cov.problems[0].endswith(FIX_STREAMERS)


def test_data_made_in_memory_is_unknown():
    def fn(params):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 2)), batch_size=2,
                                           drop_last=True)

    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "unknown" and cov.ok and "no data file was opened" in cov.note


def test_the_analyzers_check_process_watches_a_pytorch_run_py(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(4):
        (data / f"part-{k}.ids").write_text("".join(f"{k * 10 + j}\n" for j in range(10)))
    (tmp_path / "tap").mkdir()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train_input": {"batch_size": 5, "shuffle_seed": 1, "data_dir": str(data),
                                                      "tap_dir": str(tmp_path / "tap")},
                                      "runconfig": {"max_steps": 10}}))
    out = tmp_path / "coverage.json"
    proc = subprocess.run([sys.executable, "-m", "analyzer.file_coverage", "--out", str(out),
                           str(REPO / "tests/fixtures/pytorch_tap/run.py"), "--params", str(params)],
                          cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    # the tap fixture reads every .ids file of data_dir on every streamer (the sampler splits the ids)
    assert res["framework"] == "pytorch" and res["verdict"] == "replicated", res
    assert res["total_files"] == 4 and res["files_per_worker"] == {"0": 4, "1": 4}, res  # not the tap's files


OVERLAP_RUN_PY = '''
import os, sys, torch
from csrun_runtime.pytorch import num_streamers, run

class PerFile(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.paths = paths
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i]) as f:
            return torch.tensor([float(f.read())])

def train_data_fn(params):  # ignores the rank: every streamer reads the same first files
    d = params["train_input"]["data_dir"]
    paths = sorted(os.path.join(d, n) for n in os.listdir(d))
    return torch.utils.data.DataLoader(PerFile(paths[: len(paths) // num_streamers()]), batch_size=1, drop_last=True)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
    def forward(self, batch):
        return ((batch - self.w) ** 2).mean()

if __name__ == "__main__":
    run(lambda params: M(), train_data_fn)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_validate_only_says_the_overlap_and_strict_refuses_it(tmp_path, data, strict):
    run_py = tmp_path / "run.py"
    run_py.write_text(OVERLAP_RUN_PY)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train_input": {"batch_size": 1, "data_dir": str(Path(data[0]).parent)}}))
    md = tmp_path / "md"
    proc = subprocess.run([sys.executable, str(run_py), "--params", str(params), "--mode", "validate_only",
                           "--model_dir", str(md), *(["--strict"] if strict else [])],
                          cwd=str(REPO), capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert "are read by more than one of the 2 input workers" in proc.stderr, proc.stderr[-2000:]
    if strict:
        assert proc.returncode == 2 and not (md / "validate_report.txt").exists()
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        report = (md / "validate_report.txt").read_text()
        assert "input workers' files (the DataLoader built as streamers 0 and 1 of 2): overlap" in report
        assert "warning: train_input: 3 of the 6 training file(s)" in report
