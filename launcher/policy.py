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
from csrun_common.flagspec import FlagSpec
from csrun_common.layout import LAYOUT_FLAGS

from .sitekeys import key, keys_of

__all__ = ["SitePolicy", "POLICY_KEYS", "POLICY_FLAGS", "parse_time", "format_seconds", "check_slurm_arg",
           "MANAGED_OPTIONS", "constraint_features"]

#: The time formats of sbatch(1) ``--time``: "Acceptable time formats include "minutes",
#: "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes" and
#: "days-hours:minutes:seconds"." ("INFINITE"/"UNLIMITED": no limit.)
TIME_FORMATS = ('minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, '
                'days-hours:minutes:seconds, or UNLIMITED')

_TIME_RE = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")

#: Options csrun writes itself, with the csrun flag (or key) to use instead; a
#: ``--slurm-arg`` naming one of them is refused (two values of one option on one
#: component: the last would silently win). The layout's and the site policy's come from
#: their flags' ``slurm_options`` (:data:`LAYOUT_FLAGS`, :data:`POLICY_KEYS`, filled in below
#: :class:`SitePolicy`).
MANAGED_OPTIONS: dict[str, str] = {
    **{option: spec.flag for spec in LAYOUT_FLAGS for option in spec.slurm_options},
    "--gres": "gres.resource",
    "--exclusive": "the layout (every component is exclusive)", "--exclude": "gres.node",
    "-x": "gres.node", "--job-name": "csrun (it names its jobs)", "-J": "csrun (it names its jobs)",
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
    """The site options of one launch, each ``""`` when not given (Slurm's default), and the
    ``[slurm]`` section of the site config: each field declares its key and the flag that wins
    over it (:func:`launcher.sitekeys.key`).

    Attributes:
        partition, account, qos, reservation, constraint: sbatch(1) ``--partition``,
            ``--account``, ``--qos``, ``--reservation``, ``--constraint``.
        time: the time limit as given (Slurm's format); ``time_seconds`` its length in
            seconds (``None``: no limit given, or ``UNLIMITED``).
        extra_args: verbatim options (``slurm.extra_args`` then every ``--slurm-arg``).
    """

    partition: str = key("slurm", "partition", "", "partition of every job",
                         FlagSpec("partition", "--partition", str, None, "Slurm partition",
                                  slurm_options=("--partition", "-p")), "{key}")
    account: str = key("slurm", "account", "", "account of every job",
                       FlagSpec("account", "--account", str, None, "Slurm account",
                                slurm_options=("--account", "-A")), "{key}")
    qos: str = key("slurm", "qos", "", "QOS of every job",
                   FlagSpec("qos", "--qos", str, None, "Quality of service", slurm_options=("--qos", "-q")), "{key}")
    reservation: str = key("slurm", "reservation", "", "reservation of every job",
                           FlagSpec("reservation", "--reservation", str, None, "Reservation(s) to run in",
                                    slurm_options=("--reservation",)), "{key}")
    constraint: str = key("slurm", "constraint", "", "node features every job requires",
                          FlagSpec("constraint", "--constraint", str, None, "Node features required (e.g. "
                                   "'skylake&ib')", slurm_options=("--constraint", "-C")), "{key}")
    time: str = key("slurm", "time", "", "time limit in Slurm's format (sbatch(1) --time)",
                    FlagSpec("time", "--time", str, None, "Time limit in Slurm's format: minutes, minutes:seconds, "
                             "hours:minutes:seconds, days-hours[:minutes[:seconds]]", metavar="TIME",
                             slurm_options=("--time", "-t")), "{key}, else the partition's")
    extra_args: tuple[str, ...] = key("slurm", "extra_args", (), "verbatim options for every het component",
                                      FlagSpec("slurm_args", "--slurm-arg", str, (), "An option passed verbatim to "
                                               "every het component, e.g. --slurm-arg=--mem=0 (repeatable; added "
                                               "to {key}).", metavar="ARG", multiple=True))

    @property
    def time_seconds(self) -> int | None:
        """Seconds of :attr:`time`; ``None`` without a limit."""
        return parse_time(self.time) if self.time else None

    def validate(self, sources: dict[str, str] | None = None) -> SitePolicy:
        """Check every value without asking Slurm; returns ``self``. ``sources`` names where
        each field came from (a flag, or a config key; default: the flag) for the messages.

        Raises :class:`CsrunError` for a bad time format, a name with spaces or
        separators, or a bad verbatim option.
        """
        src = {**POLICY_FLAGS, **(sources or {})}
        if self.time:
            parse_time(self.time, src["time"])
        for name in ("partition", "account", "qos", "reservation"):
            _check_name(getattr(self, name), src[name], several=name == "reservation")
        if self.constraint and ("\n" in self.constraint or " " in self.constraint.strip()):
            raise CsrunError(f"{src['constraint']} {self.constraint!r}: "
                             "a constraint has no spaces (join features with & or |)")
        for arg in self.extra_args:
            check_slurm_arg(arg, src["extra_args"])
        return self

    def options(self) -> list[str]:
        """The sbatch/srun options of this policy, in a fixed order (job-level options first,
        then the verbatim ones)."""
        opts = []
        for k in POLICY_KEYS:
            value = k.value(self)
            if value and k.type is str and k.spec:
                opts.append(f"{k.spec.slurm_options[0]}={value}")
        return opts + list(self.extra_args)


#: The ``[slurm]`` keys (:class:`SitePolicy`'s fields), each with its flag.
POLICY_KEYS = tuple(keys_of(SitePolicy))
#: :class:`SitePolicy` field -> the text of the flag that sets it (``--qos``).
POLICY_FLAGS = {k.attr: k.flag for k in POLICY_KEYS}
MANAGED_OPTIONS.update({option: k.flag for k in POLICY_KEYS if k.spec for option in k.spec.slurm_options})


def merge_extra_args(config_args: Sequence[str], flag_args: Sequence[str]) -> tuple[str, ...]:
    """``slurm.extra_args`` then every ``--slurm-arg``, a duplicate kept once at its first place."""
    return tuple(dict.fromkeys([*config_args, *flag_args]))
