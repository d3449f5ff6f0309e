"""Streaming efficiency of the PyTorch path (issue 25's bench): the samples/s a PyTorch chief
receives from ``k`` input workers over csrun's data plane vs the same DataLoaders iterated
in-process, side by side with the TensorFlow figures of :mod:`bench_streaming` (which calls
:func:`measure` for its ``digits_pt`` rows, so one run holds both).

*Delivered*: the chief process does what the PyTorch chief's training input does
(:class:`csrun_runtime.pytorch.remote.RemoteSource`: one zmq receiver published as
``endpoints.json`` in the rendezvous directory; batches handed one at a time, first come,
first served, as numpy nests) and counts samples over a fixed window after a warm-up; each
input worker is the example's own ``run.py`` started with the environment an srun task of
``csrun_wse python-pt`` gets (``CSRUN_ROLE=worker``, ``SLURM_PROCID=i``, one CPU), so it runs
:class:`csrun_runtime.pytorch.worker.InputWorker` unchanged: the DataLoader as streamer ``i``
of ``k``, bundles over the data plane.

*Standalone*: the same ``k`` DataLoaders (the same params, streamer facts and seeds as
streamer ``i`` of ``k``; :func:`csrun_runtime.pytorch.contract.process_params`), iterated
in-process concurrently over a common window (a file barrier): their summed samples/s.

No TensorFlow in any of these processes. The processes are this script:
``python bench/streaming_pt.py --chief|--standalone SPEC`` (workers are run.py itself).
"""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it

from csrun_common import atomic
from csrun_common.env import ADVERTISE_HOST, TaskEnv
from csrun_common.jobsecret import job_secret

REPO = common.REPO
CPUS_PER_WORKER = 1


def _argv(spec: dict) -> list[str]:
    return [*spec["argv"], "--mode", "train", "--model_dir", spec["model_dir"]]


def _task_env(role: str, spec: dict, index: int) -> dict[str, str]:
    """The variables an srun task of ``csrun_wse python-pt`` with ``k`` input workers gets."""
    k = spec["num_workers"]
    env = dict(TaskEnv(role, 0 if role == "chief" else 1, 0, 0, k, k + 1, spec["cpus"],
                       execution_mode="pytorch").encode())
    env.update({"SLURM_PROCID": str(index), "SLURM_JOB_ID": spec["job_id"], "SLURM_STEP_ID": "0",
                ADVERTISE_HOST: "localhost"})
    return env


def _samples(nest: Any) -> int:
    from csrun_runtime.pytorch.contract import batch_size_of

    return batch_size_of(nest) or 0


def child_chief(spec: dict) -> None:
    """The chief's training input: a :class:`RemoteSource`, its batches counted over the
    window after the warm-up; then ``done.json`` so that the workers leave. Writes
    ``{"samples_per_sec", "samples", "window_s", "batches_per_worker", "registered_s"}``."""
    from csrun_common.roles import resolve_role
    from csrun_runtime import rendezvous
    from csrun_runtime.params import resolve_params
    from csrun_runtime.pytorch.remote import RemoteSource

    role = resolve_role(_task_env("chief", spec, 0))
    rc = resolve_params(_argv(spec), run_py=spec["run_py"]).params["runconfig"]
    rdv = rendezvous.Rendezvous(spec["model_dir"], role.rendezvous_key or "")
    rdv.reset()
    hb = rendezvous.Heartbeat(rdv, "chief").start()
    # the workers stand for other nodes' (TCP), though they run on this host: no shared-memory ring
    source = RemoteSource(rdv, role, {**rc, "dataplane_shm_bytes": 0, **spec.get("rc", {}),
                                      "worker_start_timeout_secs": spec["start_timeout_s"], "input_timeout_secs": 60})
    res: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        source.next()
        res["first_batch_s"] = time.monotonic() - t0
        t_end = time.monotonic() + spec["warmup_s"]
        while time.monotonic() < t_end:
            source.next()
        samples = 0
        t1 = time.monotonic()
        while time.monotonic() - t1 < spec["measure_s"]:
            samples += _samples(source.next()[0])
        dt = time.monotonic() - t1
        res.update({"samples_per_sec": samples / dt, "samples": samples, "window_s": dt,
                    "batches_per_worker": source.describe()["batches_per_worker"]})
        rdv.mark_done("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the harness
        res["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        rdv.mark_done("failed", res["error"])
    source.close()
    hb.stop()
    atomic.write_json(Path(spec["out"]), res, indent=None)


def child_standalone(spec: dict) -> None:
    """Streamer ``index`` of ``num_workers``'s DataLoader iterated in-process: warm-up, barrier
    with the other ``barrier`` processes, a ``measure_s`` window, then on until all have
    measured. Writes ``{"samples_per_sec", "samples", "window_s"}``."""
    from csrun_runtime.params import resolve_params
    from csrun_runtime.pytorch.contract import epochs
    from csrun_runtime.pytorch.worker import build_loader

    i, k = spec["index"], spec["num_workers"]
    sys.argv = [spec["run_py"], *_argv(spec)]
    module = runpy.run_path(spec["run_py"], run_name="csrun_bench")  # a Model Zoo run.py guards run()
    resolved = resolve_params(_argv(spec), run_py=spec["run_py"])
    loader, _params, _seed = build_loader(module["train_data_fn"], resolved.params, i, k, i)  # the input worker's
    it = epochs(loader)
    common.concurrent_window(lambda: _samples(next(it)), spec, Path(spec["out"]))


def _child_main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[1]).read_text())
    code = 0
    try:
        {"--chief": child_chief, "--standalone": child_standalone}[argv[0]](spec)
    except BaseException as exc:  # noqa: BLE001
        atomic.write_json(Path(spec["out"]), {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}, indent=None)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # DataLoader worker processes and zmq threads cannot hold the exit


# --------------------------------------------------------------------------- harness
def _popen(procs: list[subprocess.Popen], wd: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
    with open(wd / f"{name}.log", "ab") as log:
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                                      stdin=subprocess.DEVNULL, start_new_session=True))


def _env() -> dict[str, str]:
    job_secret()  # this harness' own secret, in os.environ: the chief and its workers share it
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def _child(procs: list[subprocess.Popen], wd: Path, name: str, role: str, spec: dict) -> Path:
    path = wd / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    _popen(procs, wd, name, [sys.executable, str(Path(__file__).resolve()), role, str(path)], _env())
    return Path(spec["out"])


def _stop(procs: list[subprocess.Popen], timeout: float) -> None:
    from launcher.slurm import stop_process_group

    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            stop_process_group(p, grace=3.0)


def _read(path: Path, wd: Path, name: str) -> dict:
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        res = {"error": f"no result in {path.name}"}
    if "samples_per_sec" not in res:
        try:
            tail = " | ".join((wd / f"{name}.log").read_text(errors="replace").splitlines()[-3:])[:400]
        except OSError:
            tail = ""
        raise RuntimeError(f"{name}: {res.get('error')} {tail}")
    return res


def measure(kind: str, pipeline: str, k: int, warmup_s: float, measure_s: float, workdir: Path,
            tag: str, timeout_s: float = 180.0, rc: dict | None = None) -> float:
    """Samples/s of ``pipeline`` (a PyTorch run.py in :data:`common.PIPELINES`) with ``k``
    input workers of :data:`CPUS_PER_WORKER` CPU each: ``kind`` ``"dataplane"`` the rate the
    chief receives, ``"standalone"`` the summed in-process rate of the same DataLoaders run
    concurrently. ``rc``: runconfig keys the chief's source gets over the YAML's (e.g.
    ``input_read_ahead_batches``). Raises ``RuntimeError`` naming the process that failed, with
    its log's tail."""
    run_py, argv = common.PIPELINES[pipeline]
    wd = workdir / tag
    wd.mkdir(parents=True)
    spec = {"run_py": str(run_py), "argv": argv, "model_dir": str(wd / "model_dir"), "num_workers": k,
            "cpus": CPUS_PER_WORKER, "warmup_s": warmup_s, "measure_s": measure_s, "workdir": str(wd),
            "job_id": f"benchpt{os.getpid()}{tag}", "start_timeout_s": timeout_s * 0.6, "tag": "sa", "barrier": k,
            "rc": dict(rc or {})}
    procs: list[subprocess.Popen] = []
    try:
        if kind == "standalone":
            outs = [_child(procs, wd, f"sa{i}", "--standalone", {**spec, "index": i, "out": str(wd / f"sa{i}.json")})
                    for i in range(k)]
            _stop(procs, timeout_s)
            return sum(float(_read(o, wd, f"sa{i}")["samples_per_sec"]) for i, o in enumerate(outs))
        out = _child(procs, wd, "chief", "--chief", {**spec, "out": str(wd / "chief.json")})
        for i in range(k):
            _popen(procs, wd, f"worker{i}", [sys.executable, str(run_py), *_argv(spec)],
                   {**_env(), **_task_env("worker", spec, i)})
        t_end = time.monotonic() + timeout_s
        while procs[0].poll() is None and time.monotonic() < t_end:
            time.sleep(0.2)
        _stop(procs, 15)  # the workers leave on done.json
        return float(_read(out, wd, "chief")["samples_per_sec"])
    finally:
        _stop(procs, 0)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--chief", "--standalone"):
        _child_main(sys.argv[1:])
    print("the figures come from bench_streaming.py (python bench/run.py --only streaming)", file=sys.stderr)
    sys.exit(2)
