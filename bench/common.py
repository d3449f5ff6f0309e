"""What every benchmark measures with: robust statistics, timing, the pipelines and example data
they run, and the metadata and JSON of every result file. The test clusters as the benchmarks
use them are ``clusters.py``; the results table of BENCHMARKS.md is ``results_table.py``.

Statistics are medians and inter-quartile ranges, never single runs: every figure in
``bench/results/*.json`` is the median of several measurements, with its spread
(:func:`spread`). Two commands are compared by running them in *alternated pairs*
(A B, B A, A B, ...: :func:`alternate_pairs`) so that drift of a shared machine (other
jobs starting or stopping) hits both sides alike; the comparison is the median of the
per-pair ratios and the ratio of the medians (:func:`compare`).

Units: seconds for times, samples/s for rates; ratios are dimensionless.

This module imports nothing heavy (no TensorFlow, no numpy): ``bench/run.py`` and the
unit tests import it.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# The bench modules run as scripts from bench/ (so ``import common`` finds this file) and
# import the project's packages: the repository root goes on the path here, once for all.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from analyzer.probe_plan import is_nan  # noqa: E402 - after the path bootstrap
from analyzer.user_command import console_script  # noqa: E402
from csrun_common import atomic  # noqa: E402
from launcher import slurm  # noqa: E402
from launcher.slurm import stop_process_group  # noqa: E402

CLUSTER = REPO / "slurm-test-cluster"
TOPOLOGY = CLUSTER / "run" / "etc" / "topology"

#: The benchmarked input pipelines: name -> (run.py, its arguments before ``--mode``).
PIPELINES: dict[str, tuple[Path, list[str]]] = {
    "digits": (REPO / "examples/digits/run.py", ["--params", str(REPO / "examples/digits/configs/params.yaml")]),
    "images": (REPO / "examples/images/run.py", ["--params", str(REPO / "examples/images/configs/params.yaml")]),
    "digits_pt": (REPO / "examples/digits_pt/run.py",
                  ["--params", str(REPO / "examples/digits_pt/configs/params.yaml")]),
    "serial": (BENCH / "pipelines/serial/run.py", ["--params", str(BENCH / "pipelines/serial/configs/params.yaml")]),
}


# --------------------------------------------------------------------------- statistics
def median(xs: Iterable[float]) -> float:
    """Median of ``xs`` (NaN for an empty sequence; NaN values are dropped)."""
    v = sorted(float(x) for x in xs if x is not None and not is_nan(x))
    if not v:
        return math.nan
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2.0


def quantile(xs: Iterable[float], q: float) -> float:
    """Quantile ``q`` (0..1) of ``xs`` with linear interpolation (NumPy's default method)."""
    v = sorted(float(x) for x in xs if x is not None and not is_nan(x))
    if not v:
        return math.nan
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def spread(xs: Sequence[float], digits: int = 6) -> dict:
    """Summary of repeated measurements (same unit as ``xs``): ``median``, ``q1``, ``q3``,
    ``iqr`` (q3 − q1), ``rel_iqr`` (iqr / median), ``min``, ``max``, ``n`` and the raw
    ``values``. NaNs are dropped."""
    v = [float(x) for x in xs if x is not None and not is_nan(x)]
    med = median(v)
    q1, q3 = quantile(v, 0.25), quantile(v, 0.75)
    r = lambda x: None if is_nan(x) else round(x, digits)  # noqa: E731
    return {"median": r(med), "q1": r(q1), "q3": r(q3), "iqr": r(q3 - q1),
            "rel_iqr": r((q3 - q1) / med) if v and med else None,
            "min": r(min(v)) if v else None, "max": r(max(v)) if v else None,
            "n": len(v), "values": [round(x, digits) for x in v]}


def ratio_of_medians(a: Sequence[float], b: Sequence[float]) -> float:
    """``median(a) / median(b)`` (NaN when ``b``'s median is 0 or either is empty)."""
    ma, mb = median(a), median(b)
    if is_nan(ma) or is_nan(mb) or mb == 0:
        return math.nan
    return ma / mb


def compare(a: Sequence[float], b: Sequence[float], digits: int = 4) -> dict:
    """Compare paired measurements ``a[i]`` vs ``b[i]`` (same unit, e.g. seconds).

    Returns ``{"median_ratio"`` (median of a[i]/b[i]), ``"ratio_iqr"`` ([q1, q3] of the
    per-pair ratios), ``"ratio_of_medians"``, ``"median_difference"`` (median of a[i] − b[i],
    in the unit of the inputs), ``"pairs"}``.
    """
    pairs = [(float(x), float(y)) for x, y in zip(a, b, strict=False)
             if not is_nan(x) and not is_nan(y)]
    ratios = [x / y for x, y in pairs if y]
    diffs = [x - y for x, y in pairs]
    r = lambda x: None if is_nan(x) else round(x, digits)  # noqa: E731
    return {"median_ratio": r(median(ratios)),
            "ratio_iqr": [r(quantile(ratios, 0.25)), r(quantile(ratios, 0.75))],
            "ratio_of_medians": r(ratio_of_medians([p[0] for p in pairs], [p[1] for p in pairs])),
            "median_difference": r(median(diffs)), "pairs": len(pairs)}


# --------------------------------------------------------------------------- timing
def alternate_pairs(a: Callable[[], float], b: Callable[[], float], pairs: int,
                    warmup: int = 1) -> tuple[list[float], list[float]]:
    """Run ``a`` and ``b`` in ``pairs`` alternated pairs (A B, B A, A B, ...) after
    ``warmup`` unrecorded pairs; each callable returns one measurement (e.g. seconds).
    Returns ``(a_values, b_values)`` with ``a_values[i]`` and ``b_values[i]`` from the same
    pair."""
    for _ in range(warmup):
        a()
        b()
    av, bv = [], []
    for i in range(pairs):
        if i % 2 == 0:
            x = a()
            y = b()
        else:
            y = b()
            x = a()
        av.append(x)
        bv.append(y)
    return av, bv


def round_robin(fns: Mapping[str, Callable[[], float]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run every callable of ``fns`` once per round for ``rounds`` rounds, rotating the
    order each round (so none is always first), after ``warmup`` unrecorded rounds.
    Returns the measurements by name."""
    names = list(fns)
    out: dict[str, list[float]] = {k: [] for k in names}
    for w in range(warmup + rounds):
        k = w % len(names)
        for name in names[k:] + names[:k]:
            v = fns[name]()
            if w >= warmup:
                out[name].append(v)
    return out


class CommandFailed(RuntimeError):
    """A timed command exited non-zero or ran past its timeout (message: argv and tail)."""


def concurrent_window(next_samples: Callable[[], int], spec: Mapping[str, Any], out: Path) -> None:
    """One of ``spec["barrier"]`` processes measuring concurrently (the streaming benchmarks'
    standalone side): ``spec["warmup_s"]`` seconds of ``next_samples()`` (one element; returns its
    samples), a file barrier with the others in ``spec["workdir"]`` (``<tag>.ready.<index>``),
    ``spec["measure_s"]`` seconds counted, ``{"samples_per_sec", "samples", "window_s"}`` written
    to ``out``, then on until every process has measured (so each window sees the full load).
    A barrier not met within 120 s is passed."""
    wd, tag, index, barrier = Path(spec["workdir"]), spec["tag"], spec["index"], spec["barrier"]
    t_end = time.monotonic() + spec["warmup_s"]
    n = 0
    while time.monotonic() < t_end or n < 2:
        next_samples()
        n += 1
    (wd / f"{tag}.ready.{index}").touch()
    deadline = time.monotonic() + 120
    while len(list(wd.glob(f"{tag}.ready.*"))) < barrier and time.monotonic() < deadline:
        next_samples()
    samples = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < spec["measure_s"]:
        samples += next_samples()
    dt = time.monotonic() - t0
    (wd / f"{tag}.done.{index}").touch()
    atomic.write_json(out, {"samples_per_sec": samples / dt, "samples": samples, "window_s": dt}, indent=None)
    deadline = time.monotonic() + 120
    while len(list(wd.glob(f"{tag}.done.*"))) < barrier and time.monotonic() < deadline:
        next_samples()


def time_command(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120.0,
                 cwd: str | None = None, check: bool = True) -> float:
    """Wall time (seconds, ``time.perf_counter``) of running ``argv`` to completion, its
    output discarded. Raises :class:`CommandFailed` on a non-zero exit (with ``check``) or a
    timeout (the process group gets SIGINT twice — an srun cancels its step — then
    SIGKILL)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process_group(proc)
        raise CommandFailed(f"{' '.join(argv[:3])} ...: no exit within {timeout:.0f} s") from None
    dt = time.perf_counter() - t0
    if check and proc.returncode != 0:
        tail = (err or b"").decode(errors="replace").strip().splitlines()[-3:]
        raise CommandFailed(f"{' '.join(argv[:3])} ... exited {proc.returncode}: {' | '.join(tail)}")
    return dt


def run_analyzer(run_py: Path, args: Sequence[str], budget_s: float, out: Path, env: Mapping[str, str],
                 timeout_s: float) -> tuple[float, dict]:
    """Run ``cs_input_analyzer --no-run-command --no-progress --time-budget BUDGET --output OUT
    python RUN_PY ARGS`` from the repository root, as a user runs it on the cluster of
    ``env``. Returns ``(wall seconds, report.json)``. Raises ``RuntimeError`` when it ran past
    ``timeout_s`` seconds (it is stopped) or made no recommendation (the report's error or the
    output's last lines)."""
    cmd = [console_script("cs_input_analyzer"), "--no-run-command", "--no-progress", "--time-budget",
           f"{budget_s:g}", "--output", str(out), "python", str(run_py), *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(proc)
        raise RuntimeError(f"cs_input_analyzer ran past {timeout_s:.0f} s") from None
    wall = time.perf_counter() - t0
    try:
        rep = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        rep = {}
    if not rep.get("recommendation"):
        tail = " | ".join((text or b"").decode(errors="replace").strip().splitlines()[-4:])
        raise RuntimeError(f"cs_input_analyzer exited {proc.returncode} without a recommendation "
                           f"({rep.get('error') or tail[:400]})")
    return wall, rep


def digits_params(root: Path, train_input: Mapping[str, Any] | None = None,
                  runconfig: Mapping[str, Any] | None = None, model: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> Path:
    """``root/params.yaml``: the digits example's params reading its data prepared under
    ``root/data`` (once, ``prepare_data.py`` run with ``env``), with ``train_input`` (e.g.
    ``pace_ms`` of tests/fixtures/paced/run.py), ``model`` and ``runconfig`` updated; returns
    its path. Raises ``CalledProcessError`` when the data cannot be prepared."""
    data = root / "data"
    if not data.exists():
        subprocess.run([sys.executable, str(REPO / "examples/digits/prepare_data.py"), "--out-dir", str(data)],
                       check=True, capture_output=True, env=dict(env) if env is not None else None)
    params = yaml.safe_load((REPO / "examples/digits/configs/params.yaml").read_text())
    params["train_input"].update(data_dir=str(data), **(train_input or {}))
    params["eval_input"]["data_dir"] = str(data)
    if model:
        params.setdefault("model", {}).update(model)
    params["runconfig"].update(runconfig or {})
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


#: The examples' prepared data (git-ignored): the files whose presence says it is there.
EXAMPLE_DATA = {"digits": "manifest.json", "images": "train-*.tfrecord", "digits_pt": "digits-*.npz"}


def ensure_example_data(names: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """Prepare ``examples/<name>/data`` (``prepare_data.py``) for each example in ``names``
    whose data is missing, as a fresh checkout has none. Raises ``CalledProcessError``."""
    for name in names:
        if not any((REPO / "examples" / name / "data").glob(EXAMPLE_DATA[name])):
            subprocess.run([sys.executable, str(REPO / "examples" / name / "prepare_data.py")], check=True,
                           capture_output=True, timeout=600, env=dict(env) if env is not None else None,
                           cwd=str(REPO))



# --------------------------------------------------------------------------- metadata
def read_topology(path: Path = TOPOLOGY) -> dict:
    """``slurm-test-cluster/run/etc/topology`` (``KEY=VALUE`` lines: ``PINNED``,
    ``NODE_CPUS``, ``HOST_CPUS``, ``NODES``) as a dict of ints/strings; ``{}`` if absent."""
    out: dict[str, Any] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Z_]+)\s*=\s*(\S*)\s*$", line)
        if m:
            v = m.group(2)
            out[m.group(1).lower()] = int(v) if v.isdigit() else v
    return out


def _version(dist: str) -> str | None:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def metadata(quick: bool) -> dict:
    """The common metadata of every result file: the machine's cores (``os.cpu_count``,
    the usable set), the test cluster's topology (nodes, CPUs per node, whether nodes are
    pinned to disjoint cores), versions (Python, TensorFlow, NumPy, Slurm), the date, the
    load average, the git commit and the quick flag. TensorFlow is not imported (its
    version comes from the package metadata)."""
    topo = read_topology()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        usable = None
    tf = _version("tensorflow-cpu") or _version("tensorflow")
    commit = None
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=str(REPO))
        commit = out.stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=str(REPO)).stdout.strip()
        if commit and dirty:
            commit += "+dirty"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": bool(quick),
        "host_cores": os.cpu_count(),
        "host_cores_usable": usable,
        "cluster": {"nodes": topo.get("nodes"), "node_cpus": topo.get("node_cpus"),
                    "host_cpus": topo.get("host_cpus"), "pinned": bool(topo.get("pinned", 0)),
                    "topology_file": str(TOPOLOGY) if topo else None},
        "pinned": bool(topo.get("pinned", 0)),
        "versions": {"python": platform.python_version(), "tensorflow": tf, "numpy": _version("numpy"),
                     "slurm": slurm.version(), "csrun": _version("csrun")},
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": commit,
    }


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically (temp file + rename)."""
    atomic.write_text(path, json.dumps(obj, indent=1, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    if hasattr(o, "item"):
        return o.item()
    return str(o)
