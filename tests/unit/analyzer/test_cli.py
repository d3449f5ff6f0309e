"""Unit tests of the cs_input_analyzer command line (no TensorFlow, no Slurm)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from analyzer.cli import AnalyzerGroup
from tests.unit.paths import REPO

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


def test_no_slurm_suggests_local(tmp_path):
    (tmp_path / "run.py").write_text("")
    env = {**__import__("os").environ, "SLURM_CONF": str(tmp_path / "missing" / "slurm.conf")}
    p = subprocess.run([str(BIN), "python", "run.py", "--mode", "validate_only"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--local" in lines[0] and "Slurm" in lines[0]
    assert not (tmp_path / "model_dir").exists()


def test_default_command_hook():
    grp = AnalyzerGroup(name="g")
    seen = {}

    @click.command("analyze", context_settings={"ignore_unknown_options": True})
    @click.option("--num-nodes", type=int)
    @click.argument("command", nargs=-1, type=click.UNPROCESSED)
    def analyze(num_nodes, command):
        seen.update(num_nodes=num_nodes, command=command)

    @click.command("other")
    def other():
        seen["other"] = True

    grp.add_command(analyze)
    grp.add_command(other)
    grp.set_default("analyze")
    r = CliRunner().invoke(grp, ["--num-nodes", "2", "python", "run.py", "--mode", "train"])
    assert r.exit_code == 0, r.output
    assert seen == {"num_nodes": 2, "command": ("python", "run.py", "--mode", "train")}
    assert CliRunner().invoke(grp, ["other"]).exit_code == 0 and seen["other"]


def test_cli_import_is_light():
    code = ("import sys, analyzer.cli; "
            "heavy = [m for m in ('numpy', 'tensorflow', 'pandas', 'tqdm') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout + proc.stderr
