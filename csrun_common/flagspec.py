"""A command-line flag declared once: :class:`FlagSpec`, and the click options built from it.

Each flag of ``csrun_wse``, ``csrun_cpu``, ``cs_input_analyzer verify`` and ``shard-plan`` is
one :class:`FlagSpec` (its parameter name, its flag text, type, default, help): the layout
flags in :data:`csrun_common.layout.LAYOUT_FLAGS`, a flag that wins over a site-config key on
that key's field (:class:`launcher.config.SiteConfig`, :class:`launcher.policy.SitePolicy`),
the launcher's others in :mod:`launcher.flags`. :func:`click_options` builds the click options of a CLI from them, so
a flag is never written per CLI; the typed values the commands work on
(:class:`launcher.flags.WseFlags`, :class:`csrun_common.layout.LayoutSpec`) are checked
against the same tuples (``tests/unit/launcher/test_flags.py``). The shape follows torchx's
``runopts`` (declared once, read by the CLI, the docs and the dry run).

Pure Python at import (click is imported when the options are built), so the task runtime
may import the declarations.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

__all__ = ["FlagSpec", "click_options", "by_name"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class FlagSpec:
    """One flag, declared once.

    Attributes:
        name: the parameter's name (the click parameter, the typed field it fills).
        flag: the flag text, e.g. ``"--partition"``.
        type: ``int``, ``float``, ``str`` or ``bool`` (a switch: ``is_flag``, or an on/off
            pair with ``off_flag``).
        default: the value when the flag is not given (``None``: not given).
        help: the help text (a sentence without its final period when ``note`` may follow).
        min: the lowest value of an ``int``/``float``; click refuses a lower one when
            ``click_range`` (its one-line usage error), else the owner's check does.
        click_range: whether click enforces ``min`` (``click.IntRange``/``FloatRange``).
        metavar: click's metavar.
        off_flag: the off switch of an on/off pair (``"--no-requeue"``).
        show_default: whether ``--help`` shows the default.
        choices: the accepted values of a ``str`` (``click.Choice``).
        multiple: repeatable (the value is a tuple).
        slurm_options: Slurm's own options this flag decides (``--slurm-arg`` may not set
            them: :data:`launcher.policy.MANAGED_OPTIONS`).
        options: any other click keyword arguments (``envvar``, ``shell_complete``, ``type``).
    """

    name: str
    flag: str
    type: type
    default: Any
    help: str
    min: float | None = None
    click_range: bool = True
    metavar: str | None = None
    off_flag: str | None = None
    show_default: bool = False
    choices: tuple[str, ...] = ()
    multiple: bool = False
    slurm_options: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def help_text(self, note: str | None = None) -> str:
        """The help with its ``[default: note]`` (when given) and a final period."""
        text = f"{self.help} [default: {note}]" if note else self.help
        return text if text.endswith(".") else text + "."

    def click_option(self, note: str | None = None, aliases: tuple[str, ...] = (), **over: Any) -> Any:
        """The ``click.option`` decorator of this flag. ``note``: the ``[default: ...]`` this CLI
        adds to the help; ``aliases``: more names for the flag (after it); ``over``: click keyword
        arguments this CLI sets otherwise (``default``, ``help``, ``show_default``)."""
        import click

        kw: dict[str, Any] = {"default": self.default, "help": self.help_text(note),
                              "show_default": self.show_default}
        if self.metavar:
            kw["metavar"] = self.metavar
        if self.multiple:
            kw["multiple"] = True
        decls = [self.flag, *aliases]
        if self.type is bool and self.off_flag:
            decls = [f"{self.flag}/{self.off_flag}"]
        elif self.type is bool:
            kw["is_flag"] = True
        elif self.choices:
            kw["type"] = click.Choice(list(self.choices))
        elif self.min is not None and self.click_range:
            kw["type"] = click.IntRange(min=int(self.min)) if self.type is int else click.FloatRange(min=self.min)
        else:
            kw["type"] = self.type
        kw.update(self.options)
        kw.update(over)
        if not kw["show_default"]:
            del kw["show_default"]
        return click.option(*decls, self.name, **kw)


def click_options(specs: Iterable[FlagSpec], notes: Mapping[str, str] | None = None,
                  aliases: Mapping[str, tuple[str, ...]] | None = None,
                  over: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """A decorator adding the click options of ``specs`` to a command, in their order (as
    ``--help`` lists them). ``notes``, ``aliases`` and ``over`` are per flag name, as
    :meth:`FlagSpec.click_option` takes them."""
    built = [s.click_option((notes or {}).get(s.name), (aliases or {}).get(s.name, ()),
                            **(over or {}).get(s.name, {})) for s in specs]

    def decorate(fn: F) -> F:
        for option in reversed(built):
            fn = option(fn)
        return fn

    return decorate


def by_name(specs: Iterable[FlagSpec], *names: str, **changes: Any) -> tuple[FlagSpec, ...]:
    """The specs named ``names``, in that order, each with ``changes`` (e.g. ``default=None``).
    Raises ``KeyError`` for a name not declared."""
    table = {s.name: s for s in specs}
    return tuple(replace(table[n], **changes) if changes else table[n] for n in names)
