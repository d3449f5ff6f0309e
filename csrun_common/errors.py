"""The one error family csrun reports to the user: one line, exit status 2 (or 1).

Every CLI (``csrun_wse``, ``csrun_cpu``, ``cs_input_analyzer``) prints a
:class:`CsrunError` as ``<prog>: error: <message>`` with no traceback
(:func:`csrun_common.cli.one_line_main`).
"""
from __future__ import annotations

from .exits import USAGE


class CsrunError(Exception):
    """Bad input or an unusable environment, reported as one line.

    The message names the flag or configuration key and the offending value, e.g.
    ``--qos 'a b': not a Slurm name``. ``exit_code`` is 2 (bad input:
    nothing has been submitted) unless the raiser says otherwise (1: a run that failed).
    """

    exit_code = USAGE

    def __init__(self, message: str, exit_code: int = USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(CsrunError):
    """A site configuration file is malformed (names the file, key and valid keys)."""


class SlurmUnavailable(CsrunError):
    """slurmctld cannot be reached (sinfo/scontrol failed or timed out)."""
