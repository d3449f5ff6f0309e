"""launcher/slurm/foreground.py: the exit status of a foreground srun says what the user did (a signal's status)."""
import signal

import pytest

from launcher import slurm


@pytest.mark.parametrize("rc,received,expected", [
    (0, [], 0), (3, [], 3), (-9, [], 137), (-2, [], 130),
    (137, [signal.SIGINT], 130), (0, [signal.SIGINT], 130), (143, [signal.SIGTERM], 143),
    (1, [signal.SIGTERM, signal.SIGINT], 143),
])
def test_exit_status_says_what_the_user_did(rc, received, expected):
    assert slurm.exit_status(rc, received) == expected
