"""launcher/version.py: ``-V`` / ``--version`` of the three CLIs (csrun and Slurm client versions)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from launcher import cli


def invoke(command, args):
    result = CliRunner().invoke(command, args, prog_name=command.name)
    return result.exit_code, result.stdout, result.stderr


def test_dash_v_is_version():
    from analyzer.cli import main as analyzer

    for command, prog in ((cli.csrun_wse, "csrun_wse"), (cli.csrun_cpu, "csrun_cpu"), (analyzer, "cs_input_analyzer")):
        code, out, _ = invoke(command, ["-V"])
        assert code == 0 and out.startswith(f"{prog} (csrun) ") and "Slurm client: " in out

BIN = Path(sys.executable).parent


def test_version_of_the_three_clis():
    for prog in ("csrun_wse", "csrun_cpu", "cs_input_analyzer"):
        proc = subprocess.run([str(BIN / prog), "--version"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        first, second = proc.stdout.splitlines()
        assert first.startswith(f"{prog} (csrun) ") and second.startswith("Slurm client: ")
