"""launcher/argv_exec.py, the shim a user's command with a lone ``:`` goes through (srun would read
the ``:`` as a het-component separator): the argv reaches the program byte for byte, and a program
that cannot be executed exits 127 naming it in one line."""
from __future__ import annotations

import json
import subprocess
import sys

from csrun_common.exits import EXEC_FAILED
from tests.unit.paths import REPO


def shim(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.argv_exec", json.dumps(argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_the_argv_reaches_the_program_byte_for_byte():
    words = [":", "a b", "'q'", "$HOME", "é", ""]
    out = shim([sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *words])
    assert out.returncode == 0 and json.loads(out.stdout) == words


def test_a_program_that_cannot_run_exits_127_in_one_line():
    out = shim(["csrun-no-such-program", ":"])
    assert out.returncode == EXEC_FAILED == 127
    assert out.stderr == "csrun: cannot execute 'csrun-no-such-program': No such file or directory\n"
