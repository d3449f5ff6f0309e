"""csrun_common/flagspec.py: a flag declared once becomes its click option — a switch or an on/off
pair, choices, a minimum click enforces in one usage line, the help's ``[default: ...]`` note and
final period — and the options of several specs keep their order."""
from __future__ import annotations

import click
from click.testing import CliRunner

from csrun_common.flagspec import FlagSpec, by_name, click_options

SPECS = (
    FlagSpec("nodes", "--total-nodes", int, 1, "Nodes of the job", min=1, metavar="N"),
    FlagSpec("requeue", "--requeue", bool, False, "Requeue on preemption", off_flag="--no-requeue"),
    FlagSpec("verbose", "--verbose", bool, False, "Say more"),
    FlagSpec("engine", "--engine", str, "native", "The cluster", choices=("native", "podman")),
    FlagSpec("slurm_arg", "--slurm-arg", str, (), "Slurm's own option", multiple=True),
)


def command() -> click.Command:
    @click.command()
    @click_options(SPECS, notes={"nodes": "the site's"}, aliases={"verbose": ("-v",)})
    def cmd(**kw):
        click.echo(repr(sorted(kw.items())))

    return cmd


def test_the_options_parse_their_values():
    out = CliRunner().invoke(command(), ["--total-nodes", "3", "--no-requeue", "-v", "--engine", "podman",
                                         "--slurm-arg=--mem=0", "--slurm-arg=--exclusive"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == repr([("engine", "podman"), ("nodes", 3), ("requeue", False),
                                       ("slurm_arg", ("--mem=0", "--exclusive")), ("verbose", True)])
    defaults = CliRunner().invoke(command(), [])
    assert "('nodes', 1)" in defaults.output and "('engine', 'native')" in defaults.output


def test_click_refuses_below_the_minimum_and_outside_the_choices():
    for args, flag in ((["--total-nodes", "0"], "--total-nodes"), (["--engine", "docker"], "--engine")):
        out = CliRunner().invoke(command(), args)
        assert out.exit_code == 2 and f"Invalid value for '{flag}'" in out.output


def test_help_in_declared_order_with_the_note_and_a_period():
    text = CliRunner().invoke(command(), ["--help"]).output
    assert "Nodes of the job [default: the site's]." in " ".join(text.split())
    order = [text.index(f) for f in ("--total-nodes", "--requeue / --no-requeue", "-v, --verbose", "--engine",
                                     "--slurm-arg")]
    assert order == sorted(order)
    assert SPECS[2].help_text() == "Say more." and FlagSpec("x", "--x", str, None, "Done.").help_text() == "Done."


def test_by_name_picks_in_the_asked_order_with_changes():
    picked = by_name(SPECS, "engine", "nodes", default=None)
    assert [s.name for s in picked] == ["engine", "nodes"] and all(s.default is None for s in picked)
    assert by_name(SPECS, "verbose") == (SPECS[2],)
