"""The node agent of a probe session: the one process the analyzer starts on the probe node.

:func:`agent` starts ``M`` probe worker processes (``python -m analyzer.probe_worker
SPEC.json``, :mod:`analyzer.probe_worker`) on this node, each with its index in
``CSRUN_PROBE_INDEX`` and its log in ``<workdir>/logs/worker_<i>.log``, waits for them, and
kills them all when it is signalled, so that no worker outlives the session.

On a cluster it is the Python function that :class:`analyzer.probe_session.ProbeSession`
submits through submitit (:func:`launcher.slurm.submit_function`: one task holding the
node's CPUs, exclusive); ``scancel`` (submitit's ``Job.cancel``) signals it. With
``--local`` it runs as ``python -m analyzer.probe_agent M SPEC.json`` and is stopped with
:func:`launcher.slurm.stop_process_group`.

Standard library only: the agent imports no TensorFlow (the workers do).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from csrun_common import exits
from csrun_common.env import PROBE_INDEX, PROBE_PARENT
from csrun_common.jobsecret import with_new_secret

__all__ = ["agent"]


def agent(spec_path: str, workers: int) -> int:
    """Run the ``workers`` probe workers of the session described by ``spec_path`` (the
    session's ``spec.json``: ``workdir``, ``deadline`` in seconds since the epoch, the user's
    command) until they leave (an ``exit`` command, their deadline) or this process is
    signalled (SIGTERM: ``scancel``; SIGINT): then they are killed and it exits (status 143).
    Workers still running 10 s past the deadline are killed too.

    Returns 0, or 1 when a worker failed.
    """
    spec = json.loads(Path(spec_path).read_text())
    logs = Path(spec["workdir"]) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []

    def stop(signum: int | None = None, _frame: FrameType | None = None) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        os._exit(exits.TERMINATED if signum else exits.OK)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    shared = with_new_secret(os.environ)  # one session's processes: a chief apart and its senders share it
    for i in range(workers):
        env = {**shared, PROBE_INDEX: str(i), PROBE_PARENT: str(os.getpid())}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with open(logs / f"worker_{i}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "analyzer.probe_worker", spec_path],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
    deadline = float(spec.get("deadline", time.time() + 3600))
    while any(p.poll() is None for p in procs):
        if time.time() > deadline + 10:
            stop()
        time.sleep(0.2)
    return 1 if any(p.returncode for p in procs) else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m analyzer.probe_agent M SPEC.json", file=sys.stderr)
        sys.exit(exits.USAGE)
    code = agent(sys.argv[2], int(sys.argv[1]))
    sys.stdout.flush()
    os._exit(code)
