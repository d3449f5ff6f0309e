"""Benchmark: what the PyTorch read-ahead bound costs (issue 33, item 4; docs/DATAPLANE.md
"Read-ahead in batches").

examples/digits_pt unchanged, ``k`` input workers, with ``runconfig.input_read_ahead_batches``
0 (the 4 MiB byte window only: the behaviour before the bound), the default
(:data:`csrun_runtime.pytorch.remote.READ_AHEAD_BATCHES`) and 4, alternating
within each repetition (the order rotating) so that the host's load falls on both alike:

* ``training``: the example trained by the real PyTorch chief (its run.py with the environment
  of a ``csrun_wse python-pt`` chief task, the workers its run.py as input-worker tasks; local
  processes, no Slurm): performance.json's ``steady_samples_per_sec`` and
  ``input_wait_fraction``, and how many batches each worker read beyond what the chief trained;
* ``ingest``: the samples/s the chief's ``RemoteSource`` receives with no training at all
  (:func:`streaming_pt.measure` ``"dataplane"``): the data plane's own ceiling, where bundles of
  ``B // 2`` batches and an acknowledgement per bundle cost most.

Medians over the repetitions and the median of the per-repetition ratios bounded / unbounded.

Run: ``python bench/bench_read_ahead.py [--quick] [--out bench/results/read_ahead_pt.json]``
(~2 minutes on the 2-core host; ``--quick``: one repetition, short windows).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is on sys.path: these modules run as scripts from it
import streaming_pt
import yaml

from csrun_runtime.pytorch.remote import READ_AHEAD_BATCHES

RUN_PY = common.REPO / "examples/digits_pt/run.py"
STEPS = 3000


def train(k: int, ahead: int, wd: Path, steps: int = STEPS) -> dict:
    """examples/digits_pt trained ``steps`` steps by a chief with ``k`` input workers (local
    processes with csrun_wse's task environments); ``ahead``: ``input_read_ahead_batches``.
    Returns performance.json's rate and wait, and each worker's batches read beyond training."""
    params = yaml.safe_load((common.REPO / "examples/digits_pt/configs/params.yaml").read_text())
    params.setdefault("runconfig", {}).update({"input_read_ahead_batches": ahead, "log_steps": steps,
                                               "checkpoint_steps": 0})
    wd.mkdir(parents=True)
    (wd / "params.yaml").write_text(yaml.safe_dump(params))
    spec = {"num_workers": k, "cpus": 1, "job_id": f"benchra{int(time.time() * 1000) % 10 ** 9}",
            "argv": ["--params", str(wd / "params.yaml")], "model_dir": str(wd / "md")}
    argv = [sys.executable, str(RUN_PY), *streaming_pt._argv(spec), "--max_steps", str(steps)]
    procs: list[subprocess.Popen] = []
    streaming_pt._popen(procs, wd, "chief", argv, {**streaming_pt._env(), **streaming_pt._task_env("chief", spec, 0)})
    for i in range(k):
        streaming_pt._popen(procs, wd, f"worker{i}", argv,
                            {**streaming_pt._env(), **streaming_pt._task_env("worker", spec, i)})
    try:
        if procs[0].wait(timeout=180) != 0:
            raise RuntimeError(f"chief failed: {(wd / 'chief.log').read_text()[-800:]}")
        streaming_pt._stop(procs, 15)
    finally:
        streaming_pt._stop(procs, 0)
    perf = json.loads((wd / "md/performance/performance.json").read_text())
    reports = {p.name.split(".")[0]: json.loads(p.read_text())
               for p in (wd / "md").glob(".csrun/*/workers/*.report.json")}
    return {"samples_per_sec": perf["steady_samples_per_sec"], "input_wait_fraction": perf["input_wait_fraction"],
            "read_ahead": {i: r["batches"] - perf["batches_per_worker"].get(i, 0) for i, r in reports.items()}}

VARIANTS = {"bytes only (before)": 0, f"read-ahead {READ_AHEAD_BATCHES} batches (default)": READ_AHEAD_BATCHES,
            "read-ahead 4 batches": 4}


def run(quick: bool = False, ks: tuple[int, ...] = (1, 2)) -> dict:
    """The measurements: ``{"rows": [...], "metadata": ...}``, one row per kind and k."""
    reps, warmup, window = (1, 1.0, 2.0) if quick else (3, 2.0, 4.0)
    got: dict[tuple[str, int, str], list] = {}
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="bench_read_ahead.") as tmp:
        for r in range(reps):
            for k in ks:
                for j in range(len(names)):
                    name = names[(j + r) % len(names)]
                    b = VARIANTS[name]
                    t = train(k, b, Path(tmp) / f"train-r{r}k{k}b{b}", 1000 if quick else STEPS)
                    got.setdefault(("training", k, name), []).append(t)
                    rate = streaming_pt.measure("dataplane", "digits_pt", k, warmup, window, Path(tmp),
                                                f"r{r}k{k}b{b}", rc={"input_read_ahead_batches": b})
                    got.setdefault(("ingest", k, name), []).append({"samples_per_sec": rate})
                    print(f"rep {r} k={k} {name}: training {t['samples_per_sec']:.0f} samples/s (wait "
                          f"{t['input_wait_fraction']:.3f}, read ahead {t['read_ahead']}), ingest {rate:.0f}",
                          file=sys.stderr, flush=True)
    rows = []
    for kind in ("training", "ingest"):
        for k in ks:
            runs = {n: got[(kind, k, n)] for n in names}
            rates = {n: [x["samples_per_sec"] for x in v] for n, v in runs.items()}
            rows.append({"kind": kind, "pipeline": "digits_pt", "k": k, "repetitions": reps,
                         "samples_per_sec": {n: common.median(v) for n, v in rates.items()},
                         "runs": runs,
                         "ratio_bounded_to_unbounded": common.median(
                             a / b for a, b in zip(rates[names[1]], rates[names[0]], strict=True))})
    return {"rows": rows, "steps": STEPS, "ingest_window_s": window, "metadata": common.metadata(quick)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(common.BENCH / "results" / "read_ahead_pt.json"))
    args = ap.parse_args()
    res = run(quick=args.quick)
    common.write_json(Path(args.out), res)
    for row in res["rows"]:
        print(f"{row['kind']} k={row['k']}: " + ", ".join(f"{n} {v:.0f}" for n, v in row["samples_per_sec"].items())
              + f"; ratio {row['ratio_bounded_to_unbounded']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
