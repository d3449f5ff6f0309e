"""launcher.cli: the job's secret (issue 45, docs/SECURITY.md) that csrun_wse makes for every
launch: in the environment srun or sbatch gets, the same across the srun path's relaunches,
never in argv, the batch script or the Launching line (Slurm's answers canned, as in
tests/unit/test_cli_prod.py)."""
import re

from csrun_common.env import JOB_SECRET
from launcher import cli, slurm
from launcher.requeue import REQUEUE_EXIT
from tests.unit.test_cli_prod import cluster, invoke  # noqa: F401 - the fixture

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def test_each_srun_launch_gets_a_fresh_secret_in_its_environment_only(cluster):  # noqa: F811
    cluster.setenv(JOB_SECRET.name, "ab" * 32)  # an inherited one is replaced
    launches = []
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: launches.append((argv, env)) or 0)
    for _ in range(2):
        code, out, err = invoke(cli.csrun_wse, ["--total-nodes", "3", "python", "x.py"])
        assert code == 0, err
    secrets = [env[JOB_SECRET.name] for _, env in launches]
    assert all(HEX64.match(s) for s in secrets) and len(set(secrets)) == 2 and "ab" * 32 not in secrets
    for (argv, _), s in zip(launches, secrets, strict=True):
        assert not any(s in a for a in argv) and JOB_SECRET.name not in " ".join(argv)
    assert "Launching: srun " in err and secrets[1] not in err + out and JOB_SECRET.name not in err


def test_the_srun_paths_relaunches_keep_the_runs_secret(cluster):  # noqa: F811
    results, seen = iter([REQUEUE_EXIT, 0]), []
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: seen.append(env[JOB_SECRET.name])
                    or next(results))
    assert invoke(cli.csrun_wse, ["--requeue", "python", "x.py"])[0] == 0
    assert len(seen) == 2 and seen[0] == seen[1]


def test_sbatch_gets_the_secret_in_its_environment_not_in_the_script(cluster):  # noqa: F811
    submitted = []
    cluster.setattr(slurm, "submit_batch", lambda script, env=None: submitted.append((script, env)) or "42")
    code, out, err = invoke(cli.csrun_wse, ["--use-sbatch", "--requeue", "--total-nodes", "3", "python", "x.py"])
    assert code == 0 and out.strip() == "42", err
    ((script, env),) = submitted
    assert HEX64.match(env[JOB_SECRET.name]) and env[JOB_SECRET.name] not in script
    assert JOB_SECRET.name not in script  # Slurm keeps the submitting environment for every requeue
    code, out, _ = invoke(cli.csrun_wse, ["--use-sbatch", "--dry-run", "python", "x.py"])
    assert code == 0 and JOB_SECRET.name not in out
