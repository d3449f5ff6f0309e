"""Benchmark 6: streaming efficiency from ``k`` input workers to the chief, through tf.data
service and through csrun's data plane (``runconfig.transport: service | dataplane``), side by
side in the same run; and the PyTorch example ``digits_pt`` over the data plane vs its
DataLoaders in-process (:mod:`streaming_pt`), in the same run.

*Delivered*: the samples/s a chief receives from ``k`` input workers through csrun's
runtime — exactly its training path, as local processes on this host:

* the chief process starts one tf.data service dispatcher per worker
  (:func:`csrun_runtime.tensorflow.service.start_dispatchers`), publishes them in a rendezvous
  directory (:class:`csrun_runtime.rendezvous.Rendezvous`) and, once every worker has
  registered, reads the merged stream with :class:`csrun_runtime.tensorflow.service.ServiceSource`
  (``from_dataset_id``/``distribute``, ``parallel_epochs``, no compression: one reader thread
  per worker); after a warm-up it counts samples over a fixed window;
* each worker process runs :func:`csrun_runtime.tensorflow.worker.run_worker` — the very function
  an input-worker task of ``csrun_wse`` runs — with the role an srun task would get
  (``CSRUN_ROLE=worker``, ``CSRUN_CPUS_PER_TASK=C``): its own ``input_fn(params_i)`` behind a
  WorkerServer.

*Standalone*: the same ``k`` workers' pipelines (``input_fn(params_i)``, the same
``private_threadpool_size = C``) iterated in-process, no service, measured
**concurrently** over a common window (a file barrier): their summed samples/s. On a
host whose cores all processes share this is the fair reference: the same CPU
contention without the service hop. Full mode also measures each worker **alone**
(``standalone_alone_sum``: the ideal of one node per worker).

Figures per pipeline and ``k``: medians and IQRs over ``repeats`` repetitions (the order of
service, data plane and standalone rotated each time) of the delivered and the
concurrent-standalone rates (samples/s), ``efficiency`` = median delivered through the
service / median standalone sum, ``efficiency_dataplane`` the same through the data plane
(the chief's :class:`csrun_runtime.tensorflow.remote.DataplaneSource`, bundles converted to
tensors as for training), ``dataplane_vs_service``, and ``paired`` (per-repetition ratios).

The processes are this script: ``python bench/bench_streaming.py --chief|--worker|--standalone SPEC``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it

from analyzer.probe_worker import samples_in
from csrun_common import atomic
from csrun_common.env import ADVERTISE_HOST, TaskEnv
from csrun_common.jobsecret import job_secret
from csrun_common.roles import resolve_role
from csrun_runtime import rendezvous
from csrun_runtime.capture import load_entry
from csrun_runtime.params import resolve_params
from csrun_runtime.tensorflow import contract, remote, service
from csrun_runtime.tensorflow.worker import run_worker
from launcher.slurm import stop_process_group

REPO = common.REPO

PIPELINES = common.PIPELINES
CPUS_PER_WORKER = 1


# --------------------------------------------------------------------------- child processes
def _write(path: Path, obj: Any) -> None:
    atomic.write_json(path, obj, indent=None)


def _samples(el: Any) -> int:
    import tensorflow as tf  # only in the child processes: the harness never loads it

    return samples_in(tf.nest.flatten(el))


def _chunk_batch_size(batches: Any) -> int:
    """Samples per batch of a chunk's element (its tensors are ``[batches, samples, ...]``)."""
    import tensorflow as tf

    flat = [t for t in tf.nest.flatten(batches) if t is not None]
    return int(flat[0].shape[1]) if flat and len(flat[0].shape) > 1 else 1


def _argv(spec: dict) -> list[str]:
    return [*spec["argv"], "--mode", "train", "--model_dir", spec["model_dir"]]


def child_standalone(spec: dict) -> None:
    """Iterate worker ``index``'s pipeline in-process: warm-up, barrier with the other
    ``barrier`` processes, a ``measure_s`` window, then keep iterating until all have
    measured. Writes ``{"samples_per_sec", "samples", "window_s"}``."""
    import tensorflow as tf  # only in the child processes: the harness never loads it

    entry = load_entry(spec["run_py"], _argv(spec))
    params = entry.worker_params(spec["index"], spec["num_workers"])
    seed = params["train_input"].get("shuffle_seed")
    if seed is not None:
        tf.random.set_seed(int(seed))
    ds = contract.call_input_fn(entry.input_fn, params, "train")
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = int(spec["cpus"])
    ds = ds.with_options(opts)
    it = iter(ds)
    common.concurrent_window(lambda: _samples(next(it)), spec, Path(spec["out"]))


def child_worker(spec: dict) -> None:
    """An input-worker task: :func:`csrun_runtime.tensorflow.worker.run_worker` with the srun
    environment of worker ``index`` of ``spec["num_workers"]``."""
    os.environ.update(TaskEnv("worker", 1, 0, 0, spec["num_workers"], spec["num_workers"] + 1,
                              spec["cpus"]).encode())
    os.environ.update({"SLURM_PROCID": str(spec["index"]), "SLURM_JOB_ID": spec["job_id"], "SLURM_STEP_ID": "0",
                       ADVERTISE_HOST: "localhost"})
    argv = _argv(spec)
    entry = load_entry(spec["run_py"], argv)
    resolved = resolve_params(argv, run_py=spec["run_py"])
    rc = run_worker(resolve_role(), resolved, entry.input_fn)
    _write(Path(spec["out"]), {"exit": rc})


def child_chief(spec: dict) -> None:
    """The chief's ingest path: dispatchers, rendezvous, wait for the registrations, then
    drain :class:`ServiceSource` (warm-up, ``measure_s`` window). Writes the delivered
    ``samples_per_sec`` and marks the job done so the workers leave."""
    load_entry(spec["run_py"], _argv(spec))  # the same imports as a chief (input_fn's modules)
    k = spec["num_workers"]
    rdv = rendezvous.Rendezvous(spec["model_dir"], f"{spec['job_id']}.0")
    rdv.reset()
    hb = rendezvous.Heartbeat(rdv, "chief").start()
    dataplane = spec.get("transport") == "dataplane"
    servers: list = []
    receiver = None
    if dataplane:  # runconfig.transport: dataplane, as ChiefStreams.start_dispatchers does it
        receiver, addresses = remote.start_for_chief(rdv, "localhost", k, {
            "chief_host": socket.gethostname(), "bench": True})
    else:
        servers, ports = service.start_dispatchers(k)
        addresses = [f"localhost:{p}" for p in ports]
        rdv.publish_endpoints(addresses, {"chief_host": socket.gethostname(), "bench": True})
    res: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        regs: dict = {}
        while len(regs) < k:
            regs = {i: r for i in range(k) if (r := rdv.worker(i)) and r.get("status") == "ok"}
            bad = [r for i in range(k) if (r := rdv.worker(i)) and r.get("status") == "failed"]
            if bad:
                raise RuntimeError(f"a worker failed to register: {bad[0].get('violations')}")
            if time.monotonic() - t0 > spec["start_timeout_s"]:
                raise RuntimeError(f"{len(regs)} of {k} workers registered in {spec['start_timeout_s']} s")
            time.sleep(0.1)
        res["registered_s"] = time.monotonic() - t0
        source: Any = (remote.chief_source(rdv, receiver, regs) if dataplane
                       else service.ServiceSource(rdv, addresses, regs))
        # whole elements, as the training loop takes them (a bundle is several batches)
        first = source.get_chunk(1 << 30, spec["start_timeout_s"])
        batch = _chunk_batch_size(first.batches)
        t_end = time.monotonic() + spec["warmup_s"]
        while time.monotonic() < t_end:
            source.get_chunk(1 << 30, 60)
        samples = 0
        t1 = time.monotonic()
        while time.monotonic() - t1 < spec["measure_s"]:
            samples += source.get_chunk(1 << 30, 60).steps * batch
        dt = time.monotonic() - t1
        desc = source.describe()
        res.update({"samples_per_sec": samples / dt, "samples": samples, "window_s": dt,
                    "batches_per_worker": desc["batches_per_worker"],
                    "batches_per_element": desc["batches_per_element"]})
        rdv.mark_done("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the harness
        res["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        rdv.mark_done("failed", res["error"])
    hb.stop()
    _write(Path(spec["out"]), res)
    del servers


def _child_main(argv: list[str]) -> None:
    role, spec_path = argv[0], argv[1]
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    code = 0
    try:
        {"--chief": child_chief, "--worker": child_worker, "--standalone": child_standalone}[role](spec)
    except BaseException as exc:  # noqa: BLE001
        try:
            _write(Path(spec["out"]), {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        except OSError:
            pass
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a pipeline with tf.py_function can hang interpreter exit


# --------------------------------------------------------------------------- harness
class _Procs:
    """Child processes of one measurement; all killed (process groups) on exit."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []

    def start(self, role: str, spec: dict, name: str) -> Path:
        spec_path = self.workdir / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        log = open(self.workdir / f"{name}.log", "ab")
        job_secret()  # this harness' own secret, in os.environ: the chief and its workers share it
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, str(spec_path)],
                                           stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()
        return Path(spec["out"])

    def wait(self, timeout: float) -> bool:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if all(p.poll() is not None for p in self.procs):
                return True
            time.sleep(0.2)
        return False

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                stop_process_group(p, grace=3.0)

    def __enter__(self) -> _Procs:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"error": f"no result in {path.name}"}


def _log_tail(workdir: Path, name: str) -> str:
    try:
        lines = [ln for ln in (workdir / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[:400]
    except OSError:
        return ""


def _measurement(pipeline: str, k: int, warmup_s: float, measure_s: float, workdir: Path,
                 tag: str) -> tuple[Path, dict]:
    """A fresh directory ``workdir/tag`` for one measurement and the spec its child
    processes share (the pipeline's run.py and argv, ``k`` workers of CPUS_PER_WORKER CPUs,
    the warm-up and window in seconds)."""
    run_py, argv = PIPELINES[pipeline]
    wd = workdir / tag
    wd.mkdir(parents=True)
    return wd, {"run_py": str(run_py), "argv": argv, "model_dir": str(wd / "model_dir"), "num_workers": k,
                "cpus": CPUS_PER_WORKER, "warmup_s": warmup_s, "measure_s": measure_s, "workdir": str(wd)}


def measure_service(pipeline: str, k: int, warmup_s: float, measure_s: float, workdir: Path, tag: str,
                    timeout_s: float = 240.0, transport: str = "service") -> float:
    """Delivered samples/s at the chief from ``k`` input workers (see the module docstring),
    through ``transport``: ``service`` (tf.data service) or ``dataplane`` (csrun's data plane,
    :mod:`csrun_runtime.tensorflow.remote`)."""
    wd, base = _measurement(pipeline, k, warmup_s, measure_s, workdir, tag)
    base.update(job_id=f"bench{os.getpid()}{tag}", start_timeout_s=timeout_s * 0.6, transport=transport)
    with _Procs(wd) as procs:
        out = procs.start("--chief", {**base, "out": str(wd / "chief.json")}, "chief")
        t_end = time.monotonic() + 60
        while not (wd / "model_dir" / ".csrun" / f"{base['job_id']}.0" / "endpoints.json").exists():
            if procs.procs[0].poll() is not None or time.monotonic() > t_end:
                raise RuntimeError(f"the chief did not publish its dispatchers: {_log_tail(wd, 'chief')}")
            time.sleep(0.2)
        for i in range(k):
            procs.start("--worker", {**base, "index": i, "out": str(wd / f"worker{i}.json")}, f"worker{i}")
        t_end = time.monotonic() + timeout_s
        while procs.procs[0].poll() is None and time.monotonic() < t_end:
            time.sleep(0.2)
        res = _read(out)
        procs.wait(15)
    if res.get("error") or "samples_per_sec" not in res:
        raise RuntimeError(f"service run failed: {res.get('error')} {_log_tail(wd, 'chief')} "
                           f"{_log_tail(wd, 'worker0')}")
    return float(res["samples_per_sec"])


def measure_standalone(pipeline: str, indices: list[int], k: int, warmup_s: float, measure_s: float,
                       workdir: Path, tag: str, timeout_s: float = 180.0) -> list[float]:
    """In-process samples/s of workers ``indices`` (of ``k``), run concurrently over a
    common window; returns each one's rate."""
    wd, base = _measurement(pipeline, k, warmup_s, measure_s, workdir, tag)
    base.update(tag="sa", barrier=len(indices))
    with _Procs(wd) as procs:
        outs = [procs.start("--standalone", {**base, "index": i, "out": str(wd / f"sa{i}.json")}, f"sa{i}")
                for i in indices]
        procs.wait(timeout_s)
        res = [_read(o) for o in outs]
    bad = [r for r in res if "samples_per_sec" not in r]
    if bad:
        raise RuntimeError(f"standalone run failed: {bad[0].get('error')} {_log_tail(wd, f'sa{indices[0]}')}")
    return [float(r["samples_per_sec"]) for r in res]


#: Pipelines that are PyTorch run.py files: measured by :mod:`streaming_pt` (data plane
#: and standalone; tf.data service cannot carry a DataLoader's batches without TensorFlow).
PYTORCH = {"digits_pt"}


def _pytorch_runs(pipeline: str, k: int, repeats: int, warmup: float, window: float, work: Path) -> dict:
    """A PyTorch pipeline's row: delivered over the data plane and standalone, the order of
    the two alternated per repetition; ``efficiency_dataplane`` = median delivered / median
    standalone sum (the TensorFlow rows' definition)."""
    import streaming_pt

    kinds = ["dataplane", "standalone"]
    got: dict[str, list[float]] = {w: [] for w in kinds}
    try:
        for r in range(repeats):
            for what in kinds[r % 2:] + kinds[:r % 2]:
                got[what].append(streaming_pt.measure(what, pipeline, k, warmup, window, work,
                                                            f"{pipeline}_k{k}_r{r}_{what}"))
    except Exception as exc:  # noqa: BLE001 - recorded, the other runs go on
        return {"pipeline": pipeline, "k": k, "framework": "pytorch",
                "error": f"{type(exc).__name__}: {str(exc)[:800]}", **{f"{w}_so_far": v for w, v in got.items()}}
    dp, conc = got["dataplane"], got["standalone"]
    return {"pipeline": pipeline, "k": k, "framework": "pytorch",
            "dataplane": common.spread(dp, 2), "standalone_concurrent_sum": common.spread(conc, 2),
            "efficiency_dataplane": round(common.ratio_of_medians(dp, conc), 4),
            "paired_dataplane": common.compare(dp, conc)}


def run(quick: bool = False, short: bool = False, frameworks: bool = False, transports: bool = False) -> dict:
    """For each pipeline and ``k`` (quick: digits and digits_pt, k = 1, 2 repetitions, 2 s windows;
    short: digits, digits_pt and images, k = 1, 2, 3 repetitions, 4 s windows, no each-worker-alone
    runs; full: the same, 6 s windows, plus each TensorFlow worker alone), the delivered
    samples/s through tf.data service and through csrun's data plane (``runconfig.transport``;
    PyTorch pipelines: the data plane only, :func:`_pytorch_runs`), the standalone samples/s,
    and their ratios (see the module docstring). Each repetition rotates the order of the three
    measurements. ``frameworks``: the digits only, as a TensorFlow and as a PyTorch run.py,
    k = 1, 2, the short mode's windows (``--frameworks``: into results/streaming_frameworks.json).
    ``transports`` (``--transports``): the TensorFlow pipelines only (digits, images; k = 1, 2),
    the short mode's windows: the two transports side by side (results/streaming_transport.json)."""
    if quick:
        plan, repeats, warmup, window, alone = [("digits", 1), ("digits_pt", 1)], 2, 1.0, 2.0, False
    elif frameworks:  # the digits through TensorFlow and through PyTorch, side by side
        plan = [("digits", 1), ("digits_pt", 1), ("digits", 2), ("digits_pt", 2)]
        repeats, warmup, window, alone = 3, 2.0, 4.0, False
    elif short or transports:
        plan = [("digits", 1), ("digits", 2), ("digits_pt", 1), ("digits_pt", 2), ("images", 1), ("images", 2)]
        plan = [(p, k) for p, k in plan if not (transports and p in PYTORCH)]
        repeats, warmup, window, alone = 3, 2.0, 4.0, False
    else:
        plan = [("digits", 1), ("digits", 2), ("digits_pt", 1), ("digits_pt", 2), ("images", 1), ("images", 2)]
        repeats, warmup, window, alone = 3, 2.0, 6.0, True
    kinds = ["service", "dataplane", "standalone"]
    out: dict[str, Any] = {
        "benchmark": "streaming efficiency: delivery through tf.data service and through csrun's data plane "
                     "vs standalone rates",
        "unit": "samples/s", "repeats": repeats, "warmup_s": warmup, "window_s": window,
        "cpus_per_worker": CPUS_PER_WORKER, "where": "local processes on this host (chief and workers)",
        "order": "rotating per repetition: " + ", ".join("/".join(kinds[r % 3:] + kinds[:r % 3]) for r in range(3)),
        "runs": {},
    }
    common.ensure_example_data(sorted({p for p, _ in plan}))  # a fresh checkout has no example data
    with tempfile.TemporaryDirectory(prefix="bench_streaming_") as tmp:
        work = Path(tmp)
        for pipeline, k in plan:
            key = f"{pipeline}, k={k}"
            got: dict[str, list[float]] = {w: [] for w in kinds}
            alone_sums: list[float] = []
            if pipeline in PYTORCH:
                out["runs"][key] = _pytorch_runs(pipeline, k, repeats, warmup, window, work)
                continue
            try:
                for r in range(repeats):
                    for what in kinds[r % 3:] + kinds[:r % 3]:
                        tag = f"{pipeline}_k{k}_r{r}_{what}"
                        if what == "standalone":
                            got[what].append(sum(measure_standalone(pipeline, list(range(k)), k, warmup, window,
                                                                    work, tag)))
                        else:
                            got[what].append(measure_service(pipeline, k, warmup, window, work, tag, transport=what))
                    if alone:
                        alone_sums.append(sum(measure_standalone(pipeline, [i], k, warmup, window, work,
                                                                 f"{pipeline}_k{k}_r{r}_alone{i}")[0]
                                              for i in range(k)))
                svc, dp, conc = got["service"], got["dataplane"], got["standalone"]
                rec: dict[str, Any] = {
                    "pipeline": pipeline, "k": k,
                    "service": common.spread(svc, 2),
                    "dataplane": common.spread(dp, 2),
                    "standalone_concurrent_sum": common.spread(conc, 2),
                    "efficiency": round(common.ratio_of_medians(svc, conc), 4),
                    "efficiency_dataplane": round(common.ratio_of_medians(dp, conc), 4),
                    "dataplane_vs_service": round(common.ratio_of_medians(dp, svc), 4),
                    "paired": common.compare(svc, conc),
                    "paired_dataplane": common.compare(dp, conc),
                }
                if alone_sums:
                    rec["standalone_alone_sum"] = round(common.median(alone_sums), 2)
                    rec["standalone_alone_sums"] = [round(x, 2) for x in alone_sums]
                    rec["efficiency_vs_alone"] = round(common.ratio_of_medians(svc, alone_sums), 4)
                    rec["efficiency_dataplane_vs_alone"] = round(common.ratio_of_medians(dp, alone_sums), 4)
            except Exception as exc:  # noqa: BLE001 - recorded, the other runs go on
                rec = {"pipeline": pipeline, "k": k, "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                       **{f"{w}_so_far": v for w, v in got.items()}}
            out["runs"][key] = rec
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--chief", "--worker", "--standalone"):
        _child_main(sys.argv[1:])
    res = run(quick="--quick" in sys.argv, short="--short" in sys.argv, frameworks="--frameworks" in sys.argv,
              transports="--transports" in sys.argv)
    if "--frameworks" in sys.argv:  # its own file: the recorded streaming.json stays the full run's
        res["meta"] = common.metadata(False)
        common.write_json(common.BENCH / "results" / "streaming_frameworks.json", res)
    if "--transports" in sys.argv:  # the transports side by side (docs/DATAPLANE.md, docs/SECURITY.md)
        res["meta"] = common.metadata(False)
        common.write_json(common.BENCH / "results" / "streaming_transport.json", res)
    print(json.dumps(res, indent=1))
