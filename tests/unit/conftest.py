"""Fixtures shared by the unit tests of several folders."""
from tests.unit.canned_slurm import cluster  # noqa: F401  (canned Slurm for the CLI tests)
