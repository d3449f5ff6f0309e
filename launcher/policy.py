"""Site policies of a launch: time limit, account, QOS, reservation, constraint and verbatim
extra Slurm options, as pure data and pure checks (no Slurm call here).

Each value comes from a flag of ``csrun_wse`` / ``csrun_cpu`` (``--time``, ``--account``,
``--qos``, ``--reservation``, ``--constraint``, ``--slurm-arg``) or else from the site
configuration (``[slurm] time, account, qos, reservation, constraint, extra_args``); a flag
wins over the file, and ``--slurm-arg`` adds to ``slurm.extra_args``. Every one is written
into *every* het component (srun(1), sbatch(1): options given to one component apply to
that component only, so csrun spells each out, as it does the task shape).

Checks here are the ones that need no Slurm: the time format of sbatch(1) ``--time``, and
the shape of a verbatim option. Whether an account, QOS, reservation or feature exists is
asked of Slurm by :mod:`launcher.slurm` (see :func:`launcher.cli` and
:mod:`launcher.preflight`).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from csrun_common.errors import CsrunError
from csrun_common.layout import LAYOUT_FLAGS

__all__ = ["SitePolicy", "parse_time", "format_seconds", "check_slurm_arg", "MANAGED_OPTIONS",
           "constraint_features"]

#: The time formats of sbatch(1) ``--time``: "Acceptable time formats include "minutes",
#: "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes" and
#: "days-hours:minutes:seconds"." ("INFINITE"/"UNLIMITED": no limit.)
TIME_FORMATS = ('minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, '
                'days-hours:minutes:seconds, or UNLIMITED')

_TIME_RE = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")

#: Options csrun writes itself, with the csrun flag (or key) to use instead; a
#: ``--slurm-arg`` naming one of them is refused (two values of one option on one
#: component: the last would silently win).
MANAGED_OPTIONS: dict[str, str] = {
    **{option: spec.flag for spec in LAYOUT_FLAGS for option in spec.slurm_options},
    "--gres": "gres.resource",
    "--exclusive": "the layout (every component is exclusive)", "--exclude": "gres.node",
    "-x": "gres.node", "--job-name": "csrun (it names its jobs)", "-J": "csrun (it names its jobs)",
    "--partition": "--partition", "-p": "--partition", "--account": "--account", "-A": "--account",
    "--qos": "--qos", "-q": "--qos", "--time": "--time", "-t": "--time",
    "--reservation": "--reservation", "--constraint": "--constraint", "-C": "--constraint",
    "--export": "csrun (the role contract travels in --export)", "--het-group": "the layout",
    "--output": "csrun (the batch output file)",
    "-o": "csrun (the batch output file)", "--requeue": "--requeue", "--no-requeue": "--requeue",
    "--signal": "--requeue-signal", "--open-mode": "--requeue", "--test-only": "--check",
}


def parse_time(value: str, flag: str = "--time") -> int | None:
    """Seconds of a Slurm time limit (sbatch(1) ``--time``); ``None`` for ``UNLIMITED`` /
    ``INFINITE``.

    ``"90"`` → 5400 (minutes), ``"5:30"`` → 330 (minutes:seconds), ``"1:00:00"`` → 3600,
    ``"2-12"`` → 216000 (days-hours), ``"1-0:30"`` → 88200, ``"1-0:0:10"`` → 86410.

    Raises :class:`CsrunError` naming ``flag`` and the value when it is none of
    :data:`TIME_FORMATS`, or zero.
    """
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME_RE.match(text)
    if not m:
        raise CsrunError(f"{flag} {value!r}: not a Slurm time ({TIME_FORMATS})")
    days, a, b, c = (int(g) if g is not None else None for g in m.group("days", "a", "b", "c"))
    assert a is not None  # the pattern requires it
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:   # hours:minutes:seconds
        seconds = a * 3600 + (b or 0) * 60 + c
    elif b is not None:   # minutes:seconds
        seconds = a * 60 + b
    else:                 # minutes
        seconds = a * 60
    if seconds <= 0:
        raise CsrunError(f"{flag} {value!r}: a time limit must be longer than 0")
    return seconds


def format_seconds(seconds: int) -> str:
    """``3725`` → ``"1:02:05"`` (the hours:minutes:seconds form of sbatch(1) ``--time``)."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def check_slurm_arg(arg: str, flag: str = "--slurm-arg") -> str:
    """Check one verbatim Slurm option (``--mem=0``, ``--gpus-per-node=4``) and return it.

    It must be one word starting with ``-`` (an option, not a command), without a newline
    (an ``#SBATCH`` line ends at one) and must not set what csrun writes itself
    (:data:`MANAGED_OPTIONS`; the error names the csrun flag to use instead).
    Raises :class:`CsrunError` naming ``flag`` and the value.
    """
    if not arg.startswith("-") or arg in ("-", "--"):
        raise CsrunError(f"{flag} {arg!r}: not a Slurm option (it must start with '-', e.g. --slurm-arg=--mem=0)")
    if "\n" in arg or "\r" in arg:
        raise CsrunError(f"{flag} {arg!r}: contains a newline")
    name = arg.split("=", 1)[0]
    if not name.startswith("--") and len(name) > 2:  # -N3: short option with its value attached
        name = name[:2]
    if name in MANAGED_OPTIONS:
        raise CsrunError(f"{flag} {arg!r}: csrun sets {name} itself; use {MANAGED_OPTIONS[name]}")
    return arg


_SIMPLE_VALUE = re.compile(r"^[^\s,:=]+$")
_NAME_LIST = re.compile(r"^[^\s,:=]+(,[^\s,:=]+)*$")


def _check_name(value: str, flag: str, several: bool = False) -> str:
    """A partition, account or QOS name (a reservation may list several, comma-separated:
    sbatch(1) ``--reservation=<reservation_names>``). Raises :class:`CsrunError`."""
    if value and not (_NAME_LIST if several else _SIMPLE_VALUE).match(value):
        seps = "':' or '='" if several else "',', ':' or '='"
        raise CsrunError(f"{flag} {value!r}: not a Slurm name (no spaces, {seps})")
    return value


def constraint_features(expression: str) -> list[str]:
    """Feature names in a Slurm ``--constraint`` expression (sbatch(1) ``--constraint``:
    names joined by ``&`` (AND), ``|`` (OR), ``,``, with ``[...]`` and ``(...)`` groups and
    ``*count`` multipliers): ``"[rack1|rack2]&gpu*2"`` → ``["rack1", "rack2", "gpu"]``."""
    names = []
    for token in re.split(r"[&|,\[\]()]", expression):
        name = token.split("*", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class SitePolicy:
    """The site options of one launch, each ``""`` when not given (Slurm's default).

    Attributes:
        partition, account, qos, reservation, constraint: sbatch(1) ``--partition``,
            ``--account``, ``--qos``, ``--reservation``, ``--constraint``.
        time: the time limit as given (Slurm's format); ``time_seconds`` its length in
            seconds (``None``: no limit given, or ``UNLIMITED``).
        extra_args: verbatim options (``slurm.extra_args`` then every ``--slurm-arg``).
    """

    partition: str = ""
    account: str = ""
    qos: str = ""
    reservation: str = ""
    constraint: str = ""
    time: str = ""
    extra_args: tuple[str, ...] = ()

    @property
    def time_seconds(self) -> int | None:
        """Seconds of :attr:`time`; ``None`` without a limit."""
        return parse_time(self.time) if self.time else None

    def validate(self, sources: dict[str, str] | None = None) -> SitePolicy:
        """Check every value without asking Slurm; returns ``self``. ``sources`` names where
        each field came from (a flag, or a config key) for the messages.

        Raises :class:`CsrunError` for a bad time format, a name with spaces or
        separators, or a bad verbatim option.
        """
        src = sources or {}
        if self.time:
            parse_time(self.time, src.get("time", "--time"))
        for name in ("partition", "account", "qos", "reservation"):
            _check_name(getattr(self, name), src.get(name, f"--{name}"), several=name == "reservation")
        if self.constraint and ("\n" in self.constraint or " " in self.constraint.strip()):
            raise CsrunError(f"{src.get('constraint', '--constraint')} {self.constraint!r}: "
                             "a constraint has no spaces (join features with & or |)")
        for arg in self.extra_args:
            check_slurm_arg(arg, src.get("extra_args", "--slurm-arg"))
        return self

    def options(self) -> list[str]:
        """The sbatch/srun options of this policy, in a fixed order (job-level options first,
        then the verbatim ones)."""
        opts = []
        for name in ("partition", "account", "qos", "reservation", "constraint", "time"):
            value = getattr(self, name)
            if value:
                opts.append(f"--{name}={value}")
        return opts + list(self.extra_args)


def merge_extra_args(config_args: Sequence[str], flag_args: Sequence[str]) -> tuple[str, ...]:
    """``slurm.extra_args`` followed by every ``--slurm-arg`` (duplicates kept once, first
    place)."""
    return tuple(dict.fromkeys([*config_args, *flag_args]))
