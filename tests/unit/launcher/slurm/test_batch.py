"""launcher/slurm/batch.py on canned sbatch output: the job id, a refusal in one line."""
from __future__ import annotations

import pytest

from csrun_common.errors import CsrunError
from launcher import slurm


# --------------------------------------------------------------------------- sbatch
def test_submit_batch_returns_the_job_id(canned):
    c = canned(sbatch=[(0, "4242;cluster\n", "")])
    assert slurm.submit_batch("#!/bin/bash\ntrue\n") == "4242"
    argv, kwargs = c.calls[0]
    assert argv == ["/usr/bin/sbatch", "--parsable"] and kwargs["input"] == "#!/bin/bash\ntrue\n"


def test_submit_batch_refused_is_one_line(canned):
    canned(sbatch=[(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n")])
    with pytest.raises(CsrunError) as e:
        slurm.submit_batch("#!/bin/bash\ntrue\n")
    assert str(e.value) == ("sbatch refused the job: sbatch: error: Batch job submission failed: Invalid partition "
                            "name specified")
