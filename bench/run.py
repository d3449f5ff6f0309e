"""The one benchmark command: ``python bench/run.py [--quick] [--only NAME,...] [--results DIR]``.

Runs every benchmark module's ``run(quick) -> dict`` in turn on the local Slurm test cluster
(``slurm-test-cluster/cluster up`` first), writes ``<results>/<name>.json`` — the module's
figures plus ``meta`` (host cores, the cluster's topology and whether its nodes are pinned,
Python/TensorFlow/NumPy/Slurm versions, date, quick flag, git commit, load average, the
benchmark's wall time) — then regenerates the table between the ``bench:table`` markers of
the Markdown file from *all* the JSON files present in the results directory.

Benchmarks (names for ``--only``), in order:

====================  ==========================================================  =====
name                  what                                                          issue
====================  ==========================================================  =====
``launch``            csrun_wse vs bare srun, same het layout, alternated pairs     1
``startup``           csrun_wse --dry-run, cs_input_analyzer --help vs python       2
``shardplan``         1,000,000 files onto 10,000 workers: time, imbalance          7
``streaming``         tf.data service delivery vs the workers' standalone rates     6
``ingest``            the chief's ingest ceiling, the hop, the loop, 16 workers     13
``recommend``         analyzer's layout vs exhaustive sweep; vs the default         3, 4
``verify``            cs_input_analyzer verify: predicted vs measured               5
``requeue``           one requeue: signal → resumed first step (s), lost steps      11
``interrupt``         Ctrl-C / SIGTERM of csrun_wse: queue empty (s), exit status   11
``quiet``             main job's non-csrun log lines, default vs --verbose          11
``autoscale``         --autoscale vs a fixed layout; rate policy vs ±1 steps        12
``chief_input``       --chief-input-cpus: the chief's node producing vs not; vs 2   12
                      producer processes (GIL-bound pipeline, one 2-CPU node)
``fanin``             data plane: 1..256 light senders into one chief endpoint      23
``ingest_gap``        data plane vs raw TCP, >= 256 KiB: where the gap goes        23
``read_ahead``        PyTorch read-ahead bound vs the byte window only              33
``gpu_feed``          the PyTorch chief's feed into its device vs DataLoader, H2D   31
``runs``              csrun status of a running job; csrun list over 1,000 runs     42
``resume``            an input stream resumed at 1k/100k/1M samples; tracking cost  41
====================  ==========================================================  =====

A benchmark that raises (or whose module is missing) records ``{"error": ...}`` and the
run goes on; the exit status is 1 when any failed. ``--quick`` is a smoke test (seconds per
benchmark for launch/startup/shardplan): its figures are not for comparison, and by default
they go to ``bench/results/quick/`` so the recorded full results are never overwritten.

Markdown: ``--markdown PATH``; default ``BENCHMARKS.md`` at the repository root when the
results directory is ``bench/results``, else ``<results>/BENCHMARKS.md``; ``--no-markdown``
skips it. ``--table-only`` regenerates the table from the files present, running nothing.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

import common  # bench/ is on sys.path: these modules run as scripts from it
import results_table

HERE, REPO = common.BENCH, common.REPO

#: Benchmark name -> module in bench/ (each has ``run(quick: bool) -> dict``).
BENCHMARKS = {
    "launch": "bench_launch",
    "startup": "bench_startup",
    "shardplan": "bench_shardplan",
    "streaming": "bench_streaming",
    "ingest": "bench_ingest",
    "recommend": "bench_recommend",
    "verify": "bench_verify",
    "requeue": "bench_requeue",
    "interrupt": "bench_interrupt",
    "quiet": "bench_quiet",
    "autoscale": "bench_autoscale",
    "chief_input": "bench_chief_input",
    "fanin": "bench_fanin",
    "ingest_gap": "bench_ingest_gap",
    "read_ahead": "bench_read_ahead",
    "gpu_feed": "bench_gpu_feed",
    "rank_agree": "bench_rank_agree",
    "rank_checks": "bench_rank_checks",
    "runs": "bench_runs",
    "resume": "bench_resume",
    "auth": "bench_auth",
}
DEFAULT_RESULTS = HERE / "results"


def run_one(name: str, quick: bool) -> dict:
    """Import ``bench/<module>.py`` and return its ``run(quick)`` dict with ``meta`` added
    (``meta.elapsed_s``: the benchmark's wall time in seconds). Any exception becomes
    ``{"error": "<type>: <message>", "traceback": ...}``."""
    meta = common.metadata(quick)
    t0 = time.monotonic()
    try:
        mod = importlib.import_module(BENCHMARKS[name])
        res = mod.run(quick=quick)
        if not isinstance(res, dict):
            raise TypeError(f"{BENCHMARKS[name]}.run returned {type(res).__name__}, not a dict")
        res = dict(res)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, the run goes on
        res = {"error": f"{type(exc).__name__}: {str(exc).strip()[:1000]}",
               "traceback": traceback.format_exc()[-6000:]}
    meta["elapsed_s"] = round(time.monotonic() - t0, 3)
    meta["loadavg_end"] = common.metadata(quick)["loadavg"]
    res["benchmark"] = name
    res["meta"] = meta
    return res


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (not for comparison)")
    ap.add_argument("--only", default="", metavar="NAME,...",
                    help=f"run only these benchmarks ({', '.join(BENCHMARKS)})")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="results directory [default: bench/results, bench/results/quick with --quick]")
    ap.add_argument("--markdown", default=None, metavar="PATH",
                    help="Markdown file whose table is regenerated [default: BENCHMARKS.md for bench/results, "
                         "else DIR/BENCHMARKS.md]")
    ap.add_argument("--no-markdown", action="store_true", help="do not regenerate any Markdown table")
    ap.add_argument("--table-only", action="store_true", help="only regenerate the table from the files present")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    bad = [n for n in names if n not in BENCHMARKS]
    if bad:
        ap.error(f"--only {','.join(bad)}: unknown benchmark(s); choose from {', '.join(BENCHMARKS)}")
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results_dir = Path(args.results).resolve() if args.results else (
        DEFAULT_RESULTS / "quick" if args.quick else DEFAULT_RESULTS)
    results_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.table_only:
        for name in args.names:
            print(f"bench: {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
            res = run_one(name, args.quick)
            common.write_json(results_dir / f"{name}.json", res)
            status = f"error: {res['error'][:300]}" if res.get("error") else "ok"
            if res.get("error"):
                failed.append(name)
            print(f"bench: {name}: {status} ({res['meta']['elapsed_s']:.1f} s) -> {results_dir / (name + '.json')}",
                  file=sys.stderr, flush=True)
    if not args.no_markdown:
        md = Path(args.markdown) if args.markdown else (
            REPO / "BENCHMARKS.md" if results_dir == DEFAULT_RESULTS.resolve() else results_dir / "BENCHMARKS.md")
        results = results_table.load_results(results_dir)
        try:
            rel = str(results_dir.relative_to(REPO))
        except ValueError:
            rel = str(results_dir)
        results_table.update_markdown(md, results_table.generated_section(results, rel))
        print(f"bench: table of {len(results)} result file(s) written to {md}", file=sys.stderr)
        print(results_table.render_table(results_table.summary_rows(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
