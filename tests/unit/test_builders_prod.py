"""Builders of issue 11: site policies in every het component, --requeue in the sbatch script
and on srun, the tasks' quiet logging, the one-component batch job, and the option that
depends on the Slurm version (golden files in tests/golden/; CSRUN_UPDATE_GOLDEN=1 rewrites)."""
import shlex

import pytest

from launcher.builders import CpuRequest, WseRequest, expand_python_word, srun_needs_cpus_per_task
from launcher.layout import plan_layout
from launcher.policy import SitePolicy
from launcher.requeue import RequeueSpec

from .golden import assert_golden

PY = "/opt/venv/bin/python"
POLICY = SitePolicy(partition="batch", account="ml", qos="debug", reservation="maint", constraint="skylake&ib",
                    time="4:00:00", extra_args=("--mem=0", "--comment=it's mine"))
QUIET = (("TF_CPP_MIN_LOG_LEVEL", "1"),)


def wse(n=4, s=1, t=2, c=1, **kw):
    cmd, mode = expand_python_word(("python-ws", "run.py", "--mode", "train"), PY)
    return WseRequest(layout=plan_layout(n, t, c, s, False, "gpu:1", node_cpus=2), command=tuple(cmd), python=PY,
                      execution_mode=mode, exclude_node="node1", **kw)


def components(argv):
    comps, cur = [], []
    for w in argv[1:]:
        if w == ":":
            comps.append(cur)
            cur = []
        else:
            cur.append(w)
    return comps + [cur]


def test_site_policies_reach_every_component_of_the_srun_line():
    req = wse(policy=POLICY, task_env=QUIET)
    assert_golden("wse_4nodes_policies.srun.txt", req.srun_line() + "\n")
    comps = components(req.materialize_srun())
    assert len(comps) == 2
    for comp in comps:
        for opt in POLICY.options():
            assert opt in comp, (opt, comp)
        assert any(w.startswith("--export=") and w.endswith(",TF_CPP_MIN_LOG_LEVEL=1") for w in comp)
    assert shlex.split(req.srun_line()) == req.materialize_srun()


def test_requeue_sbatch_script():
    req = wse(policy=SitePolicy(time="1:00:00"), requeue=RequeueSpec("USR2", 90, 3), task_env=QUIET)
    script = req.materialize_sbatch()
    assert_golden("wse_4nodes_requeue.sbatch", script)
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert directives.count("#SBATCH --signal=USR2@90") == 2 and directives.count("#SBATCH --requeue") == 2
    assert directives.count("#SBATCH --time=1:00:00") == 2
    assert "#SBATCH --open-mode=append" in directives
    assert "exec srun" not in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert "CSRUN_STOP_SIGNALS=USR2:TERM" in script


def test_requeue_on_the_srun_path_signals_the_allocation():
    req = wse(requeue=RequeueSpec("USR1", 120, 2))
    assert_golden("wse_4nodes_requeue.srun.txt", req.srun_line() + "\n")
    for comp in components(req.materialize_srun()):
        assert "--signal=USR1@120" in comp and "--requeue" not in comp


def test_one_component_batch_job_has_no_het_group():
    script = wse(n=1, s=0).materialize_sbatch()
    assert_golden("wse_1node.sbatch", script)
    assert "hetjob" not in script and "--het-group" not in script


@pytest.mark.parametrize("version,repeats", [((21, 8), False), ((22, 5), True), ((24, 11), True), (None, True)])
def test_cpus_per_task_on_the_batch_step_depends_on_the_slurm_version(version, repeats):
    assert srun_needs_cpus_per_task(version) is repeats
    script = wse(slurm_version=version).materialize_sbatch()
    step = script[script.index("{ srun"):]
    assert ("--cpus-per-task=" in step) is repeats
    assert all(f"#SBATCH --cpus-per-task={c}" in script for c in (2, 1))  # the allocation always has it


def test_slurm_2108_batch_script_golden():
    assert_golden("wse_4nodes_slurm2108.sbatch", wse(slurm_version=(21, 8)).materialize_sbatch())


def test_cpu_request_with_policies_and_quiet_tasks():
    req = CpuRequest(command=("python", "run.py", "--mode", "validate_only"), python=PY, node_cpus=2,
                     exclude_node="node1", policy=POLICY, task_env=QUIET)
    assert_golden("cpu_policies.sbatch", req.materialize_sbatch())
    argv = req.materialize_srun()
    assert "--export=ALL,TF_CPP_MIN_LOG_LEVEL=1" in argv and "--qos=debug" in argv and "--mem=0" in argv
    assert CpuRequest(command=("bash",), python=PY).step_options() == ["--kill-on-bad-exit=1", "--unbuffered"]
