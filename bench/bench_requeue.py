"""Benchmark: what one requeue costs a ``csrun_wse --requeue`` run — seconds from the
preemption signal to the resumed job's first training step, and training steps lost.

One batch job (``--use-sbatch --requeue``, 1 node: the chief and one input worker, the
digits example paced to ~20 ms per batch, tests/fixtures/paced/run.py) trains 1,200 global
steps; once it has logged 150 steps it is interrupted once, then it runs to the end. Three
ways, in rotating order, ``rounds`` times:

* ``warning`` — the time-limit / preemption warning: ``scancel --signal=USR2`` (what
  ``--signal=USR2@90`` makes Slurm send). The chief saves at its step and exits 75; the batch
  script runs ``scontrol requeue``.
* ``scontrol_requeue`` — ``scontrol requeue`` (what preemption in REQUEUE mode does): the
  tasks get SIGTERM, and SIGKILL ``KillWait`` (5 s here) later; the chief saves at its step
  within that time; Slurm requeues the job.
* ``no_hook`` — the same job and the same ``scontrol requeue`` without csrun's stop hook (the
  ``CSRUN_STOP_SIGNALS`` export removed from the script): the chief dies of SIGTERM and the
  next allocation restores the last periodic checkpoint (``checkpoint_steps`` 100, every
  ~2 s): what a run without ``--requeue`` loses.

Figures per way (medians over the rounds, with every round kept):

* ``resume_s`` — from the signal (the chief's record of it; for ``no_hook`` the moment
  ``scontrol requeue`` was sent) to the first training step of the next allocation; split
  into ``stop_s`` (signal → the allocation's end: finish the step, save, workers leave),
  ``requeue_wait_s`` (→ the next allocation's chief process starts: Slurm ends the job,
  waits ``cred_expire`` — 10 s on the test cluster, 120 s by default — and schedules it
  again) and ``startup_s`` (→ its first step: Python and TensorFlow start-up, rendezvous,
  checkpoint restore, the first step's compile);
* ``lost_steps`` — global steps trained in the first allocation that the second trains
  again (last step logged before the interruption − the step restored).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

PACED = str(common.REPO / "tests" / "fixtures" / "paced" / "run.py")
LAYOUT = ["--total-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]
MAX_STEPS, INTERRUPT_AT, CKPT_STEPS = 1200, 150, 100
WAYS = ("warning", "scontrol_requeue", "no_hook")


def _params(root: Path) -> Path:
    return common.digits_params(root, {"pace_ms": 20}, {"log_steps": 1, "checkpoint_steps": CKPT_STEPS,
                                                        "eval_frequency": None, "keep_checkpoint_max": 3})


def _script(env: dict, params: Path, model_dir: Path, hook: bool) -> str:
    argv = [common.console_script("csrun_wse"), "--use-sbatch", "--requeue", "--dry-run", *LAYOUT, "python-ws", PACED,
            "--params", str(params), "--model_dir", str(model_dir), "--mode", "train", "--max_steps", str(MAX_STEPS)]
    script = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    return script if hook else re.sub(r"CSRUN_STOP_SIGNALS=[A-Z0-9:]+,", "", script)


def _submit(env: dict, script: str, cwd: Path) -> str:
    out = subprocess.run(["sbatch", "--parsable"], input=script, env=env, capture_output=True, text=True,
                         check=True, cwd=str(cwd), timeout=60).stdout
    return out.strip().split(";")[0]


def _steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"global_step = (\d+), loss", text)]


def _wait_steps(out: Path, n: int, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if out.exists() and len(_steps(out.read_text())) >= n:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{out}: fewer than {n} steps logged in {timeout:.0f} s")


def _wait_gone(env: dict, job: str, timeout: float = 600.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        q = subprocess.run(["squeue", "--noheader", "--format=%i", f"--jobs={job}"], env=env, capture_output=True,
                           text=True).stdout
        if not q.strip():
            return
        time.sleep(1.0)
    raise RuntimeError(f"job {job} still queued after {timeout:.0f} s")


def _interrupt(way: str, env: dict, job: str) -> float:
    """Send the interruption; returns its wall-clock time."""
    t = time.time()
    if way == "warning":
        subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True, capture_output=True, timeout=30)
    else:
        subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True, timeout=30)
    return t


def one_run(way: str, env: dict, root: Path, params: Path, index: int) -> dict:
    """Run the job once with one interruption; returns the round's figures (seconds, steps)."""
    model_dir = root / f"{way}-{index}"
    job = _submit(env, _script(env, params, model_dir, hook=way != "no_hook"), root)
    out = root / f"csrun_wse-{job}.out"
    _wait_steps(out, INTERRUPT_AT)
    sent = _interrupt(way, env, job)
    _wait_gone(env, job)
    text = out.read_text()
    allocs = json.loads((model_dir / "performance" / "allocations.json").read_text())["allocations"]
    last, first = allocs[-1], (allocs[0] if len(allocs) > 1 else None)
    restart_mark = text.index("allocation 2 (at most")  # the batch script's line of the 2nd allocation
    steps_before = _steps(text[:restart_mark])
    signal_at = first["signal_at"] if first and first.get("signal_at") else sent
    ended_at = first["ended_at"] if first else None
    rec = {
        "job": job, "allocations": len(allocs) if first else len(allocs) + 1,
        "last_step_logged_before": max(steps_before), "restored_step": last["start_step"],
        "lost_steps": max(steps_before) - last["start_step"],
        "resume_s": round(last["first_step_at"] - signal_at, 3),
        "stop_s": round(ended_at - signal_at, 3) if ended_at else None,
        "requeue_wait_s": round(last["process_start"] - (ended_at or sent), 3),
        "startup_s": round(last["first_step_at"] - last["process_start"], 3),
        "complete": sorted(_steps(text)) == sorted(set(_steps(text))) and last["end_step"] == MAX_STEPS,
        "stopped_by": first["stopped_by"] if first else None,
    }
    return rec


def _cred_expire(env: dict) -> str | None:
    out = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True, text=True).stdout
    m = re.search(r"cred_expire=(\d+)", out)
    kill = re.search(r"KillWait\s*=\s*(\d+)", out)
    return f"cred_expire={m.group(1) if m else '120 (default)'}, KillWait={kill.group(1) if kill else '?'}"


def run(quick: bool = False) -> dict:
    """``rounds`` rounds (quick: 1 round of ``warning`` only; full: 3 rounds of all three
    ways in rotating order) of the interrupted job; returns per-way figures and every round."""
    env = clusters.slurm_env()
    root = Path(tempfile.mkdtemp(prefix="csrun-bench-requeue."))
    params = _params(root)
    rounds, ways = (1, ("warning",)) if quick else (3, WAYS)
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for r in range(rounds):
        order = list(ways[r % len(ways):]) + list(ways[:r % len(ways)])
        for way in order:
            clusters.wait_queue_empty(env, max_wait=60.0)
            runs[way].append(one_run(way, env, root, params, r))
    summary = {}
    for way, recs in runs.items():
        summary[way] = {k: common.spread([x[k] for x in recs if x.get(k) is not None], digits=3)
                        for k in ("resume_s", "stop_s", "requeue_wait_s", "startup_s", "lost_steps")
                        if any(x.get(k) is not None for x in recs)}
        summary[way]["all_complete"] = all(x["complete"] for x in recs)
    return {
        "benchmark": "requeue: seconds from the preemption signal to the resumed first step; steps lost",
        "unit": "seconds; steps",
        "layout": LAYOUT, "max_steps": MAX_STEPS, "interrupt_after_steps": INTERRUPT_AT,
        "checkpoint_steps_of_no_hook": CKPT_STEPS, "pace_ms": 20,
        "slurm_settings": _cred_expire(env),
        "summary": summary,
        "runs": runs,
        "rounds": rounds,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
