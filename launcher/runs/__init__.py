"""Runs you can hold after the launch (docs/RUNS.md): the run record csrun_wse and csrun_cpu
write (:mod:`.record`, :mod:`.recorder`), states defined once (:mod:`.states`), Slurm asked with
discipline (:mod:`.poll`), a run's status and logs (:mod:`.view`, :mod:`.live`, :mod:`.logs`),
the Python API (:mod:`.api`: ``launch``, ``attach``, ``Run``) and the ``csrun`` verbs
(:mod:`.cli`)."""
from .api import Run, attach, launch, runs
from .poll import wait_all
from .states import STATES

__all__ = ["Run", "attach", "launch", "runs", "wait_all", "STATES"]
