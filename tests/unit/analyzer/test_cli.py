"""Unit tests of the cs_input_analyzer command line (no TensorFlow, no Slurm)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer import analyze as A

BIN = Path(sys.executable).parent / "cs_input_analyzer"


def run(*args, cwd=None):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_help_is_fast_and_lists_commands():
    t0 = time.monotonic()
    p = run("--help")
    assert p.returncode == 0
    assert time.monotonic() - t0 < 3.0
    for word in ("analyze", "verify", "shard-plan", "reshard"):
        assert word in p.stdout
    out = subprocess.run([sys.executable, "-c", "import sys, analyzer.cli; "
                          "print(any(m in sys.modules for m in ('tensorflow', 'pandas', 'matplotlib')))"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("args, flag", [
    (["--time-budget", "abc", "python", "run.py"], "--time-budget"),
    (["--time-budget", "0", "python", "run.py"], "--time-budget"),
    (["--available-nodes", "0", "python", "run.py"], "--available-nodes"),
    (["--target-samples-per-sec", "-5", "python", "run.py"], "--target-samples-per-sec"),
    (["--local", "python", "missing_run.py"], "missing_run.py"),
    (["--local", "ls", "-l"], "COMMAND"),
    (["verify", "--report", "/nonexistent/dir"], "--report"),
    (["verify", "--seconds", "0"], "--seconds"),
])
def test_bad_flags_one_line_exit_2(args, flag, tmp_path):
    p = run(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert flag in lines[0] and "Traceback" not in p.stderr


def test_default_command_and_subcommand_dispatch():
    p = run("shard-plan", "--help")
    assert p.returncode == 0 and "shard" in p.stdout.lower()
    p = run("verify", "--help")
    assert p.returncode == 0 and "--report" in p.stdout
    p = run("analyze", "--help")
    assert p.returncode == 0 and "--time-budget" in p.stdout


def test_bad_params_one_line(tmp_path):
    (tmp_path / "run.py").write_text("print('x')\n")
    p = run("--local", "python", "run.py", "--params", "nope.yaml", cwd=tmp_path)
    assert p.returncode == 2
    assert "nope.yaml" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_split_command(tmp_path):
    (tmp_path / "run.py").write_text("")
    c = A.split_command(["python", "run.py", "--mode", "validate_only"], str(tmp_path))
    assert c.run_py == str((tmp_path / "run.py").resolve()) and c.argv == ["--mode", "validate_only"]
    c = A.split_command(["run.py"], str(tmp_path))
    assert c.python_word is None
    with pytest.raises(A.CsrunError):
        A.split_command([], str(tmp_path))
    with pytest.raises(A.CsrunError):
        A.split_command(["python", "-c", "1"], str(tmp_path))


def test_find_target(tmp_path):
    assert A.find_target(str(tmp_path))[0] is None
    (tmp_path / "performance").mkdir()
    (tmp_path / "performance" / "performance.json").write_text(json.dumps({"est_samples_per_sec": 1234.5}))
    v, src = A.find_target(str(tmp_path))
    assert v == 1234.5 and "previous run" in src
    (tmp_path / "compile_report.txt").write_text("Estimated throughput: 2,500.5 samples/s\n")
    v, src = A.find_target(str(tmp_path))
    assert v == 2500.5 and "compile_report.txt" in src
    (tmp_path / "compile_report.json").write_text(json.dumps({"est_samples_per_sec": 999}))
    assert A.find_target(str(tmp_path))[0] == 999.0


def test_no_slurm_suggests_local(tmp_path):
    (tmp_path / "run.py").write_text("")
    env = {**__import__("os").environ, "SLURM_CONF": str(tmp_path / "missing" / "slurm.conf")}
    p = subprocess.run([str(BIN), "python", "run.py", "--mode", "validate_only"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--local" in lines[0] and "Slurm" in lines[0]
    assert not (tmp_path / "model_dir").exists()
