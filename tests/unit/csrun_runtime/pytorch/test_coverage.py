"""The file-coverage check for PyTorch DataLoaders (csrun_runtime/pytorch/coverage.py): the
files each streamer's DataLoader opens, watched while it is built and iterated, judged as for
TensorFlow (sharded, replicated, overlap, unknown), or the dataset indices each streamer's
sampler draws where they can be compared (sharded by sample, replicated, overlap); and through
``python -m analyzer.file_coverage`` on a run.py, as cs_input_analyzer runs it."""
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
from tests.unit.paths import REPO  # noqa: E402

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
    assert cov.verdict == "sharded" and cov.ok and cov.level == "file", cov
    assert set(cov.files[0]) | set(cov.files[1]) == set(data) and not set(cov.files[0]) & set(cov.files[1])
    assert "one pass" in cov.note and "cut" not in cov.note


def test_each_streamers_own_files_are_sharded_by_file(data):
    def fn(params):  # every num_streamers()-th file: the dataset itself is the share
        return torch.utils.data.DataLoader(PerFile(data[get_streaming_rank()::num_streamers()]), batch_size=1,
                                           drop_last=True)

    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "sharded" and cov.ok and cov.level == "file", cov
    assert cov.files == {0: data[0::2], 1: data[1::2]}


def _in_memory(path, sampler_of):
    """One file loaded whole (as examples/digits_pt loads its .npz), split (or not) by ``sampler_of``."""
    def fn(params):
        with open(path) as f:
            rows = [float(x) for x in f.read().split()]
        ds = torch.utils.data.TensorDataset(torch.tensor(rows))
        return torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler_of(ds), drop_last=True)
    return fn


@pytest.fixture()
def one_file(tmp_path):
    p = tmp_path / "all.txt"
    p.write_text(" ".join(str(k) for k in range(101)))
    return str(p)


def test_one_file_split_by_distributed_sampler_is_sharded_by_sample(one_file):
    fn = _in_memory(one_file, lambda ds: torch.utils.data.DistributedSampler(
        ds, num_replicas=num_streamers(), rank=get_streaming_rank(), seed=3))
    cov = check_dataloader_files(fn, _params())
    # every streamer opens the one file: by file that would be "replicated" (or, with the file opened only
    # once, "worker 1 read no file"); the samples are what is split
    assert cov.verdict == "sharded" and cov.ok and cov.level == "sample", cov
    assert cov.note.startswith("sample-level: disjoint (streamers 0 and 1 of 2 draw 51 and 51 of the 101 samples; "
                               "1 drawn twice: the sampler's padding"), cov.note
    assert "6 drawn but dropped by the DataLoader's drop_last" in cov.note  # 51 % 4 = 3 per streamer
    assert "files not judged" in cov.note and "1 by both" in cov.note
    assert cov.to_dict()["level"] == "sample"


def test_every_sample_on_every_streamer_is_replicated_by_sample_a_warning(one_file):
    fn = _in_memory(one_file, lambda ds: torch.utils.data.RandomSampler(ds))  # no split by streamer
    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "replicated" and cov.level == "sample" and len(cov.problems) == 1, cov
    assert cov.problems[0].startswith("every one of the 101 samples is drawn by each of the 2 input workers")
    assert cov.problems[0].endswith(FIX_STREAMERS) and cov.note.startswith("sample-level: replicated")


def test_per_streamer_sampler_seeds_overlap_by_sample(one_file):
    fn = _in_memory(one_file, lambda ds: torch.utils.data.DistributedSampler(  # a seed per rank: shares overlap
        ds, num_replicas=num_streamers(), rank=get_streaming_rank(), seed=3 + get_streaming_rank()))
    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "overlap" and cov.level == "sample" and len(cov.problems) == 1, cov
    assert "of the 101 samples are drawn by more than one of the 2 input workers" in cov.problems[0]
    assert cov.note.startswith("sample-level: overlap")


def test_the_drop_last_remainder_is_dropped_not_unread(tmp_path):
    d = tmp_path / "files"
    d.mkdir()
    paths = []
    for k in range(41):
        (d / f"f{k:02d}.txt").write_text(str(k))
        paths.append(str(d / f"f{k:02d}.txt"))

    def fn(params):  # one sample per file; 41 % 2 = 1 left out by the sampler, 20 % 3 = 2 per streamer by the batches
        ds = PerFile(paths)
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=num_streamers(), rank=get_streaming_rank(),
                                                      seed=5, drop_last=True)
        return torch.utils.data.DataLoader(ds, batch_size=3, sampler=sampler, drop_last=True)

    cov = check_dataloader_files(fn, _params())
    # by file, 5 of the 41 files are read by no streamer this pass (before: "read by none", overlap)
    assert len(set(cov.files[0]) | set(cov.files[1])) == 36 and not set(cov.files[0]) & set(cov.files[1])
    assert cov.verdict == "sharded" and cov.ok and cov.level == "sample", cov
    assert "1 left out: the sampler's drop_last remainder" in cov.note
    assert "4 drawn but dropped by the DataLoader's drop_last" in cov.note


def test_an_iterable_dataset_says_the_samples_were_not_judged(data):
    class Lines(torch.utils.data.IterableDataset):
        def __iter__(self):
            for p in data:
                with open(p) as f:
                    yield torch.tensor([float(f.read())])

    cov = check_dataloader_files(lambda params: torch.utils.data.DataLoader(Lines(), batch_size=1, drop_last=True),
                                 _params())
    assert cov.verdict == "replicated" and cov.ok and cov.level == "file", cov
    assert "samples not judged: an IterableDataset (Lines) has no indices to list" in cov.note


def test_the_same_half_on_every_streamer_is_an_overlap_with_the_fix(data):
    def fn(params):  # ignores the streamer facts' rank: both read the first half, nobody the rest
        return torch.utils.data.DataLoader(PerFile(data[:FILES // num_streamers()]), batch_size=1, drop_last=True)

    cov = check_dataloader_files(fn, _params())
    assert cov.verdict == "overlap" and len(cov.problems) == 1
    assert "3 of the 6 training file(s) are read by more than one of the 2 input workers" in cov.problems[0]
    assert "by none" in cov.problems[0] and cov.problems[0].endswith(FIX_STREAMERS)


def test_data_made_in_memory_is_unknown_by_file_and_judged_by_sample():
    def fn(params):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 2)), batch_size=2,
                                           drop_last=True)

    cov = check_dataloader_files(fn, _params())
    # no file opened; the default sampler gives both streamers all 8 samples
    assert cov.verdict == "replicated" and cov.level == "sample" and "no data file was opened" in cov.note


def test_the_digits_example_is_sharded_by_sample_with_no_warning(tmp_path):
    params = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    for sec in ("train_input", "eval_input"):  # no prepared data there: the example's shipped digits.npz, one file
        params[sec]["data_dir"] = str(tmp_path / "none")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "coverage.json"
    proc = subprocess.run([sys.executable, "-m", "analyzer.file_coverage", "--out", str(out),
                           str(REPO / "examples/digits_pt/run.py"), "--params", str(tmp_path / "params.yaml")],
                          cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    # before: "input worker(s) 1 of 2 read no file" and overlap (a time-zone file sklearn's first import read)
    assert res["verdict"] == "sharded" and res["level"] == "sample" and res["problems"] == [], res
    assert res["note"].startswith("sample-level: disjoint (streamers 0 and 1 of 2 draw 719 and 719 of the 1437")
    # one file read whole by both streamers: not a file-level overlap, the split being by sample
    assert "files not judged, the split being by sample" in res["note"]


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
    assert res["framework"] == "pytorch" and res["verdict"] == "sharded" and res["level"] == "sample", res
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
