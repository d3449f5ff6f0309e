"""``cs_input_analyzer``: the click group and its subcommands.

Subcommands registered here: ``shard-plan`` and ``reshard``
(:mod:`analyzer.shard_commands`). The analyzing command itself (``cs_input_analyzer
[OPTIONS] python run.py ...``) is meant to be registered as the group's *default
command* with :meth:`AnalyzerGroup.set_default`: any argument list whose first word is
not a subcommand name (nor ``--help``) is then handed to it whole, options included.

Keep this module light: no TensorFlow, pandas or NumPy at import time (``--help``
must stay well under a second); commands import what they need when they run.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from csrun_common.cli import one_line_main
from launcher.version import version_option

from .analyze import analyze_command
from .shard_commands import reshard_cmd, shard_plan_cmd
from .verify import verify_command

__all__ = ["main", "AnalyzerGroup"]


class AnalyzerGroup(click.Group):
    """A click group with an optional default command for argument lists that do not
    start with a subcommand name (the analyzer's ``[OPTIONS] python run.py ...``)."""

    default_command: str | None = None

    def set_default(self, name: str) -> None:
        """Make the registered command ``name`` the default."""
        if name not in self.commands:
            raise KeyError(f"no command {name!r} registered")
        self.default_command = name

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if (self.default_command and args and args[0] not in self.commands
                and args[0] not in ("--help", "-h", "--version", "-V")):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             **extra: Any) -> None:
        """The CLI with one-line errors, exit 2 for bad input (:func:`csrun_common.cli.one_line_main`)."""
        return one_line_main(super().main, prog_name or "cs_input_analyzer", args, prog_name, **extra)


@click.group(cls=AnalyzerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("cs_input_analyzer")
def main() -> None:
    """Measure an input pipeline and plan how input workers share the data.

    \b
    cs_input_analyzer [OPTIONS] python run.py ...   probe input_fn, recommend a layout
    cs_input_analyzer verify ...       launch the recommendation, measure, compare
    cs_input_analyzer shard-plan ...   which files each input worker reads (JSON plan)
    cs_input_analyzer reshard ...      split TFRecord files into N balanced shards
    """


for _command in (shard_plan_cmd, reshard_cmd, analyze_command, verify_command):
    main.add_command(_command)
main.set_default("analyze")

if __name__ == "__main__":  # pragma: no cover
    main()
