"""A Model Zoo-style processor (tests/fixtures/modelzoo_style) with real TensorFlow, without
the cluster: the sharding rules on real pipelines for several worker counts, rule 7 (files
that overlap) in ``validate_only`` and ``cs_input_analyzer`` with and without ``--strict``, and
the analyzer probing the processor's ``train_input_fn(params, input_context=None)`` as it is.
The same processor through csrun_wse: test_modelzoo_cluster.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "modelzoo_style"
RUN_PY = str(FIXTURE / "run.py")
BIN = Path(sys.executable).parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
ENV = {k: v for k, v in ENV.items() if not k.startswith("CSRUN_")}
FILES = 12


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """12 training files (ids file * 1000 + k), 2 eval files, a UNet-style train/ directory,
    and the fixture's modules importable in this process."""
    root = tmp_path_factory.mktemp("zoo_local")
    before = set(sys.modules)
    sys.path.insert(0, str(FIXTURE))
    import make_data

    make_data.write(str(root / "train"), FILES, 4)
    make_data.write(str(root / "eval"), 2, 16, prefix="eval", first=100)
    make_data.write(str(root / "unet" / "train"), 5, 4, suffix=".tfrecords")
    import data

    yield root, data
    sys.path.remove(str(FIXTURE))
    for name in set(sys.modules) - before:  # data, model, ... would shadow other run.py files' modules
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(FIXTURE)):
            del sys.modules[name]


def params(root: Path, **train_input) -> dict:
    return {"train_input": {"data_processor": "SyntheticRecordsProcessor", "data_dir": str(root / "train"),
                            "batch_size": 4, "shuffle_seed": 1234, **train_input},
            "eval_input": {"data_processor": "SyntheticRecordsProcessor", "data_dir": str(root / "eval"),
                           "batch_size": 4},
            "runconfig": {"max_steps": 20, "model_dir": str(root / "model_dir")}}


def built_files(input_fn, p: dict, workers: int, job: str = "77.0"):
    from csrun_runtime.tensorflow.pipeline import build_worker_input, pipeline_files

    out = {}
    for i in range(workers):
        b = build_worker_input(input_fn, p, i, workers, job_key=job)
        out[i] = (pipeline_files(b.dataset), b)
    return out


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 6, 12])
@pytest.mark.parametrize("seed", [1234, None])
def test_use_multiple_workers_gives_disjoint_covering_files_and_own_record_shuffles(zoo, workers, seed):
    from csrun_runtime.tensorflow.contract import shuffle_seeds

    root, data = zoo
    got = built_files(data.train_input_fn, params(root, use_multiple_workers=True, shuffle_seed=seed), workers)
    files = [f for fs, _ in got.values() for f in fs]
    assert len(files) == len(set(files)) == FILES
    if workers > 1:
        assert all(b.file_list_job_wide and b.shards_by_worker_count for _, b in got.values())
        for _, b in got.values():
            # the list_files shuffle with the job-wide pair, the record shuffle with the worker's
            pairs = {(x, y) for _, x, y in shuffle_seeds(b.dataset)}
            own = b.params["train_input"]["shuffle_seed"]
            assert b.file_list_seed_pairs <= pairs and len(b.file_list_seed_pairs) == 1
            if seed is not None:
                assert (own, own) in pairs
        if seed is not None:  # seeded per worker: the record-level shuffles differ
            assert len({b.params["train_input"]["shuffle_seed"] for _, b in got.values()}) == workers


@pytest.mark.parametrize("workers", [2, 3, 6])
def test_without_multiple_workers_each_worker_reads_every_file_in_its_own_order(zoo, workers):
    root, data = zoo
    got = built_files(data.train_input_fn, params(root, use_multiple_workers=False), workers)
    orders = [tuple(fs) for fs, _ in got.values()]
    assert all(len(o) == FILES for o in orders)
    assert len(set(orders)) == workers
    assert not any(b.file_list_job_wide for _, b in got.values())


def test_a_unet_style_pipeline_shards_through_compat_v1_readers(zoo):
    root, data = zoo
    p = {"train_input": {"data_processor": "DirectoryRecordsDataset", "dataset_path": str(root / "unet"),
                         "batch_size": 2, "seed": 3, "use_multiple_workers": True}}
    got = built_files(data.train_input_fn, p, 2)
    files = [f for fs, _ in got.values() for f in fs]
    assert len(files) == len(set(files)) == 5


def test_the_coverage_check_finds_overlap_and_names_the_fix(zoo):
    from csrun_runtime.tensorflow.contract import check_workers

    root, data = zoo
    rep = check_workers(data.train_input_fn, params(root, data_processor="GlobShuffleProcessor",
                                                    use_multiple_workers=True))
    assert rep.info["file_coverage"]["verdict"] == "overlap" and not rep.violations
    assert any("read by more than one" in w and "list_files" in w for w in rep.warnings), rep.warnings
    strict = check_workers(data.train_input_fn, params(root, data_processor="GlobShuffleProcessor",
                                                       use_multiple_workers=True), strict=True)
    assert strict.violations and not any("more than one" in w for w in strict.warnings)
    good = check_workers(data.train_input_fn, params(root, use_multiple_workers=True))
    assert good.info["file_coverage"]["verdict"] == "sharded" and good.ok and not good.warnings


def write_params(root: Path, name: str, **train_input) -> Path:
    path = root / f"{name}.yaml"
    p = params(root, **train_input)
    p["runconfig"]["model_dir"] = str(root / name)
    path.write_text(yaml.safe_dump(p))
    return path


def run_py(*argv, cwd):
    return subprocess.run([sys.executable, RUN_PY, *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=ENV)


def test_validate_only_warns_and_strict_refuses(zoo):
    root, _ = zoo
    bad = write_params(root, "glob", data_processor="GlobShuffleProcessor", use_multiple_workers=True)
    proc = run_py("--params", str(bad), "--mode", "validate_only", cwd=root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WARNING:csrun:train_input:" in out and "read by more than one" in out
    assert "input workers' files (checked as workers 0 and 1 of 2): overlap" in out
    proc = run_py("--params", str(bad), "--mode", "validate_only", "--strict", cwd=root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "ERROR:csrun:train_input:" in out and "validate_only: 1 violation(s)" in out
    assert "ERROR: train_input:" in (root / "glob" / "validate_report.txt").read_text()
    proc = run_py("--params", str(bad), "--mode", "validate_only", "--strict=yes", cwd=root)
    ours = [line for line in proc.stderr.splitlines() if ":csrun:" in line]  # not TensorFlow's start-up lines
    assert proc.returncode == 2 and len(ours) == 1 and "--strict" in ours[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_train_and_eval_in_process_with_eval_steps(zoo):
    root, _ = zoo
    good = write_params(root, "good", use_multiple_workers=True)
    proc = run_py("--params", str(good), "--mode", "train_and_eval", "--eval_steps", "3", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "good" / "eval" / "results.json").read_text())
    assert results["eval_batches"] == 3 and "accuracy" in results["metrics"]


def analyzer(*args, cwd):
    return subprocess.run([str(BIN / "cs_input_analyzer"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=ENV)


def test_the_analyzer_probes_the_processor_as_it_is_and_checks_its_files(zoo):
    root, _ = zoo
    good = write_params(root, "analyzed", use_multiple_workers=True)
    out = root / "analysis"
    proc = analyzer("--local", "--time-budget", "25", "--no-run-command", "--output", str(out),
                    "python", RUN_PY, "--params", str(good), "--mode", "validate_only", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["file_coverage"]["verdict"] == "sharded"
    assert any(p["status"] == "ok" and p["samples_per_sec"] > 0 for p in rep["probes"] if p["kind"] == "pipeline")
    assert rep["recommendation"]
    assert "input workers' files (input_fn built as workers 0 and 1 of 2): sharded" in proc.stdout


def test_the_analyzer_warns_about_overlap_and_strict_stops_it(zoo):
    root, _ = zoo
    bad = write_params(root, "analyzed_bad", data_processor="GlobShuffleProcessor", use_multiple_workers=True)
    cmd = ["python", RUN_PY, "--params", str(bad), "--mode", "validate_only"]
    proc = analyzer("--local", "--strict", "--no-run-command", "--output", str(root / "strict"), *cmd, cwd=root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cs_input_analyzer: error: train_input:" in proc.stderr and "list_files" in proc.stderr
    assert not (root / "strict" / "report.json").exists()  # stopped before probing
    proc = analyzer("--strict=1", *cmd, cwd=root)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--strict" in proc.stderr, proc.stderr
