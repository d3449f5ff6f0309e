"""The one-line exit shared by the three CLIs (``csrun_wse``, ``csrun_cpu``,
``cs_input_analyzer``): usage errors and :class:`csrun_common.errors.CsrunError` print
``<prog>: error: <message>`` on one line and exit with their status, never a traceback."""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from .exits import INTERRUPTED, USAGE

__all__ = ["one_line_main", "OneLineErrors"]


def one_line_main(super_main: Callable[..., Any], prog: str, args: Sequence[str] | None = None,
                  prog_name: str | None = None, **extra: Any) -> None:
    """Run a click ``main`` so that usage errors, :class:`click.ClickException` and csrun's
    one-line errors (:class:`CsrunError`, or anything else with an ``exit_code``) print
    ``<prog>: error: <message>`` on one line and exit with their status (2 for bad input),
    never a traceback. Shared by ``csrun_wse``, ``csrun_cpu`` and ``cs_input_analyzer``."""
    try:
        rv = super_main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(INTERRUPTED)
    except click.UsageError as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(USAGE)
    except click.ClickException as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - CsrunError and friends: one line
        code = getattr(exc, "exit_code", None)
        if code is None:
            raise
        click.echo(f"{prog}: error: {exc}", err=True)
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)


class OneLineErrors(click.Command):
    """A click command whose usage errors and :class:`CsrunError` print one line, exit 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             **extra: Any) -> None:  # noqa: D102
        return one_line_main(super().main, prog_name or self.name or "csrun", args, prog_name, **extra)
