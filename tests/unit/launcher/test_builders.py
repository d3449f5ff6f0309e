"""srun argv and sbatch text builders (launcher/builders.py): golden files, quoting, site policies in
every het component, --requeue in the sbatch script and on srun, the tasks' quiet logging, the
one-component batch job and the option that depends on the Slurm version (golden files in
tests/golden/; CSRUN_UPDATE_GOLDEN=1 rewrites)."""
import shlex

import pytest

from launcher.builders import CpuRequest, WseRequest, expand_python_word, protect_argv, srun_needs_cpus_per_task
from launcher.layout import plan_layout
from launcher.policy import SitePolicy
from launcher.requeue import RequeueSpec
from tests.unit.golden import assert_golden

PY = "/opt/venv/bin/python"
HOSTILE = ("a b", "it's", '"dq"', "$(touch pwned)", "x; rm -rf /", "new\nline", "ünïcödé ✓", "--leading-dash", "-n",
           "*")


def wse(n=4, s=1, t=2, c=1, cyclic=False, command=("run.py",), **kw):
    cmd, mode = expand_python_word(("python-ws",) + tuple(command), PY)
    lay = plan_layout(n, t, c, s, cyclic, "gpu:1", node_cpus=2)
    return WseRequest(layout=lay, command=tuple(cmd), python=PY, execution_mode=mode, exclude_node="node1", **kw)


def test_python_ws_expands_to_the_interpreter_with_the_mode():
    assert expand_python_word(["python-ws", "run.py", "--mode", "train"], PY) == \
        ([PY, "run.py", "--mode", "train"], "weight_streaming")
    assert expand_python_word(["python-pt", "run.py"], PY) == ([PY, "run.py"], "pytorch")
    assert expand_python_word(["python", "run.py"], PY) == (["python", "run.py"], None)


@pytest.mark.parametrize("name,kw", [
    ("wse_1node", dict(n=1, s=0, t=2, c=1)),
    ("wse_3nodes_cyclic", dict(n=3, s=0, t=2, c=1, cyclic=True)),
    ("wse_4nodes_1single", dict(n=4, s=1, t=2, c=1)),
    ("wse_5nodes_2single", dict(n=5, s=2, t=2, c=None)),
])
def test_srun_line_golden(name, kw):
    assert_golden(f"{name}.srun.txt", wse(**kw).srun_line() + "\n")


@pytest.mark.parametrize("name,kw", [
    ("wse_4nodes_1single", dict(n=4, s=1, t=2, c=1)),
    ("wse_3nodes_cyclic_plan", dict(n=3, s=0, t=2, c=1, cyclic=True, shard_plan="/plans/it's a plan.json")),
])
def test_sbatch_script_golden(name, kw):
    assert_golden(f"{name}.sbatch", wse(**kw).materialize_sbatch())


def test_every_component_spells_out_its_options():
    argv = wse(n=5, s=2, t=2, c=1).materialize_srun()
    comps = " ".join(argv).split(" : ")
    assert len(comps) == 3
    for comp in comps:
        for opt in ("--job-name=", "--nodes=", "--ntasks=", "--ntasks-per-node=", "--cpus-per-task=", "--exclusive",
                    "--distribution=", "--kill-on-bad-exit=1", "--export=ALL,CSRUN_ROLE="):
            assert opt in comp, (opt, comp)
        assert "--unbuffered" not in comp  # with --label, srun would label each write as a line
    assert argv[:3] == ["srun", "--label", "--verbose"]  # read by launcher.tasklog
    assert "--gres=gpu:1" in comps[0] and "--gres" not in comps[1] + comps[2]
    assert "--exclude=node1" not in comps[0] and all("--exclude=node1" in c for c in comps[1:])


def test_hostile_argv_round_trips_through_the_srun_line():
    req = wse(command=("run.py",) + HOSTILE)
    argv = shlex.split(req.srun_line())
    assert argv == req.materialize_srun()
    tail = argv[len(argv) - len(HOSTILE):]
    assert tail == list(HOSTILE)


def test_hostile_argv_round_trips_through_the_sbatch_script():
    script = wse(command=("run.py",) + HOSTILE).materialize_sbatch()
    srun = script[script.index("{ srun"):script.index("  csrun_srun_rc=$?")].replace("\\\n", " ")
    words = shlex.split(srun)
    groups, cur = [], []
    for w in words[2:]:
        if w == ":":
            groups.append(cur)
            cur = []
        else:
            cur.append(w)
    groups.append(cur)
    assert len(groups) == 2
    for g in groups:
        assert g[-len(HOSTILE):] == list(HOSTILE)


def test_lone_colon_goes_through_the_argv_shim():
    cmd = protect_argv(["prog", "a", ":", "b"], PY)
    assert cmd[:3] == [PY, "-m", "launcher.argv_exec"] and ":" not in cmd
    assert protect_argv(["prog", "a:b"], PY) == ["prog", "a:b"]


def test_cpu_request_alloc_node_and_not():
    full = CpuRequest(command=("bash",), python=PY, alloc_node=True, node_cpus=8, exclude_node="node1")
    assert full.materialize_srun() == ["srun", "--job-name=csrun_cpu", "--nodes=1", "--ntasks=1", "--cpus-per-task=8",
                                       "--exclusive", "--exclude=node1", "--kill-on-bad-exit=1", "--unbuffered", "bash"]
    part = CpuRequest(command=("bash",), python=PY, alloc_node=False, node_cpus=8, cpus_per_task=2, pty=True)
    assert part.materialize_srun() == ["srun", "--job-name=csrun_cpu", "--nodes=1", "--ntasks=1", "--cpus-per-task=2",
                                       "--kill-on-bad-exit=1", "--pty", "bash"]


def test_cpu_sbatch_golden():
    req = CpuRequest(command=("python", "run.py", "--mode", "validate_only", "it's"), python=PY, node_cpus=2,
                     exclude_node="node1", policy=SitePolicy(partition="batch", account="ml"))
    assert_golden("cpu_validate.sbatch", req.materialize_sbatch())

POLICY = SitePolicy(partition="batch", account="ml", qos="debug", reservation="maint", constraint="skylake&ib",
                    time="4:00:00", extra_args=("--mem=0", "--comment=it's mine"))

QUIET = (("TF_CPP_MIN_LOG_LEVEL", "1"),)


def wse_train(n=4, s=1, t=2, c=1, **kw):
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
    req = wse_train(policy=POLICY, task_env=QUIET)
    assert_golden("wse_4nodes_policies.srun.txt", req.srun_line() + "\n")
    comps = components(req.materialize_srun())
    assert len(comps) == 2
    for comp in comps:
        for opt in POLICY.options():
            assert opt in comp, (opt, comp)
        assert any(w.startswith("--export=") and w.endswith(",TF_CPP_MIN_LOG_LEVEL=1") for w in comp)
    assert shlex.split(req.srun_line()) == req.materialize_srun()


def test_requeue_sbatch_script():
    req = wse_train(policy=SitePolicy(time="1:00:00"), requeue=RequeueSpec("USR2", 90, 3), task_env=QUIET)
    script = req.materialize_sbatch()
    assert_golden("wse_4nodes_requeue.sbatch", script)
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert directives.count("#SBATCH --signal=USR2@90") == 2 and directives.count("#SBATCH --requeue") == 2
    assert directives.count("#SBATCH --time=1:00:00") == 2
    assert "#SBATCH --open-mode=append" in directives
    assert "exec srun" not in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert "CSRUN_STOP_SIGNALS=USR2:TERM" in script


def test_requeue_on_the_srun_path_signals_the_allocation():
    req = wse_train(requeue=RequeueSpec("USR1", 120, 2))
    assert_golden("wse_4nodes_requeue.srun.txt", req.srun_line() + "\n")
    for comp in components(req.materialize_srun()):
        assert "--signal=USR1@120" in comp and "--requeue" not in comp


def test_one_component_batch_job_has_no_het_group():
    script = wse_train(n=1, s=0).materialize_sbatch()
    assert_golden("wse_1node.sbatch", script)
    assert "hetjob" not in script and "--het-group" not in script


@pytest.mark.parametrize("version,repeats", [((21, 8), False), ((22, 5), True), ((24, 11), True), (None, True)])
def test_cpus_per_task_on_the_batch_step_depends_on_the_slurm_version(version, repeats):
    assert srun_needs_cpus_per_task(version) is repeats
    script = wse_train(slurm_version=version).materialize_sbatch()
    step = script[script.index("{ srun"):]
    assert ("--cpus-per-task=" in step) is repeats
    assert all(f"#SBATCH --cpus-per-task={c}" in script for c in (2, 1))  # the allocation always has it


def test_slurm_2108_batch_script_golden():
    assert_golden("wse_4nodes_slurm2108.sbatch", wse_train(slurm_version=(21, 8)).materialize_sbatch())


def test_cpu_request_with_policies_and_quiet_tasks():
    req = CpuRequest(command=("python", "run.py", "--mode", "validate_only"), python=PY, node_cpus=2,
                     exclude_node="node1", policy=POLICY, task_env=QUIET)
    assert_golden("cpu_policies.sbatch", req.materialize_sbatch())
    argv = req.materialize_srun()
    assert "--export=ALL,TF_CPP_MIN_LOG_LEVEL=1" in argv and "--qos=debug" in argv and "--mem=0" in argv
    assert CpuRequest(command=("bash",), python=PY).step_options() == ["--kill-on-bad-exit=1", "--unbuffered"]
