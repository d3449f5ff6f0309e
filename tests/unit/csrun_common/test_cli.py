"""csrun_common/cli.py: the one-line exit of the three CLIs: usage errors, click's exceptions and
csrun's errors print ``<prog>: error: <message>`` on one line with their status, never a traceback;
an exception that carries no status is not csrun's to hide."""
from __future__ import annotations

import click
import pytest

from csrun_common import exits
from csrun_common.cli import OneLineErrors
from csrun_common.errors import CsrunError


def command(raise_: BaseException | None = None, returns: int | None = None) -> click.Command:
    @click.command(cls=OneLineErrors, name="csrun_x")
    @click.option("--n", type=int, default=1)
    def cmd(n):
        if raise_ is not None:
            raise raise_
        return returns

    return cmd


def run(cmd: click.Command, args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        cmd.main(args)
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("raise_, args, code, line", [
    (None, ["--n", "x"], exits.USAGE, "csrun_x: error: Invalid value for '--n': 'x' is not a valid integer.\n"),
    (CsrunError("--qos 'a b': not a Slurm name"), [], exits.USAGE, "csrun_x: error: --qos 'a b': not a Slurm name\n"),
    (CsrunError("the run failed", exit_code=exits.FAILED), [], exits.FAILED, "csrun_x: error: the run failed\n"),
    (click.ClickException("no such file"), [], 1, "csrun_x: error: no such file\n"),
    (click.Abort(), [], exits.INTERRUPTED, ""),
])
def test_each_error_is_one_line_with_its_status(raise_, args, code, line, capsys):
    assert run(command(raise_), args, capsys) == (code, line)


def test_a_command_returns_its_status_and_a_foreign_exception_propagates(capsys):
    assert run(command(returns=3), [], capsys) == (3, "")
    assert run(command(), [], capsys) == (0, "")
    with pytest.raises(KeyError):
        command(KeyError("a bug"), None).main([])
