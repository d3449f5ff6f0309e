"""Benchmark: ``csrun_wse --autoscale`` against a fixed layout that meets the same rate, and
the ``rate`` policy (tf.data service AutoScaler estimate) against Cachew-style ±1 steps.

The pipeline is bound by latency (tests/fixtures/paced/run.py: each input worker sleeps
40 ms per batch of 64, so a worker's rate hardly depends on how busy the shared host cores
are) and training takes a bounded rate (a 10 ms sleep in every step): about 4 input workers
feed it. The allocation is the same for every configuration: the chief alone on the GRES
node and 6 input-worker slots (3 nodes × 2 tasks × 1 CPU); ``max_steps`` 6,000. Configurations,
in rotating order, ``rounds`` times:

* ``fixed4`` — 4 workers all along (``--autoscale --min-workers 4 --max-workers 4
  --initial-workers 4``: the autoscaler measures its windows and can take no action): the
  fixed layout that meets the rate; its windows' median rate is the *steady rate*;
* ``rate`` — ``--autoscale --initial-workers 1`` (policy ``rate``);
* ``step`` — ``--autoscale --initial-workers 1 --autoscale-policy step``.

Windows are 5 s. Figures per configuration (medians over the rounds, every run kept):

* ``reach95_s`` — seconds from the start of training (the first window's start) to the end
  of the first window whose delivered rate is >= 95 % of the steady rate;
* ``worker_seconds`` — seconds each input worker streamed, summed (performance.json
  ``autoscale.worker_seconds``), and ``samples_per_worker_second``;
* ``train_s`` — training time of the 6,000 steps (performance.json ``total_time``);
* ``final_workers``, and for ``rate``/``step`` the AutoScaler formula's estimate at the first
  window (``first_estimate``: ``ceil(consumer rate ÷ mean worker throughput)``) beside the
  workers the run settled on.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

PACED = str(common.REPO / "tests" / "fixtures" / "paced" / "run.py")
LAYOUT = ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]
CONFIGS = {
    "fixed4": ["--autoscale", "--min-workers", "4", "--max-workers", "4", "--initial-workers", "4"],
    "rate": ["--autoscale", "--initial-workers", "1"],
    "step": ["--autoscale", "--initial-workers", "1", "--autoscale-policy", "step"],
}
MAX_STEPS, WINDOW_S, PACE_MS, STEP_PACE_MS = 6000, 5, 40, 10


def _params(root: Path) -> Path:
    return common.digits_params(root, {"pace_ms": PACE_MS}, {"log_steps": 1000, "checkpoint_steps": 0,
                                                             "eval_frequency": None, "jit_compile": False},
                                {"step_pace_ms": STEP_PACE_MS})


def one_run(name: str, env: dict, root: Path, params: Path, index: int, max_steps: int = MAX_STEPS) -> dict:
    """One csrun_wse run of configuration ``name``; returns its performance.json's figures."""
    md = root / f"{name}-{index}"
    argv = [common.console_script("csrun_wse"), *LAYOUT, *CONFIGS[name], "--autoscale-window", str(WINDOW_S),
            "python-ws", PACED, "--params", str(params), "--mode", "train", "--max_steps", str(max_steps),
            "--model_dir", str(md)]
    proc = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise common.CommandFailed(f"{name}: csrun_wse exit {proc.returncode}: {proc.stderr[-1500:]}")
    perf = json.loads((md / "performance" / "performance.json").read_text())
    auto = perf["autoscale"]
    windows = auto["windows"]
    return {"train_s": perf["total_time"], "samples_per_sec": perf["samples_per_sec"],
            "worker_seconds": auto["worker_seconds"], "final_workers": auto["final_workers"],
            "samples": perf["total_samples"], "events": auto["events"],
            "first_estimate": windows[0]["tf_autoscaler_estimate"] if windows else None,
            "windows": [{k: w[k] for k in ("time", "workers", "input_wait_fraction", "samples_per_sec",
                                           "consumer_samples_per_sec", "tf_autoscaler_estimate")} for w in windows]}


def reach_s(run: dict, steady: float, fraction: float = 0.95) -> float | None:
    """Seconds from the first window's start to the end of the first window delivering at
    least ``fraction`` × ``steady`` samples/s (``None`` when none did)."""
    ws = run["windows"]
    if not ws:
        return None
    start = ws[0]["time"] - WINDOW_S
    for w in ws:
        if w["samples_per_sec"] >= fraction * steady:
            return round(w["time"] - start, 3)
    return None


def run(quick: bool = False) -> dict:
    """``rounds`` rounds (quick: 1 round of ``rate`` only, 3,000 steps; full: 2 rounds of
    all three configurations in rotating order); returns per-configuration figures."""
    env = clusters.slurm_env()
    root = Path(tempfile.mkdtemp(prefix="csrun-bench-autoscale."))
    params = _params(root)
    names = ["rate"] if quick else list(CONFIGS)
    rounds, max_steps = (1, 3000) if quick else (2, MAX_STEPS)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            clusters.wait_queue_empty(env, max_wait=60.0)
            runs[name].append(one_run(name, env, root, params, r, max_steps))
    fixed = runs.get("fixed4") or []
    steady = common.median([w["samples_per_sec"] for x in fixed for w in x["windows"][1:]]) if fixed else None
    summary = {}
    for name, recs in runs.items():
        for x in recs:
            x["reach95_s"] = reach_s(x, steady) if steady else None
            ws = x["worker_seconds"]
            x["samples_per_worker_second"] = round(x["samples"] / ws, 1) if ws else None
        summary[name] = {k: common.spread([x[k] for x in recs if x.get(k) is not None], digits=3)
                         for k in ("reach95_s", "worker_seconds", "samples_per_worker_second", "train_s",
                                   "final_workers", "first_estimate")
                         if any(x.get(k) is not None for x in recs)}
    return {
        "benchmark": "autoscale: time to 95 % of the steady rate, worker-seconds; rate policy vs ±1 vs fixed",
        "unit": "seconds; worker-seconds; samples per worker-second",
        "layout": LAYOUT, "configs": CONFIGS, "max_steps": max_steps, "window_s": WINDOW_S,
        "pace_ms": PACE_MS, "step_pace_ms": STEP_PACE_MS,
        "steady_samples_per_sec": steady, "summary": summary, "runs": runs, "rounds": rounds,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
