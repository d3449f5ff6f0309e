"""``--version`` of the three CLIs (``csrun_wse``, ``csrun_cpu``, ``cs_input_analyzer``): csrun's
own version and the Slurm client's (``sinfo --version``, which needs no controller), the
release that decides csrun's version-dependent options (:mod:`launcher.builders`:
:func:`~launcher.builders.srun_needs_cpus_per_task`).
"""
from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

import click

from . import slurm

__all__ = ["csrun_version", "version_text", "version_option", "TESTED_SLURM"]

F = TypeVar("F", bound=Callable[..., Any])

#: Slurm releases csrun was tested on (docs/SLURM.md "Versions").
TESTED_SLURM = ("22.05",)


def csrun_version() -> str:
    """The installed csrun distribution's version (``pyproject.toml``), ``"unknown"`` when
    csrun runs from a tree that is not installed."""
    try:
        return metadata.version("csrun")
    except metadata.PackageNotFoundError:
        return "unknown"


def version_text(prog: str) -> str:
    """Two lines: ``<prog> (csrun) <version>`` and the Slurm client's release with whether
    csrun was tested on it."""
    rel = slurm.slurm_release()
    if rel is None:
        slurm_line = "Slurm client: not found (sinfo --version did not answer)"
    else:
        major_minor = f"{rel[0]}.{rel[1]:02d}"
        tested = "tested" if major_minor in TESTED_SLURM else f"not tested; tested: {', '.join(TESTED_SLURM)}"
        slurm_line = f"Slurm client: {rel[0]}.{rel[1]:02d}.{rel[2]} ({tested})"
    return f"{prog} (csrun) {csrun_version()}\n{slurm_line}"


def version_option(prog: str) -> Callable[[F], F]:
    """A click ``--version`` flag that prints :func:`version_text` and exits 0 (eager: it
    is handled before any other option or argument is checked)."""

    def callback(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if not value or ctx.resilient_parsing:
            return
        click.echo(version_text(prog))
        ctx.exit(0)

    return click.option("--version", "-V", is_flag=True, expose_value=False, is_eager=True, callback=callback,
                        help="Print csrun's version and the Slurm client's, then exit.")
