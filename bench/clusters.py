"""The Slurm test clusters as the benchmarks use them: the environment that reaches the main
one (:func:`slurm_env`), a second cluster of nodes pinned to their own host CPUs
(:func:`pinned_cluster`), and the queue a timed launch should start on empty
(:func:`wait_queue_empty`; the queue read through ``launcher/slurm.py``).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import common  # bench/ is on sys.path: these modules run as scripts from it; puts the repository there

from csrun_common.errors import CsrunError
from launcher import slurm


def slurm_env() -> dict:
    """This process's environment with ``SLURM_CONF`` pointing at the test cluster (unless
    already set) and the interpreter's bin directory first on ``PATH``."""
    env = dict(os.environ)
    conf = common.CLUSTER / "run" / "etc" / "slurm.conf"
    if not env.get("SLURM_CONF") and conf.exists():
        env["SLURM_CONF"] = str(conf)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@contextlib.contextmanager
def pinned_cluster(directory: Path, port: int = 16917, nodes: int = 2):
    """A second Slurm test cluster of ``nodes`` nodes each pinned to its own host CPUs
    (``slurm-test-cluster/cluster up --nodes N --pin``) in ``directory`` and on ``port``,
    beside the main one; stopped on exit. Yields ``(env, topology)``: the environment for
    its Slurm commands (``SLURM_CONF`` set) and its ``etc/topology`` (:func:`common.read_topology`).
    Raises ``RuntimeError`` when it cannot start (e.g. fewer host CPUs than nodes)."""
    env = slurm_env()
    # Always the native daemons (taskset pinning), whatever cluster $CSRUN_TEST_ENGINE names.
    env.update(CSRUN_CLUSTER_DIR=str(directory), CSRUN_CLUSTER_PORT=str(port), CSRUN_TEST_ENGINE="native")
    env["SLURM_CONF"] = str(Path(directory) / "etc" / "slurm.conf")
    script = str(common.CLUSTER / "cluster")
    p = subprocess.run([script, "up", "--nodes", str(nodes), "--pin"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"pinned cluster: {(p.stderr or p.stdout).strip()[-300:]}")
    try:
        yield env, common.read_topology(Path(directory) / "etc" / "topology")
    finally:
        subprocess.run([script, "down"], capture_output=True, text=True, env=env)


def others_jobs(env: Mapping[str, str] | None = None) -> int:
    """Jobs in the Slurm queue right now (any user, pending or running;
    :func:`launcher.slurm.queued_jobs`); -1 if unknown. Used to note when a timed launch may
    have waited behind someone else's job."""
    try:
        return slurm.queued_jobs(env)
    except CsrunError:
        return -1


def wait_queue_empty(env: Mapping[str, str] | None = None, max_wait: float = 30.0) -> float:
    """Wait (at most ``max_wait`` seconds) until the Slurm queue is empty; returns the
    seconds waited. Timed launches start on an idle cluster when others allow it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_wait:
        if others_jobs(env) <= 0:
            break
        time.sleep(1.0)
    return time.monotonic() - t0
