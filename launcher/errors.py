"""Errors that csrun reports to the user as one line with exit status 2."""
from __future__ import annotations


class CsrunError(Exception):
    """Bad input or an unusable environment, reported as one line, exit status 2.

    The message names the flag or configuration key and the offending value, e.g.
    ``--total-nodes 0: must be a positive integer``. Nothing has been submitted
    when this is raised.
    """

    exit_code = 2


class ConfigError(CsrunError):
    """A site configuration file is malformed (names the file, key and valid keys)."""


class SlurmUnavailable(CsrunError):
    """slurmctld cannot be reached (sinfo/scontrol failed)."""
