"""Benchmark: how fast the chief can take input, what the tf.data service hop costs, what the
training loop costs per step, and a chief with 16 input workers.

Four parts, each in its own child processes (``python bench/ingest_roles.py --ROLE SPEC``; the
measurement helpers other benchmarks share are in ``bench/ingest_lib.py``):

1. **Ingest ceiling** (``ceiling``). ``k`` = 1, 2, 4, 8, 16 input-worker processes each
   serve a *cached* batch (``take(1).cache().repeat()`` of one batch of 64 samples: nearly
   free to produce) of 16 KiB, 256 KiB and 4 MiB through csrun's runtime path — one
   dispatcher per worker (:func:`csrun_runtime.tensorflow.service.start_dispatchers`), each worker's
   ``WorkerServer`` (:func:`csrun_runtime.tensorflow.service.start_worker_server`) serving the dataset
   registered by :func:`csrun_runtime.tensorflow.service.register_stream` (the input worker's
   registration step, bundling included), the chief draining
   :class:`csrun_runtime.tensorflow.service.ServiceSource` with ``get_chunk`` as its training loop does.
   Side by side, in rotating order within each repetition and in the same chief process:

   * ``service``: the runtime's default (``input_bundle: auto``);
   * ``service, unbundled``: ``input_bundle: 1`` (one batch per service element: the
     runtime before bundling);
   * ``raw TCP``: ``k`` sender processes writing the same number of bytes per batch over
     loopback TCP to ``k`` receiver threads of the chief (``recv_into`` a preallocated
     buffer): this host's transport limit;
   * ``in-process``: the chief iterating the same cached batch itself (the tf.data iterator's
     per-element cost, no transport).

   Figures: batches/s (× 64 = samples/s), MB/s (10^6 bytes), the chief's CPU-seconds per MB
   and the workers' (all ``k`` together).
2. **The rest of the hop** (``hop``; ``k`` = 1 and 2, every size): variants of the service
   path against ``service`` in the same repetition — ``max_outstanding_requests=8``, two
   consumers per worker sharing a job (``job_name``: two requests in flight per worker),
   ``compression="AUTO"``, ``prefetch(2)`` after bundling on the worker, and the merge inside
   tf.data (``interleave(deterministic=False)`` over the per-worker datasets, iterated by
   one Python loop) instead of the Python-thread merge.
3. **Training loop** (``loop``): the digits model (``examples/digits``), XLA as the runtime's
   ``jit_compile: auto`` gives it: microseconds per step of ``train_on_batch`` (the loop
   before), of :class:`csrun_runtime.tensorflow.steps.TrainSteps` on chunks of one bundle, of the floor
   (one call of 256 steps), and of the whole :class:`csrun_runtime.loop.TrainingDriver`
   (digits' runconfig cadence: logs every 50 steps) on a free in-process source. Per-step
   overhead = loop − floor, as a fraction of the loop's own step and of the step time at the
   rate one input worker delivers the digits pipeline (its in-process rate on 1 CPU).
4. **Many workers** (``many``): ``examples/digits/run.py`` as a chief and 16 input workers
   (local processes with the environment csrun_wse gives its tasks, docs/CONTRACT.md):
   exit statuses, the seconds until all registered, samples/s, batches per worker, and each
   worker process's RSS / PSS / USS (psutil) while streaming.

Statistics: medians and IQRs over the repetitions; ratios are medians of per-repetition
ratios (rotating order, so drift of the shared host hits all sides alike).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it
import psutil
from ingest_lib import DATAPLANE, DATAPLANE_OPEN, HOP_VARIANTS, LEAN, PATHS, ROWS, SIZES

from csrun_common.env import ADVERTISE_HOST, JOB_SECRET, TaskEnv
from csrun_common.jobsecret import job_secret
from launcher.slurm import stop_process_group

REPO = common.REPO
#: The script of the child processes (their roles: ``ingest_roles.ROLES``).
ROLES_SCRIPT = Path(__file__).resolve().with_name("ingest_roles.py")


# =========================================================================== many workers
def _task_env(role: str, procid: int, k: int, job_id: str) -> dict[str, str]:
    """The environment csrun_wse gives a task (docs/CONTRACT.md): chief = task 0 of group 0;
    input workers = one component ``worker``."""
    env = {key: v for key, v in os.environ.items() if not key.startswith(("CSRUN_", "SLURM"))}
    env[JOB_SECRET.name] = job_secret().hex()  # this harness' own: every task of the job shares it
    chief = role == "chief"
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "SLURM_PROCID": str(procid), "SLURM_JOB_ID": job_id,
                "SLURM_STEP_ID": "0", "SLURMD_NODENAME": f"node{procid + 1}", ADVERTISE_HOST: "localhost"})
    env.update(TaskEnv(role, 0 if chief else 1, 0 if chief else 1, 0, k, k + 1, 1).encode())
    return env


def _memory(pids: list[int], full: bool) -> list[dict[str, float]]:

    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            m = p.memory_full_info() if full else p.memory_info()
            rec = {"rss_mb": m.rss / 1e6}
            if full:
                rec.update({"pss_mb": getattr(m, "pss", float("nan")) / 1e6, "uss_mb": m.uss / 1e6})
            out.append(rec)
        except psutil.Error:
            pass
    return out


def run_many(k: int, steps: int, work: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """``examples/digits/run.py`` as a chief and ``k`` input workers (local processes), to
    ``steps`` steps: exit statuses, registration seconds, samples/s, worker memory."""
    run_py, base = common.PIPELINES["digits"]
    md, logs = work / "md", work / "logs"
    logs.mkdir(parents=True)
    job = f"bi{os.getpid()}{time.time_ns() % 10**6}"
    argv = [sys.executable, str(run_py), *base, "--mode", "train", "--max_steps", str(steps), "--model_dir", str(md)]
    procs = []
    t0 = time.monotonic()
    for i in range(k + 1):
        env = _task_env("chief" if i == 0 else "worker", i, k, job)
        with open(logs / f"task{i}.log", "w") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    pids = [p.pid for p in procs[1:]]
    rss_max: dict[int, float] = {}
    full: list[dict[str, float]] = []
    try:
        while procs[0].poll() is None and time.monotonic() - t0 < timeout_s:
            streaming = "training from global step" in (logs / "task0.log").read_text(errors="replace")
            for pid, m in zip(pids, _memory(pids, False), strict=False):
                rss_max[pid] = max(rss_max.get(pid, 0.0), m["rss_mb"])
            if streaming and not full:
                full = _memory(pids, True)  # once, mid-stream (reading smaps costs CPU)
            time.sleep(0.5)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0))))
            except subprocess.TimeoutExpired:
                stop_process_group(p, grace=3.0)
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                stop_process_group(p, grace=3.0)
    wall = time.monotonic() - t0
    perf = json.loads((md / "performance" / "performance.json").read_text()) if codes[0] == 0 else {}
    chief_log = (logs / "task0.log").read_text(errors="replace")
    per = perf.get("batches_per_worker", {})
    return {
        "k": k, "steps": steps, "chief_exit": codes[0], "worker_exits": codes[1:], "wall_s": round(wall, 2),
        "workers_registered_secs": perf.get("workers_registered_secs"),
        "programming_time": perf.get("programming_time"), "samples_per_sec": perf.get("samples_per_sec"),
        "batches_per_worker": per, "workers_that_delivered": sum(1 for v in per.values() if v),
        "input_bundle": perf.get("input_bundle"),
        "worker_rss_mb": common.spread(list(rss_max.values()), 1),
        "worker_pss_mb": common.spread([m["pss_mb"] for m in full], 1) if full else None,
        "worker_uss_mb": common.spread([m["uss_mb"] for m in full], 1) if full else None,
        "chief_log_tail": chief_log.strip().splitlines()[-3:] if codes[0] != 0 else [],
    }


# =========================================================================== the harness
class _Children:
    """Child processes of one measurement (this script with a role); all stopped on exit."""

    def __init__(self, workdir: Path):
        self.workdir, self.procs = workdir, []
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, spec: dict, name: str) -> subprocess.Popen:
        path = self.workdir / f"{name}.spec.json"
        path.write_text(json.dumps(spec))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, str(ROLES_SCRIPT), role, str(path)],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def tail(self, name: str) -> str:
        try:
            lines = [ln for ln in (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith(("W0000", "I0000", "WARNING: All"))]
        except OSError:
            return ""
        return " | ".join(lines[-4:])[:600]

    def __enter__(self) -> _Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                stop_process_group(p, grace=3.0)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"error": f"no result in {path.name}"}


def run_ceiling_k(k: int, plan: dict, work: Path) -> dict:
    """One chief process and ``k`` worker processes: every size × path (and the hop
    variants when ``plan["hop"]``) for this ``k``."""
    wd = work / f"k{k}"
    variants = sorted({v for v, _ in (list(PATHS.values()) + (list(HOP_VARIANTS.values()) if plan["hop"] else []))})
    base = {"rdv_dir": str(wd / "rdv"), "key": f"ingest{os.getpid()}.{k}", "sizes": plan["sizes"],
            "variants": variants, "workdir": str(wd)}
    with _Children(wd) as ch:
        chief = ch.start("--chief", {**base, "k": k, "paths": plan["paths"], "hop": plan["hop"],
                                     "repeats": plan["repeats"], "warmup_s": plan["warmup_s"],
                                     "window_s": plan["window_s"], "start_timeout_s": 300,
                                     "out": str(wd / "chief.json")}, "chief")
        for i in range(k):
            ch.start("--worker", {**base, "index": i, "out": str(wd / f"worker{i}.json")}, f"worker{i}")
        t_end = time.monotonic() + plan["timeout_s"]
        while chief.poll() is None and time.monotonic() < t_end:
            time.sleep(0.5)
        res = _read(wd / "chief.json")
        if "error" in res:
            res["error"] += f": chief: {ch.tail('chief')}; worker0: {ch.tail('worker0')}"
    return res


def _summary(recs: list[dict]) -> dict:
    return {"batches_per_sec": common.spread([r["batches_per_sec"] for r in recs], 1),
            "samples_per_sec": round(common.median(r["samples_per_sec"] for r in recs), 1),
            "mb_per_sec": round(common.median(r["mb_per_sec"] for r in recs), 1),
            "chief_cpu_s_per_mb": round(common.median(r["chief_cpu_s_per_mb"] for r in recs), 5),
            "workers_cpu_s_per_mb": round(common.median(r["workers_cpu_s_per_mb"] for r in recs), 5),
            "chief_cpu": round(common.median(r["chief_cpu"] for r in recs), 3),
            "workers_cpu": round(common.median(r["workers_cpu"] for r in recs), 3)}


def _paired(recs: dict[str, list[dict]], a: str, b: str) -> dict:
    return common.compare([r["mb_per_sec"] for r in recs[a]], [r["mb_per_sec"] for r in recs[b]])


def summarize_ceiling(raw: dict) -> tuple[dict, dict]:
    """Per size and path the medians (:func:`_summary`), the paired ratios service / raw TCP,
    service / unbundled, and each hop variant / service."""
    ceiling, hop = {}, {}
    for size, recs in raw["runs"].items():
        paths = {p: _summary(v) for p, v in recs.items()
                 if p in (*PATHS, "raw TCP", "in-process", DATAPLANE, DATAPLANE_OPEN)}
        if DATAPLANE in recs and DATAPLANE_OPEN in recs:  # what authentication costs (issue 45: >= 0.98)
            paths["data plane / no authentication"] = _paired(recs, DATAPLANE, DATAPLANE_OPEN)
        if "raw TCP" in recs:
            paths["service / raw TCP"] = _paired(recs, "service", "raw TCP")
        if DATAPLANE in recs and "raw TCP" in recs:
            paths["data plane / raw TCP"] = _paired(recs, DATAPLANE, "raw TCP")
            paths["data plane / service"] = _paired(recs, DATAPLANE, "service")
            cpu = [d["chief_cpu_s_per_mb"] / r["chief_cpu_s_per_mb"]
                   for d, r in zip(recs[DATAPLANE], recs["raw TCP"], strict=False)
                   if d.get("chief_cpu_s_per_mb") and r.get("chief_cpu_s_per_mb")]
            paths["data plane / raw TCP, chief CPU-s per MB"] = round(common.median(cpu), 3)
        if "service, unbundled" in recs:
            paths["service / unbundled"] = _paired(recs, "service", "service, unbundled")
        ceiling[size] = paths
        variants = {v: {**_summary(recs[v]), "vs_service": _paired(recs, v, "service")}
                    for v in (*HOP_VARIANTS, LEAN) if v in recs}
        if LEAN in recs and "raw TCP" in recs:
            variants[LEAN]["vs_raw_tcp"] = _paired(recs, LEAN, "raw TCP")
        if variants:
            hop[size] = variants
    return ceiling, hop


def _loop_summary(res: dict) -> dict:
    micro = {k: common.spread(v, 2) for k, v in res["micro_us_per_step"].items()}
    floor = micro["floor: TrainSteps, 256 steps per call"]["median"]
    loop_us = common.median(r["us_per_step"] for r in res["loop"])
    overhead = loop_us - floor
    step_at_rate = res["batch_size"] / res["digits_in_process_samples_per_sec"] * 1e6
    tob = micro["train_on_batch"]["median"]
    return {"micro_us_per_step": micro, "loop_us_per_step": common.spread([r["us_per_step"] for r in res["loop"]], 2),
            "loop_calls": [r["calls"] for r in res["loop"]], "loop_steps": [r["steps"] for r in res["loop"]],
            "floor_us_per_step": floor, "overhead_us_per_step": round(overhead, 2),
            "overhead_vs_loop_step": round(overhead / loop_us, 4),
            "digits_in_process_samples_per_sec": round(res["digits_in_process_samples_per_sec"], 1),
            "step_us_at_digits_rate": round(step_at_rate, 2),
            "overhead_vs_step_at_digits_rate": round(overhead / step_at_rate, 4),
            "train_on_batch_overhead_vs_step_at_digits_rate": round((tob - floor) / step_at_rate, 4),
            "bundle": res["bundle"], "xla": res["xla"], "log_steps": res["log_steps"]}


def run(quick: bool = False, ceiling_only: bool = False, only_ks: list[int] | None = None) -> dict:
    """Every part (see the module docstring). Quick (the CI smoke test): k = 1, 256 KiB, one
    repetition of 1 s windows, no hop variants, a short loop, 2 workers. Full: k = 1, 2, 4, 8,
    16, all sizes, 3 repetitions of 1 s windows (after 0.3 s of warm-up; ~8 minutes in all on
    the 2-core host), the hop variants at k = 1, 16 workers. ``ceiling_only`` (``--ceiling-only``):
    the ceiling alone (no hop variants, loop or many workers); ``only_ks`` (``--ks 1,2``): those
    sender counts only."""
    if quick:
        ks, hop_ks, sizes, repeats, warmup, window = [1], [], ["256 KiB"], 1, 0.5, 1.0
        loop_spec, many = {"loop_steps": 300, "repeats": 1, "seconds": 0.5}, (2, 300)
    else:
        ks, hop_ks, sizes, repeats, warmup, window = [1, 2, 4, 8, 16], [1], list(SIZES), 3, 0.3, 1.0
        loop_spec, many = {"loop_steps": 20000, "repeats": 3, "seconds": 2.0}, (16, 4000)
    paths = [*PATHS, "raw TCP", "in-process", DATAPLANE, DATAPLANE_OPEN]
    ks = only_ks or ks
    if ceiling_only:
        hop_ks = []
    out: dict[str, Any] = {"unit": "batches/s of 64 samples; MB/s = 10^6 bytes/s; CPU-s per MB",
                           "sizes_bytes": {s: SIZES[s] for s in sizes}, "ks": ks, "repeats": repeats,
                           "warmup_s": warmup, "window_s": window, "rows_per_batch": ROWS,
                           "where": "local processes on this host (chief, workers, senders)",
                           "ceiling": {}, "hop": {}, "not_measured": NOT_MEASURED}
    common.ensure_example_data(["digits"])  # the loop and many-workers parts train digits
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        work = Path(tmp)
        for k in ks:
            plan = {"sizes": sizes, "paths": paths, "hop": k in hop_ks, "repeats": repeats, "warmup_s": warmup,
                    "window_s": window, "timeout_s": 420 + (900 if k in hop_ks else 0) * (0 if quick else 1)}
            try:
                raw = run_ceiling_k(k, plan, work)
                if "error" in raw:
                    raise RuntimeError(raw["error"])
                ceiling, hop = summarize_ceiling(raw)
                out["ceiling"][f"k={k}"] = {"registered_s": round(raw["registered_s"], 2),
                                             "workers_rss_mb": raw.get("workers_rss_mb"), "sizes": ceiling}
                if hop:
                    out["hop"][f"k={k}"] = hop
            except Exception as exc:  # noqa: BLE001 - recorded, the other parts go on
                out["ceiling"][f"k={k}"] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        if ceiling_only:
            out["targets"] = {k: v for k, v in _targets(out).items() if k.startswith(("dataplane", "ingest"))}
            return out
        out["loop"] = _run_loop(loop_spec, work)
        try:
            out["many"] = run_many(*many, work / "many")
        except Exception as exc:  # noqa: BLE001
            out["many"] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    out["targets"] = _targets(out)
    return out


def _run_loop(spec: dict, work: Path) -> dict:
    wd = work / "loop"
    with _Children(wd) as ch:
        proc = ch.start("--loop", {**spec, "model_dir": str(wd / "md"), "out": str(wd / "loop.json")}, "loop")
        try:
            proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            pass
        res = _read(wd / "loop.json")
        if "error" in res:
            return {"error": f"{res['error']}: {ch.tail('loop')}"}
    return _loop_summary(res)


def _targets(out: dict) -> dict:
    """The issue's targets, from this run: ingest of >= 256 KiB batches >= 50 % of raw TCP
    (every k), the loop's per-step overhead <= 5 % of the step at digits' delivered rate, 16
    workers streaming with exit 0."""
    ratios = {}
    for k, rec in out["ceiling"].items():
        for size, paths in (rec.get("sizes") or {}).items():
            if SIZES[size] >= SIZES["256 KiB"] and "service / raw TCP" in paths:
                ratios[f"{size}, {k}"] = paths["service / raw TCP"]["median_ratio"]
    loop = out.get("loop") or {}
    many = out.get("many") or {}
    dp: dict[str, dict[str, float]] = {"ge_256KiB": {}, "16KiB": {}, "chief_cpu_per_mb_vs_raw": {}}
    for k, rec in out["ceiling"].items():
        for size, paths in (rec.get("sizes") or {}).items():
            if "data plane / raw TCP" in paths:
                dp["ge_256KiB" if SIZES[size] >= SIZES["256 KiB"] else "16KiB"][f"{size}, {k}"] = \
                    paths["data plane / raw TCP"]["median_ratio"]
                dp["chief_cpu_per_mb_vs_raw"][f"{size}, {k}"] = paths["data plane / raw TCP, chief CPU-s per MB"]
    dp_targets = {
        "dataplane_vs_raw_tcp_ge_0.8_for_ge_256KiB": {"ratios": dp["ge_256KiB"], "met": bool(dp["ge_256KiB"]) and all(
            r >= 0.8 for r in dp["ge_256KiB"].values())},
        "dataplane_vs_raw_tcp_ge_0.6_for_16KiB": {"ratios": dp["16KiB"], "met": bool(dp["16KiB"]) and all(
            r >= 0.6 for r in dp["16KiB"].values())},
        "dataplane_chief_cpu_per_mb_le_1.5x_raw_tcp": {"ratios": dp["chief_cpu_per_mb_vs_raw"], "met": bool(
            dp["chief_cpu_per_mb_vs_raw"]) and all(r <= 1.5 for r in dp["chief_cpu_per_mb_vs_raw"].values())},
    }
    return {**dp_targets,
        "ingest_vs_raw_tcp_ge_0.5": {"ratios": ratios, "met": bool(ratios) and all(r >= 0.5 for r in ratios.values())},
        "loop_overhead_le_0.05": {"value": loop.get("overhead_vs_step_at_digits_rate"),
                                  "met": loop.get("overhead_vs_step_at_digits_rate") is not None
                                  and loop["overhead_vs_step_at_digits_rate"] <= 0.05},
        "many_workers_exit_0": {"k": many.get("k"), "met": many.get("chief_exit") == 0
                                and all(c == 0 for c in many.get("worker_exits") or [1])},
    }


#: What the hop study did not measure, and why.
NOT_MEASURED = {
    "data_transfer_protocol": "TensorFlow 2.21 registers two tf.data service data transfer protocols: 'grpc' "
                              "(the default, measured) and 'local' (a worker in the consumer's own process; "
                              "input workers are other processes)",
    "target_workers": "'LOCAL' reads only workers in the consumer's process and 'AUTO'/'ANY' read every "
                      "worker here (none is tagged as colocated): no choice for workers in other processes",
}


if __name__ == "__main__":
    ks_arg = sys.argv[sys.argv.index("--ks") + 1] if "--ks" in sys.argv else ""
    result = run(quick="--quick" in sys.argv, ceiling_only="--ceiling-only" in sys.argv,
                 only_ks=[int(k) for k in ks_arg.split(",") if k] or None)
    if "--out" in sys.argv:  # e.g. --out bench/results/extra/ingest_dataplane.json
        common.write_json(Path(sys.argv[sys.argv.index("--out") + 1]), result)
    print(json.dumps(result, indent=1))

