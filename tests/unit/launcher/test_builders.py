"""srun argv and sbatch text builders: golden files, quoting, containers."""
import shlex

import pytest

from csrun_common.errors import CsrunError
from launcher.builders import CpuRequest, WseRequest, expand_python_word, protect_argv
from launcher.container import Container, split_mount_dirs
from launcher.layout import plan_layout
from launcher.policy import SitePolicy

from .golden import assert_golden

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


def test_containers_wrap_the_command():
    sing = Container("singularity", "/img/tf.sif", ("/data", "/scratch"))
    assert sing.wrap(["python", "x.py"]) == ["singularity", "exec", "-B", "/data,/scratch", "/img/tf.sif", "python",
                                             "x.py"]
    assert Container("apptainer", "/i.sif").wrap(["a"]) == ["apptainer", "exec", "/i.sif", "a"]
    pyx = Container("pyxis", "nvcr.io#tf", ("/data",))
    assert pyx.wrap(["a"]) == ["a"]
    assert pyx.srun_options() == ["--container-image=nvcr.io#tf", "--container-mounts=/data:/data"]
    req = CpuRequest(command=("python", "x.py"), python=PY, node_cpus=2, container=pyx, exclude_node="node1")
    assert "--container-image=nvcr.io#tf" in req.materialize_srun()


def test_container_errors():
    with pytest.raises(CsrunError, match="container.image is empty"):
        Container("singularity", "").validate()
    with pytest.raises(CsrunError, match="--mount-dirs 'a,b:c'"):
        split_mount_dirs("a,b:c")
    assert split_mount_dirs("/a,,/b") == ("/a", "/b")


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
