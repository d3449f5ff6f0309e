"""Shared pytest fixtures.

``slurm_cluster`` starts the real Slurm test cluster (``slurm-test-cluster/cluster up``,
idempotent: a running cluster is reused) once per session and exports ``SLURM_CONF`` so
that csrun and the Slurm client commands in the tests talk to it. Which cluster: the native
daemons (default) or the compose cluster run with podman or Docker, chosen by
``pytest --cluster-engine native|podman|docker`` or ``$CSRUN_TEST_ENGINE``; the tests run
unchanged on either (csrun and Slurm's commands run on the host in both).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from csrun_common.env import BATCH_CHECK_SECS

# No one-batch check before queueing (launcher/batchcheck.py, issue 33 item 9) in the suite's
# hundreds of csrun_wse launches, in-process (CliRunner) or not: each would load TensorFlow or
# torch on this host first. The tests of the check set CSRUN_BATCH_CHECK_SECS in their own env.
os.environ[BATCH_CHECK_SECS] = "0"
# Every launch records its run (launcher/runs, docs/RUNS.md) under $XDG_STATE_HOME/csrun: the
# suite's go to a directory of its own, never the real home's.
_STATE_HOME = tempfile.mkdtemp(prefix="csrun-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "slurm-test-cluster" / "cluster"
BIN = Path(sys.executable).parent


ENGINES = ("native", "podman", "docker")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cluster-engine", choices=ENGINES, default=None,
                     help="the Slurm test cluster of the integration tests: native daemons, or the compose "
                          "cluster run with podman or docker (default: $CSRUN_TEST_ENGINE, else native)")


def pytest_configure(config: pytest.Config) -> None:
    engine = config.getoption("--cluster-engine")
    if engine:
        os.environ["CSRUN_TEST_ENGINE"] = engine


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with os._exit when tests kept tf.data service servers in this process
    (helpers.KEPT): their destructors at interpreter exit can deadlock a py_function
    pipeline. The report is printed and every other plugin has finished by now."""
    helpers = sys.modules.get("tests.fixtures.runtime.helpers")
    if helpers is not None and getattr(helpers, "KEPT", None):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash.get(_EXIT_STATUS, 3))  # 3: pytest's "internal error"


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.fixture(scope="session", autouse=True)
def _example_data_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The examples' data the tests ask for (helpers.prepare_digits, helpers.images_params) is
    written once a session, into pytest's temporary directory (helpers.DATA_CACHE), and copied."""
    helpers = sys.modules.get("tests.fixtures.runtime.helpers")
    if helpers is not None:
        helpers.DATA_CACHE = tmp_path_factory.getbasetemp() / "example_data_once"


def pytest_report_header(config: pytest.Config) -> str:
    return f"slurm test cluster: {cluster_engine()}"


def cluster_engine() -> str:
    """The engine of the test cluster the session uses: ``native``, ``podman`` or ``docker``."""
    return os.environ.get("CSRUN_TEST_ENGINE") or "native"


def _cluster_conf() -> Path:
    out = subprocess.run([str(CLUSTER), "env"], capture_output=True, text=True, check=True).stdout
    # "export SLURM_CONF=/path" (the path is shell-quoted with printf %q; ours has no specials)
    return Path(out.strip().split("=", 1)[1])


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """Start (or reuse) the test cluster; returns ``{"conf": Path, "env": dict, "accounting": bool,
    "engine": str}``.

    Skips the test when the Slurm daemons are not installed (run scripts/setup.sh); fails it
    when the cluster does not come up (on the compose cluster: no engine, a broken one, ...).
    """
    if not (shutil.which("slurmctld") or Path("/usr/sbin/slurmctld").exists()):
        pytest.skip("Slurm is not installed here: run scripts/setup.sh")
    proc = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cluster up failed:\n{proc.stdout}\n{proc.stderr}")
    conf = _cluster_conf()
    os.environ["SLURM_CONF"] = str(conf)
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # no one-batch check before queueing (launcher/batchcheck.py) in the hundreds of launches of the
    # suite: the tests of the check set CSRUN_BATCH_CHECK_SECS themselves
    env[BATCH_CHECK_SECS] = "0"
    return {"conf": conf, "env": env, "accounting": _has_accounting(conf), "engine": cluster_engine()}


def _has_accounting(conf: Path) -> bool:
    """Whether the cluster runs slurmdbd (``ACCOUNTING=1`` in its ``etc/topology``; a cluster
    started with ``--no-accounting`` has ``ACCOUNTING=0``)."""
    try:
        return "ACCOUNTING=1" in (conf.parent / "topology").read_text().split()
    except OSError:
        return False


@pytest.fixture(scope="session")
def accounting_cluster(slurm_cluster) -> dict:
    """The test cluster, for tests that need job accounting (``sacct``, ``sacctmgr``, enforced
    accounts and QOS); skips the test when the cluster runs without it."""
    if not slurm_cluster["accounting"]:
        pytest.skip("the test cluster runs without accounting (cluster up --no-accounting)")
    return slurm_cluster


@pytest.fixture(scope="session")
def compose_cluster(slurm_cluster) -> dict:
    """The test cluster when it is the compose cluster (containers with their own hostnames
    and IPs); skips the test on the native cluster, whose nodes all are 127.0.0.1."""
    if slurm_cluster["engine"] == "native":
        pytest.skip("needs the compose cluster (pytest --cluster-engine podman|docker)")
    return slurm_cluster


def in_node(node: str, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """``argv`` run inside the compose cluster's container ``node`` (``cluster exec --node``)."""
    return subprocess.run([str(CLUSTER), "exec", "--node", node, *argv], env=env, capture_output=True, text=True,
                          timeout=60)


#: Longest wait (s) of :func:`cli_env` for the last test's nodes to finish completing.
SETTLE_S = 20.0


def settle(env: dict, max_wait: float = SETTLE_S) -> None:
    """Wait (at most ``max_wait`` s) until no node of the cluster is completing a job. slurmctld
    22.05's backfill, starting a het job while a component's nodes were still completing the last
    test's job, deallocated it ("hetjob start failure"), started it again with its GRES count lost
    ("_step_get_gres_cnt ... node offset invalid") and then left the GRES node's gpu allocated to
    no job: every later job asking for the GPU pended for ever. Slurm's bug, seen twice under the
    suite's back-to-back launches; a user's jobs seldom follow each other within a second."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        states = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%T"], env=env, capture_output=True,
                                text=True, timeout=30).stdout
        if "completing" not in states:
            return
        time.sleep(0.25)


@pytest.fixture()
def cli_env(slurm_cluster) -> dict:
    """Environment for running csrun CLIs as subprocesses against the test cluster, once no node is
    completing a job (:func:`settle`)."""
    env = dict(slurm_cluster["env"])
    settle(env)
    return env


#: slurmctld port of the pinned cluster (its slurmd ports follow); the main cluster's is 16817.
PINNED_PORT = os.environ.get("CSRUN_PINNED_PORT", "16917")


@pytest.fixture(scope="session")
def pinned_cluster(tmp_path_factory) -> Iterator[dict]:
    """A second test cluster of 2 nodes, each pinned to its own host CPUs
    (``cluster up --nodes 2 --pin``: node1 the chief's GRES node, node2 a CPU node), in its
    own directory and port beside the main one; stopped at the end of the session. Started
    by the benchmarks' :func:`clusters.pinned_cluster` (bench/clusters.py), the one place that
    knows how. Returns ``{"conf": Path, "env": dict}`` (``SLURM_CONF`` set in ``env`` only)."""
    if not (shutil.which("slurmctld") or Path("/usr/sbin/slurmctld").exists()):
        pytest.skip("Slurm is not installed here: run scripts/setup.sh")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("pinning 2 nodes needs 2 host CPUs")
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    import clusters as bench_clusters

    with contextlib.ExitStack() as stack:
        try:
            env, _topology = stack.enter_context(
                bench_clusters.pinned_cluster(tmp_path_factory.mktemp("pinned_cluster"), int(PINNED_PORT)))
        except RuntimeError as exc:
            pytest.fail(f"pinned cluster up failed: {exc}")
        yield {"conf": Path(env["SLURM_CONF"]), "env": env}
