"""Issue 24, launcher side: the cheap checks before every submission (launcher.preflight.presubmit),
the warning for csrun options after the command, no-argument handling, the flags python-pt
refuses or takes, and the check's KillWait / MaxBatchRequeue report.

Slurm's answers are canned here (as in tests/unit/launcher/test_cli.py); the same behaviour runs
through the real CLIs on the test cluster in tests/integration/test_late_mistakes_cluster.py."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from csrun_common.errors import CsrunError
from launcher import cli, preflight, slurm
from launcher.builders import CpuRequest

PY = sys.executable
NODES = [slurm.NodeInfo("node1", 2, "gpu:1", "idle", "batch")] + \
    [slurm.NodeInfo(f"node{i}", 2, "", "idle", "batch") for i in range(2, 6)]
HOSTILE = "a'; echo foo"


@pytest.fixture()
def cluster(monkeypatch, tmp_path):
    """Canned Slurm (five 2-CPU nodes, node1 with gpu:1, controller up); launches and
    submissions recorded, never run; the current directory is ``tmp_path``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for var in ("CSRUN_CONFIG", "CSRUN_NO_PATH_CHECKS", "TF_CPP_MIN_LOG_LEVEL", "CSRUN_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None: ("up", "Slurmctld(primary) at vm is UP"))
    monkeypatch.setattr(slurm, "list_nodes", lambda partition="", flag="--partition": list(NODES))
    monkeypatch.setattr(slurm, "slurm_release", lambda env=None: (22, 5, 8))
    monkeypatch.setattr(slurm, "accounts", lambda env=None: None)
    monkeypatch.setattr(slurm, "qos_names", lambda env=None: None)
    monkeypatch.setattr(slurm, "reservations", lambda env=None: [])
    monkeypatch.setattr(slurm, "node_features", lambda partition="", env=None: [])
    launched: list[str] = []
    monkeypatch.setattr(slurm, "run_foreground", lambda argv, env=None, **kw: launched.append("srun") or 0)
    monkeypatch.setattr(slurm, "submit_batch", lambda script, env=None: launched.append("sbatch") or "42")
    return launched


def invoke(command, args):
    result = CliRunner().invoke(command, args, prog_name=command.name)
    return result.exit_code, result.stdout, result.stderr


def write_params(path: Path, **sections) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(sections))
    return path


def failed(checks):
    return [c for c in checks if not c.ok]


# --------------------------------------------------------------------------- the checks themselves
def test_show_keeps_a_message_on_one_line():
    assert preflight.show("/data/x.yaml") == "/data/x.yaml"
    for hostile in (HOSTILE, "new\nline", "tab\there", "a b", '"dq"'):
        shown = preflight.show(hostile)
        assert "\n" not in shown and "\t" not in shown and shown == repr(hostile)


def test_script_missing_and_present_with_a_hostile_name(tmp_path):
    (bad,) = failed(preflight.command_checks([PY, HOSTILE, "--x"], tmp_path, False))
    assert bad.name == "script" and bad.message() == \
        f"script {HOSTILE!r}: {str(tmp_path / HOSTILE)!r}: no such file"
    (tmp_path / HOSTILE).write_text("")
    assert not failed(preflight.command_checks([PY, HOSTILE, "--x"], tmp_path, False))
    assert not (tmp_path / "foo").exists()  # nothing was run through a shell


@pytest.mark.parametrize("argv,script", [
    ([PY, "run.py"], "run.py"),
    ([PY, "-u", "run.py", "--mode", "train"], "run.py"),
    ([PY, "-W", "ignore", "-X", "dev", "run.py"], "run.py"),
    ([PY, "-m", "pkg.mod", "x.py"], None),
    ([PY, "-c", "pass"], None),
    (["bash", "run.sh"], None),
])
def test_the_script_of_a_command(argv, script):
    assert preflight.script_of(argv)[0] == script


def test_program_not_on_path(tmp_path):
    (bad,) = failed(preflight.command_checks(["pyhton", "x.py"], tmp_path, False))
    assert bad.message() == "COMMAND: pyhton: not found on PATH or not executable"
    assert not preflight.command_checks(["pyhton", "x.py"], tmp_path, True)  # in a container: its PATH


@pytest.mark.parametrize("opt", [["--params", "nope.yaml"], ["--params=nope.yaml"], ["-p", "nope.yaml"]])
def test_params_missing(tmp_path, opt):
    (tmp_path / "run.py").write_text("")
    (bad,) = failed(preflight.command_checks([PY, "run.py", *opt], tmp_path, False))
    flag = "-p" if opt[0] == "-p" else "--params"
    assert bad.message() == f"{flag} nope.yaml: {tmp_path / 'nope.yaml'}: no such file"


@pytest.mark.parametrize("text,why", [
    ("train_input: [unclosed\n  x: 1\n", "not valid YAML: "),
    ("- a\n- b\n", "not a mapping of sections"),
    ("\xff\xfe", None),
])
def test_params_that_do_not_parse(tmp_path, text, why):
    (tmp_path / "run.py").write_text("")
    p = tmp_path / HOSTILE
    if why is None:
        p.write_bytes(b"\xff\xfe\x00")
        why = "not a text file"
    else:
        p.write_text(text)
    (bad,) = failed(preflight.command_checks([PY, "run.py", "--params", HOSTILE], tmp_path, False))
    assert bad.where == f"--params {HOSTILE!r}" and why in bad.detail and "\n" not in bad.message()


def test_data_paths_of_the_params(tmp_path):
    (tmp_path / "run.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-0.tfrecord").write_text("")
    write_params(tmp_path / "p.yaml", train_input={"data_dir": ["data", str(tmp_path / "data")],
                                                   "data_files": ["data/train-*.tfrecord"]},
                 eval_input={"data_dir": "gs://bucket/eval"})
    checks = preflight.command_checks([PY, "run.py", "--params", "p.yaml"], tmp_path, False)
    assert not failed(checks) and sum(c.name == "data" for c in checks) == 3
    write_params(tmp_path / "p.yaml", train_input={"data_dir": "data", "data_files": ["data/nope-*", "data/x"]},
                 eval_input={"data_dir": f"/nonexistent/{HOSTILE}"})
    bad = failed(preflight.command_checks([PY, "run.py", "--params", "p.yaml"], tmp_path, False))
    assert [c.where for c in bad] == ["train_input.data_files (--params p.yaml)",
                                      "eval_input.data_dir (--params p.yaml)"]
    assert bad[0].detail.startswith(f"data/nope-*: no such file or directory (relative: from the launch directory "
                                    f"{tmp_path}, where the job's tasks resolve it)")
    assert bad[0].detail.endswith("(and 1 more of 2)")
    assert bad[1].detail == f"{'/nonexistent/' + HOSTILE!r}: no such file or directory"
    # csrun_cpu's kind of check (data=False) leaves the data to the command
    assert not failed(preflight.command_checks([PY, "run.py", "--params", "p.yaml"], tmp_path, False, data=False))


def test_relative_data_dir_found_from_the_scripts_directory(tmp_path):
    """examples/images resolves data_dir against its own directory: not refused from elsewhere,
    but the job's tasks resolve relative paths from the launch directory: a warning says so."""
    ex = tmp_path / "examples" / "images"
    (ex / "configs").mkdir(parents=True)
    (ex / "data").mkdir()
    (ex / "run.py").write_text("")
    write_params(ex / "configs" / "params.yaml", train_input={"data_dir": "./data"})
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    run_py = str(ex / "run.py")
    checks = preflight.command_checks([PY, run_py], elsewhere, False, default_params=True)
    assert not failed(checks)
    (warned,) = [c for c in checks if c.warning]
    assert warned.warning.startswith(f"train_input.data_dir (the default params {ex / 'configs' / 'params.yaml'}): "
                                     f"./data is not found from the launch directory {elsewhere}, ")
    (elsewhere / "data").mkdir()  # found where the tasks look: no warning
    assert not any(c.warning for c in preflight.command_checks([PY, run_py], elsewhere, False, default_params=True))
    write_params(ex / "configs" / "params.yaml", train_input={"data_dir": "./dataa"})
    (bad,) = failed(preflight.command_checks([PY, run_py], elsewhere, False, default_params=True))
    assert bad.where == f"train_input.data_dir (the default params {ex / 'configs' / 'params.yaml'})"
    assert not failed(preflight.command_checks([PY, run_py], elsewhere, False))  # csrun_cpu: explicit only


def test_model_dir_parent(tmp_path):
    (tmp_path / "run.py").write_text("")
    (tmp_path / "afile").write_text("")
    checks = preflight.command_checks([PY, "run.py", "--model_dir", "out/a/b"], tmp_path, False)
    assert [c.ok for c in checks if c.name == "model_dir"] == [True]
    (bad,) = failed(preflight.command_checks([PY, "run.py", "-o", "afile/m"], tmp_path, False))
    assert bad.where == "-o afile/m" and "NOT writable" in bad.detail
    write_params(tmp_path / "p.yaml", runconfig={"model_dir": "afile/m"})
    (bad,) = failed(preflight.command_checks([PY, "run.py", "--params", "p.yaml"], tmp_path, False))
    assert bad.where == "runconfig.model_dir (--params p.yaml)"
    write_params(tmp_path / "p.yaml", runconfig={"mode": "train"})
    checks = preflight.command_checks([PY, "run.py", "--params", "p.yaml"], tmp_path, False)
    (md,) = [c for c in checks if c.name == "model_dir"]
    assert md.ok and md.where == "runconfig.model_dir (default ./model_dir)"


def test_shard_plan_files(tmp_path):
    real = tmp_path / "f0"
    real.write_text("")
    plan = {"schema": "csrun.shard_plan", "version": 1, "num_workers": 2, "mode": "shard", "balance_by": "bytes",
            "workers": [{"index": 0, "files": [str(real)], "bytes": 0, "records": None, "seed": 1},
                        {"index": 1, "files": [str(tmp_path / HOSTILE), str(tmp_path / "g")], "bytes": 0,
                         "records": None, "seed": 2}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (bad,) = preflight.shard_plan_checks("plan.json", tmp_path)
    assert not bad.ok and bad.where == "--shard-plan plan.json"
    assert bad.detail == f"worker 1's file {str(tmp_path / HOSTILE)!r}: no such file (and 1 more of 3)"
    (tmp_path / HOSTILE).write_text("")
    (tmp_path / "g").write_text("")
    assert preflight.shard_plan_checks("plan.json", tmp_path)[0].ok


def test_presubmit_raises_one_line_naming_the_path(tmp_path):
    req = CpuRequest(command=(PY, "rn.py"), python=PY, alloc_node=True, node_cpus=2, cpus_per_task=1)
    with pytest.raises(CsrunError) as exc:
        preflight.presubmit(req, tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"script rn.py: {tmp_path / 'rn.py'}: no such file (") and "--no-path-checks" in msg
    assert exc.value.exit_code == 2 and "\n" not in msg


def test_checks_are_fast_and_import_no_tensorflow(tmp_path):
    (tmp_path / "run.py").write_text("")
    (tmp_path / "data").mkdir()
    write_params(tmp_path / "p.yaml", train_input={"data_dir": "data"}, eval_input={"data_dir": "data"})
    req = CpuRequest(command=(PY, "run.py", "--params", "p.yaml"), python=PY, alloc_node=True, node_cpus=2,
                     cpus_per_task=1)
    t0 = time.perf_counter()
    preflight.presubmit(req, tmp_path)
    assert time.perf_counter() - t0 < 1.0  # ~1 ms measured; a generous bound, not a benchmark
    import subprocess

    code = "import sys, launcher.cli, launcher.preflight; print('tensorflow' in sys.modules)"
    assert subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


# --------------------------------------------------------------------------- through the CLIs
@pytest.mark.parametrize("extra", [[], ["--use-sbatch"]])
@pytest.mark.parametrize("args,expect", [
    ([PY, "run.py", "--params", "nope.yaml"], "--params nope.yaml: "),
    ([PY, "rn.py", "--mode", "train"], "script rn.py: "),
    ([PY, "run.py", "--params", "p.yaml"], "train_input.data_dir (--params p.yaml): nope: no such file"),
])
def test_csrun_wse_refuses_before_submitting(cluster, tmp_path, extra, args, expect):
    (tmp_path / "run.py").write_text("")
    write_params(tmp_path / "p.yaml", train_input={"data_dir": "nope"})
    code, out, err = invoke(cli.csrun_wse, [*extra, *args])
    assert code == 2 and out == "" and cluster == []
    assert err.count("\n") == 1 and err.startswith(f"csrun_wse: error: {expect}"), err
    code, _, err = invoke(cli.csrun_wse, ["--no-path-checks", *extra, *args])
    assert code == 0 and cluster == ["sbatch" if extra else "srun"], err


def test_csrun_cpu_refuses_before_submitting(cluster, monkeypatch, tmp_path):
    code, out, err = invoke(cli.csrun_cpu, [PY, "rn.py"])
    assert code == 2 and cluster == [] and err.startswith("csrun_cpu: error: script rn.py: ")
    (tmp_path / "prepare.py").write_text("")
    write_params(tmp_path / "p.yaml", train_input={"data_dir": "not_yet"})
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "params.yaml").write_text((tmp_path / "p.yaml").read_text())
    assert invoke(cli.csrun_cpu, [PY, "prepare.py"])[0] == 0  # may be what makes the data
    assert invoke(cli.csrun_cpu, [PY, "prepare.py", "--params", "p.yaml"])[0] == 2
    monkeypatch.setenv("CSRUN_NO_PATH_CHECKS", "1")
    assert invoke(cli.csrun_cpu, [PY, "rn.py"])[0] == 0 and cluster == ["srun", "srun"]


def test_dry_run_notes_what_a_launch_would_refuse(cluster):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", PY, "rn.py"])
    assert code == 0 and out.startswith("srun ") and cluster == []
    assert err.startswith("csrun_wse: note: script rn.py: ") and "a launch would refuse this" in err


def test_check_reports_the_same_checks(cluster, monkeypatch, tmp_path):
    monkeypatch.setattr(slurm, "test_only_srun", lambda argv, env=None: slurm.TestOnly(True, "2026-01-01T00:00:00",
                                                                                       ["ok"]))
    code, out, err = invoke(cli.csrun_wse, ["--check", PY, "run.py", "--params", "nope.yaml"])
    assert code == 2 and "FAIL  script" in out and "FAIL  params" in out
    assert err.startswith("csrun_wse: error: --check: the job cannot run: script: ")
    code, out, err = invoke(cli.csrun_wse, ["--check", "--no-path-checks", PY, "run.py"])
    assert code == 0 and "paths" in out and "not checked (--no-path-checks)" in out, err


def test_csrun_options_after_the_command_warn_once(cluster, tmp_path):
    (tmp_path / "run.py").write_text("")
    code, _, err = invoke(cli.csrun_wse, ["--dry-run", PY, "run.py", "--mode", "train", "--total-nodes", "4",
                                          "--total-nodes=2", "--no-requeue", "--help", "-h", "-V", "--version"])
    assert code == 0
    (line,) = err.splitlines()
    assert line.startswith("csrun_wse: warning: --total-nodes, --no-requeue after the command ")
    assert "options go before the command" in line
    code, _, err = invoke(cli.csrun_wse, ["--dry-run", PY, "run.py", "--mode", "train", HOSTILE, "-n"])
    assert code == 0 and err == ""
    code, _, err = invoke(cli.csrun_cpu, ["--dry-run", PY, "run.py", "--alloc-node"])
    assert code == 0 and err.startswith("csrun_cpu: warning: --alloc-node after the command")


@pytest.mark.parametrize("command", [cli.csrun_wse, cli.csrun_cpu])
def test_no_arguments_points_to_help(cluster, command):
    for args in ([], ["--dry-run"]):
        code, out, err = invoke(command, args)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "Missing argument 'COMMAND...'" in err and f"see '{command.name} --help'" in err


def test_python_pt_refuses_a_flag_listed_as_not_wired(cluster, monkeypatch, tmp_path):
    """docs/PYTORCH.md "Not yet for PyTorch": with ``python-pt`` a flag of
    ``cli.NOT_WIRED_FOR_PYTORCH`` is refused up front (one line naming it, exit 2, nothing
    submitted, Slurm not asked: a dry run needs no slurmctld); ``python-ws`` and a plain
    ``python run.py`` are launched (the latter's runtime warns). The table is empty now
    (every flag is wired): one is listed here to hold the refusal to its word."""
    flag = "--autoscale"
    monkeypatch.setattr(cli, "NOT_WIRED_FOR_PYTORCH", {"autoscale": flag})
    (tmp_path / "run.py").write_text("")
    args = ["--no-path-checks", "--total-nodes", "4", "--tasks-per-node", "1", flag]
    for first in ("python-ws", PY):
        code, out, err = invoke(cli.csrun_wse, ["--dry-run", *args, first, "run.py", "--mode", "train"])
        assert code == 0 and " srun " in f" {out}", err
    monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None: ("down", "slurm_load_ctl_conf error"))
    monkeypatch.setattr(slurm, "list_nodes", lambda *a, **k: pytest.fail("Slurm asked"))
    for extra in ([], ["--dry-run"], ["--use-sbatch"]):
        code, out, err = invoke(cli.csrun_wse, [*extra, *args, "python-pt", "run.py", "--mode", "train"])
        assert code == 2 and out == "" and cluster == []
        assert err == (f'csrun_wse: error: {flag} with python-pt: not wired for PyTorch yet '
                       f'(docs/PYTORCH.md "Not yet for PyTorch")\n')


def test_python_pt_takes_autoscale(cluster, tmp_path):
    """--autoscale is wired for PyTorch (docs/AUTOSCALE.md): the dry run's tasks get the setting."""
    (tmp_path / "run.py").write_text("")
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--no-path-checks", "--total-nodes", "4", "--tasks-per-node",
                                            "1", "--autoscale", "--initial-workers", "1", "python-pt", "run.py",
                                            "--mode", "train"])
    assert code == 0 and "CSRUN_AUTOSCALE=1:1:3:rate:10" in out and "not wired" not in err, err


def test_python_pt_takes_chief_input_cpus(cluster, tmp_path):
    (tmp_path / "run.py").write_text("")
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--no-path-checks", "--total-nodes", "2", "--tasks-per-node",
                                            "1", "--cpus-per-task", "2", "--chief-input-cpus", "1", "python-pt",
                                            "run.py", "--mode", "train"])
    assert code == 0 and "CSRUN_CHIEF_INPUT_CPUS" in out, err


def test_python_pt_takes_survive_node_loss(cluster, tmp_path):
    """docs/RESILIENCE.md "A lost node": with python-pt the flag gives the two jobs (the chief's
    and the input workers' own, ``--no-kill``) as with python-ws."""
    (tmp_path / "run.py").write_text("")
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--no-path-checks", "--total-nodes", "3", "--tasks-per-node",
                                            "1", "--survive-node-loss", "python-pt", "run.py", "--mode", "train"])
    assert code == 0 and "not wired" not in err, err
    assert out.count("srun ") == 2 and "--no-kill" in out and "CSRUN_WORKER_JOB=1" in out, out


def test_check_reports_killwait_and_a_lower_maxbatchrequeue(monkeypatch):
    from launcher import preflight
    from launcher.builders import WseRequest
    from launcher.layout import plan_layout
    from launcher.requeue import RequeueSpec

    req = WseRequest(layout=plan_layout(2, 2, 1, 0, False, "gpu:1", 2), command=("python", "x.py"), python="python",
                     requeue=RequeueSpec("USR2", 90, 5))
    monkeypatch.setattr(slurm, "config_values", lambda keys, env=None: {"KillWait": "30 sec", "MaxBatchRequeue": "2"})
    check = preflight.requeue_check(req)
    assert check is not None and check.ok
    assert "KillWait 30 sec" in check.detail and "MaxBatchRequeue is 2, below --max-requeues 5" in check.detail
    monkeypatch.setattr(slurm, "config_values", lambda keys, env=None: {"KillWait": "5 sec"})  # Slurm 22.05
    assert "MaxBatchRequeue" not in preflight.requeue_check(req).detail
    assert preflight.requeue_check(WseRequest(layout=req.layout, command=req.command, python="python")) is None
