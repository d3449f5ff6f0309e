"""The throughput model of one node, fitted to probe tables (pure: pandas and numpy).

A *probe* ran ``T`` processes on one node, each held to ``C`` CPUs, each iterating the
user's ``input_fn`` dataset; its row in the probe table holds the node's total rate
(``samples_per_sec``, the sum of the ``T`` processes' samples/s over the same measured
window), the CPU cores the processes used and the CPU-seconds spent per sample.

The model of a node with ``n`` CPUs (``n = node_cpus``)::

    task_rate(C)   = r1 / ((1 - p) + p / C_eff)            Amdahl's law per task
    node_rate(T,C) = min( T * task_rate(C) / (1 + sigma * (T - 1)),   tasks in parallel
                          n / k,                                      the node's CPU budget
                          io_cap )                                    a measured plateau

with ``C_eff = min(C, n / T)`` (an oversubscribed node time-shares its cores) and

* ``r1`` — samples/s of one task on one CPU,
* ``p``  — the parallel fraction of a task's work (0: a serial pipeline, e.g. a GIL-bound
  ``tf.py_function`` or a sequential source; 1: perfectly parallel map),
* ``sigma`` — contention between the tasks of a node (memory bandwidth, a shared disk),
* ``k``  — CPU-seconds per sample (measured with psutil, the median over the probes),
* ``io_cap`` — a node-level ceiling (samples/s) where throughput stops growing while the
  CPUs are not busy (``inf`` when the data shows none).

``r1``, ``p``, ``sigma`` and ``io_cap`` are fitted by least squares on log throughput over a
grid (``p`` step 0.02), ``r1`` in closed form per grid point. Predictions prefer measured
means: where a layout was probed its mean is the prediction and the model only fills the
layouts that were not.

Probe table columns used here (see :data:`PROBE_COLUMNS`): ``kind`` (``pipeline`` or
``ingest``), ``status`` (``ok`` rows only), ``tasks``, ``cpus_per_task``, ``node_cpus``,
``samples_per_sec``, ``cpu_cores_used``, ``cpu_seconds_per_sample``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: Columns of a probe table (CSV) in order. Rates are samples/s summed over the probe's
#: tasks; byte rates are bytes/s; times are seconds.
PROBE_COLUMNS = [
    "probe_id", "kind", "tasks", "cpus_per_task", "node_cpus", "node", "status", "error",
    "samples_per_sec", "task_rate_min", "task_rate_max", "cpu_cores_used", "cpu_util",
    "cpu_seconds_per_sample", "read_bytes_per_sec", "disk_read_bytes_per_sec",
    "element_bytes_per_sec", "window_s", "warmup_s", "first_element_s", "elapsed_s",
    "started_at", "other_cores_busy", "contended", "samples_per_element",
    "chief_cpu_seconds_per_sample", "worker_cpu_seconds_per_sample", "worker_local_cpu_seconds_per_sample",
    "chief_apart", "dataloader_workers",
]

#: Prior cost of the tf.data service hop (both ends, CPU-seconds) when no ingest probe ran:
#: per element and per byte of element, from the ingest probes of the examples measured here
#: (digits: ~1.1 ms per 64-sample element of 17 KB; images: ~11 ms per 6.3 MB element).
HOP_ELEMENT_S = 1.0e-3
HOP_BYTE_S = 1.6e-9

#: Bottleneck classes reported by :func:`classify`.
CPU_PARALLEL, SERIAL, IO_BOUND = "CPU-parallel", "serial", "I/O/latency-bound"

_P_GRID = np.linspace(0.0, 1.0, 51)
_SIGMA_GRID = np.array([0.0, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5])
MIN_REL_SPREAD = 0.03


class ModelError(ValueError):
    """The probe table cannot support a fit (no successful pipeline probe)."""


@dataclass
class NodeModel:
    """A fitted per-node throughput model (see the module docstring for the formula).

    All rates are samples/s; ``k`` is CPU-seconds per sample; ``rel_spread`` is the relative
    standard deviation of a measurement (pooled over repeated probes, or the fit's residual
    when nothing was repeated), ``resid_rms`` the fit's RMS residual of ``log(rate)``.
    ``measured`` maps ``"TxC"`` to ``{"mean", "std", "count", "cpu_util"}`` of the probes.
    """

    node_cpus: int
    r1: float
    p: float
    sigma: float
    k: float
    io_cap: float = math.inf
    rel_spread: float = MIN_REL_SPREAD
    resid_rms: float = 0.0
    n_probes: int = 0
    measured: dict[str, dict[str, float]] = field(default_factory=dict)

    # -- model -----------------------------------------------------------------------
    def task_rate(self, cpus: float, tasks: int = 1) -> float:
        """Model rate (samples/s) of one task with ``cpus`` CPUs among ``tasks`` on the node."""
        c_eff = min(float(cpus), max(self.node_cpus / max(tasks, 1), 1.0))
        return self.r1 / ((1.0 - self.p) + self.p / c_eff)

    def model_rate(self, tasks: int, cpus: int) -> float:
        """Model node rate (samples/s) with ``tasks`` tasks × ``cpus`` CPUs (no measurement)."""
        par = tasks * self.task_rate(cpus, tasks) / (1.0 + self.sigma * (tasks - 1))
        cap = self.node_cpus / self.k if self.k > 0 else math.inf
        return float(min(par, cap, self.io_cap))

    # -- predictions ----------------------------------------------------------------------
    def node_rate(self, tasks: int, cpus: int) -> float:
        """Predicted node rate (samples/s): the measured mean where probed, else the model."""
        m = self.measured.get(f"{tasks}x{cpus}")
        if m and m.get("count", 0) >= 1:
            return float(m["mean"])
        return self.model_rate(tasks, cpus)

    def node_rel_spread(self, tasks: int, cpus: int) -> float:
        """Relative standard deviation (fraction) of :meth:`node_rate` at ``tasks × cpus``."""
        m = self.measured.get(f"{tasks}x{cpus}")
        if m and m.get("count", 0) >= 2 and m["mean"] > 0:
            return max(self.rel_spread, float(m["std"]) / float(m["mean"]))
        if m and m.get("count", 0) >= 1:
            return self.rel_spread
        return math.hypot(self.rel_spread, math.expm1(self.resid_rms))

    def cores_used(self, tasks: int, cpus: int) -> float:
        """CPU cores the node's tasks keep busy at ``tasks × cpus`` (measured, else rate × k)."""
        m = self.measured.get(f"{tasks}x{cpus}")
        if m and not math.isnan(m.get("cores_used", math.nan)):
            return float(m["cores_used"])
        return min(self.node_rate(tasks, cpus) * self.k, float(tasks * cpus))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``io_cap`` ``inf`` becomes ``None``)."""
        d = asdict(self)
        d["io_cap"] = None if math.isinf(self.io_cap) else self.io_cap
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeModel:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["io_cap"] = math.inf if d.get("io_cap") is None else float(d["io_cap"])
        return cls(**d)


def _ok_pipeline(probes: pd.DataFrame) -> pd.DataFrame:
    if probes is None or len(probes) == 0:
        return pd.DataFrame(columns=PROBE_COLUMNS)
    df = probes
    if "kind" in df:
        df = df[df["kind"].fillna("pipeline") == "pipeline"]
    if "status" in df:
        df = df[df["status"] == "ok"]
    df = df[pd.to_numeric(df["samples_per_sec"], errors="coerce") > 0].copy()
    return _drop_contended(df)


def _contended(df: pd.DataFrame) -> pd.Series:
    """Per row: True where ``contended`` says other processes disturbed the probe (a bool,
    or ``"True"``/``1`` read back from probes.csv); False where absent or NaN."""
    if "contended" not in df:
        return pd.Series(False, index=df.index)
    return df["contended"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0")).astype(bool)


def _drop_contended(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without its probes disturbed by other processes on a shared host where the
    same layout (``tasks``, ``cpus_per_task``) also has an undisturbed probe."""
    if "contended" not in df or not len(df):
        return df
    bad = _contended(df)
    key = list(zip(df["tasks"], df["cpus_per_task"], strict=True))
    clean = {k for k, b in zip(key, bad, strict=True) if not b}
    keep = [(not b) or (k not in clean) for k, b in zip(key, bad, strict=True)]
    return df[keep]


def aggregate(probes: pd.DataFrame) -> pd.DataFrame:
    """Per-layout summary of the successful pipeline probes.

    Returns one row per ``(tasks, cpus_per_task)`` with ``mean``, ``std`` (0 for one probe),
    ``count``, ``min``, ``max`` of ``samples_per_sec``, the means of ``cpu_cores_used``,
    ``cpu_util``, ``cpu_seconds_per_sample`` and ``other_cores_busy`` (NaN when not
    recorded), and ``contended`` (True when every probe behind the mean was disturbed by
    other processes); sorted by tasks, then CPUs.
    """
    df = _ok_pipeline(probes)
    cols = ["tasks", "cpus_per_task", "mean", "std", "count", "min", "max",
            "cpu_cores_used", "cpu_util", "cpu_seconds_per_sample", "other_cores_busy", "contended"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.assign(contended=_contended(df))
    for c in ("cpu_cores_used", "cpu_util", "cpu_seconds_per_sample", "other_cores_busy"):
        if c not in df:
            df[c] = np.nan
        df[c] = pd.to_numeric(df[c], errors="coerce")
    g = df.groupby(["tasks", "cpus_per_task"], as_index=False).agg(
        mean=("samples_per_sec", "mean"), std=("samples_per_sec", "std"),
        count=("samples_per_sec", "size"), min=("samples_per_sec", "min"),
        max=("samples_per_sec", "max"), cpu_cores_used=("cpu_cores_used", "mean"),
        cpu_util=("cpu_util", "mean"), cpu_seconds_per_sample=("cpu_seconds_per_sample", "mean"),
        other_cores_busy=("other_cores_busy", "mean"), contended=("contended", "all"))
    g["std"] = g["std"].fillna(0.0)
    g[["tasks", "cpus_per_task", "count"]] = g[["tasks", "cpus_per_task", "count"]].astype(int)
    return g.sort_values(["tasks", "cpus_per_task"]).reset_index(drop=True)[cols]


def _predict_grid(T: np.ndarray, C: np.ndarray, n: int, r1: np.ndarray, p: float,
                  sigma: float, cap: float) -> np.ndarray:
    c_eff = np.minimum(C, np.maximum(n / T, 1.0))
    par = T * r1 / ((1.0 - p) + p / c_eff) / (1.0 + sigma * (T - 1))
    return np.minimum(par, cap)


def _grid_fit(df: pd.DataFrame, n: int, k: float, io_caps: list[float]) -> tuple[float, float, float, float, float]:
    """Least squares on log rate over the (p, sigma, io_cap) grid; r1 in closed form.

    Returns ``(sse, r1, p, sigma, io_cap)`` of the least penalised cost."""
    T = df["tasks"].to_numpy(float)
    C = df["cpus_per_task"].to_numpy(float)
    y = np.log(df["samples_per_sec"].to_numpy(float))
    cpu_cap = n / k if k > 0 else math.inf
    inside = T * C <= n + 1e-9
    if not inside.any():
        inside = np.ones_like(T, dtype=bool)
    lam_sigma = 0.02 * len(y)  # keeps sigma at 0 unless the data ask for it
    best: tuple[float, float, float, float, float, float] | None = None
    for io in io_caps:
        cap = min(cpu_cap, io)
        for sigma in _SIGMA_GRID:
            for p in _P_GRID:
                g = _predict_grid(T, C, n, np.ones_like(T), p, sigma, math.inf)
                log_r1 = float(np.mean(y[inside] - np.log(g[inside])))
                pred = _predict_grid(T, C, n, np.full_like(T, math.exp(log_r1)), p, sigma, cap)
                sse = float(np.sum((y - np.log(pred)) ** 2))
                cost = sse + lam_sigma * sigma * sigma
                if best is None or cost < best[0] - 1e-12:
                    best = (cost, sse, math.exp(log_r1), float(p), float(sigma), io)
    assert best is not None
    return best[1:]


def fit(probes: pd.DataFrame, node_cpus: int | None = None) -> NodeModel:
    """Fit :class:`NodeModel` to a probe table.

    ``probes``: a DataFrame with :data:`PROBE_COLUMNS` (failed and ``ingest`` rows are
    ignored). ``node_cpus``: CPUs of the probed node (default: the table's ``node_cpus``).
    A finite ``io_cap`` is kept only when it removes at least 20 % of the squared error
    and the probes near it kept under 75 % of their CPUs busy.
    Raises :class:`ModelError` when there is no successful pipeline probe.
    """
    df = _ok_pipeline(probes)
    if df.empty:
        raise ModelError("no successful probe of the input pipeline to fit")
    n = int(node_cpus if node_cpus is not None else df["node_cpus"].max())
    kk = pd.to_numeric(df["cpu_seconds_per_sample"], errors="coerce").dropna() \
        if "cpu_seconds_per_sample" in df else pd.Series(dtype=float)
    kk = kk[kk > 0]
    k = float(kk.median()) if len(kk) else 0.0

    sse, r1, p, sigma, io = _grid_fit(df, n, k, [math.inf])
    rates = sorted(set(df["samples_per_sec"].astype(float)))
    if len(df) >= 4:
        sse_io, r1_io, p_io, sigma_io, io_io = _grid_fit(df, n, k, rates[-2:])
        near = df[df["samples_per_sec"] >= 0.9 * io_io]
        util = pd.to_numeric(near["cpu_util"], errors="coerce").mean() if "cpu_util" in near else math.nan
        if sse_io < 0.8 * sse and (math.isnan(util) or util < 0.75):
            sse, r1, p, sigma, io = sse_io, r1_io, p_io, sigma_io, io_io
    resid_rms = math.sqrt(sse / len(df))
    return NodeModel(node_cpus=n, r1=r1, p=p, sigma=sigma, k=k, io_cap=io,
                     rel_spread=_rel_spread(df, resid_rms), resid_rms=resid_rms,
                     n_probes=int(len(df)), measured=_measured(df))


def _measured(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (t, c), g in df.groupby(["tasks", "cpus_per_task"]):
        v = g["samples_per_sec"].to_numpy(float)
        cores = pd.to_numeric(g.get("cpu_cores_used"), errors="coerce")
        util = pd.to_numeric(g.get("cpu_util"), errors="coerce")
        out[f"{int(t)}x{int(c)}"] = {
            "mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "count": int(len(v)), "min": float(v.min()), "max": float(v.max()),
            "cores_used": float(cores.mean()) if cores.notna().any() else math.nan,
            "cpu_util": float(util.mean()) if util.notna().any() else math.nan,
        }
    return out


def _rel_spread(df: pd.DataFrame, resid_rms: float) -> float:
    """Pooled relative standard deviation of repeated probes (fraction), floored at 3 %;
    the fit's residual when no layout was probed twice."""
    num = den = 0.0
    for _, g in df.groupby(["tasks", "cpus_per_task"]):
        v = g["samples_per_sec"].to_numpy(float)
        if len(v) >= 2 and v.mean() > 0:
            num += (len(v) - 1) * (v.std(ddof=1) / v.mean()) ** 2
            den += len(v) - 1
    if den > 0:
        return max(MIN_REL_SPREAD, math.sqrt(num / den))
    return max(MIN_REL_SPREAD, math.expm1(resid_rms))


def ingest_limits(probes: pd.DataFrame, prior: bool = True) -> dict[str, Any]:
    """What the chief's ingest costs, from the ``ingest`` and ``served`` probes (TensorFlow:
    the tf.data service; PyTorch: ``served`` probes over csrun's data plane, no ingest probe,
    and ``prior=False``: the tf.data service prior does not apply).

    Returns a dict:

    * ``samples_per_sec`` — samples/s the chief took from service workers serving cached
      elements (the ingest probe), ``None`` when not measured;
    * ``cpu_bound`` — the ingest probe kept its node's CPUs busy (≥ 85 %): its rate is then
      a CPU limit of the node it ran on, which :func:`analyzer.recommend.predict_layout`
      replaces by the chief's own CPU budget; otherwise (latency, the GIL) a fixed cap;
    * ``cpu_seconds_per_sample`` — the service hop's CPU-seconds per sample on both ends
      (ingest probe, else a prior from the element size: :data:`HOP_ELEMENT_S`,
      :data:`HOP_BYTE_S`);
    * ``chief_cpu_seconds_per_sample`` — the chief's CPU-seconds per sample taking the
      stream (the served probe's chief process, else the ingest probe's), ``None`` unknown;
    * ``worker_hop_cpu_seconds_per_sample`` — what serving adds to an input worker's
      CPU-seconds per sample: per served probe, its worker's CPU per sample serving minus
      the same worker's iterating the pipeline in-process just before
      (``worker_local_cpu_seconds_per_sample``; else the pipeline probes' median at ``1 × C``),
      the median over the served probes, floored at 0; ``None`` without a served probe;
    * ``served_samples_per_sec`` — the served probes' median delivered rate (one input
      worker to the chief; not a cap: the chief's CPU-seconds per sample cap it), ``None``
      without a served probe;
    * ``source`` — where the figures come from.
    """
    out: dict[str, Any] = {"samples_per_sec": None, "cpu_bound": False, "cpu_seconds_per_sample": None,
                           "chief_cpu_seconds_per_sample": None, "worker_hop_cpu_seconds_per_sample": None,
                           "served_samples_per_sec": None, "source": "none"}
    if probes is None or len(probes) == 0 or "kind" not in probes:
        return out
    ok = probes[probes["status"] == "ok"]
    # a disturbed ingest or served probe counts only where no undisturbed one of its kind ran
    bad = _contended(ok)
    clean_kinds = set(ok.loc[~bad, "kind"])
    ok = ok[~(bad & ok["kind"].isin(clean_kinds) & ok["kind"].isin(["ingest", "served"]))]
    ing = ok[ok["kind"] == "ingest"]
    srv = ok[ok["kind"] == "served"]
    sources = []
    if len(ing):
        out.update(_ingest_probe_figures(ing))
        sources.append("ingest probe")
    elif prior:
        prior_hop = _hop_prior(probes)
        if prior_hop:
            out["cpu_seconds_per_sample"] = prior_hop["cpu_seconds_per_sample"]
            sources.append(prior_hop["source"])
    if len(srv):
        out.update({k: v for k, v in _served_figures(srv, probes).items()
                    if v is not None or k != "chief_cpu_seconds_per_sample"})
        sources.append("served probe")
    out["source"] = ", ".join(sources) or "none"
    return out


def _median(df: pd.DataFrame, col: str) -> float | None:
    """The median of ``df[col]`` read as numbers, ``None`` without the column or a number."""
    if col not in df:
        return None
    v = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(v.median()) if len(v) else None


def _ingest_probe_figures(ing: pd.DataFrame) -> dict[str, Any]:
    """:func:`ingest_limits`'s figures from the successful ``ingest`` probes ``ing``: the
    rate, whether it was CPU-bound (≥ 85 % of the node's CPUs), the hop's and the chief's
    CPU-seconds per sample (medians)."""
    util = _median(ing, "cpu_util")
    return {"samples_per_sec": float(ing["samples_per_sec"].median()),
            "cpu_bound": util is not None and util >= 0.85,
            "cpu_seconds_per_sample": _median(ing, "cpu_seconds_per_sample"),
            "chief_cpu_seconds_per_sample": _median(ing, "chief_cpu_seconds_per_sample")}


def _served_figures(srv: pd.DataFrame, probes: pd.DataFrame) -> dict[str, Any]:
    """:func:`ingest_limits`'s figures from the successful ``served`` probes ``srv``: the
    delivered rate, the chief's CPU-seconds per sample (``None``: unknown, the ingest probe's
    kept) and what serving adds to an input worker's (its CPU per sample serving minus the
    same worker's in-process just before, else the pipeline probes' median at ``1 × C``;
    the median, floored at 0; ``None`` when unknown)."""
    out: dict[str, Any] = {"served_samples_per_sec": _median(srv, "samples_per_sec"),
                           "chief_cpu_seconds_per_sample": _median(srv, "chief_cpu_seconds_per_sample")}
    pipe = _ok_pipeline(probes)
    cpus = int(srv["cpus_per_task"].iloc[0])
    kp = _median(pipe[(pipe["tasks"] == 1) & (pipe["cpus_per_task"] == cpus)], "cpu_seconds_per_sample")
    kw = pd.to_numeric(srv["worker_cpu_seconds_per_sample"], errors="coerce") \
        if "worker_cpu_seconds_per_sample" in srv else None
    kl = pd.to_numeric(srv["worker_local_cpu_seconds_per_sample"], errors="coerce") \
        if "worker_local_cpu_seconds_per_sample" in srv else pd.Series(math.nan, index=srv.index)
    base = kl.fillna(kp if kp is not None else math.nan)
    hop = (kw - base).dropna() if kw is not None else pd.Series(dtype=float)
    if len(hop):
        out["worker_hop_cpu_seconds_per_sample"] = max(0.0, float(hop.median()))
    return out


def _hop_prior(probes: pd.DataFrame) -> dict | None:
    """``cpu_seconds_per_sample`` of the service hop from :data:`HOP_ELEMENT_S` and
    :data:`HOP_BYTE_S` and the pipeline probes' element size, when no ingest probe ran."""
    df = _ok_pipeline(probes)
    if df.empty or "samples_per_element" not in df or "element_bytes_per_sec" not in df:
        return None
    spe = pd.to_numeric(df["samples_per_element"], errors="coerce")
    bps = pd.to_numeric(df["element_bytes_per_sec"], errors="coerce") / pd.to_numeric(df["samples_per_sec"])
    spe, bps = spe.median(), bps.median()
    if not (spe > 0) or not (bps >= 0):
        return None
    k = (HOP_ELEMENT_S + HOP_BYTE_S * bps * spe) / spe
    return {"samples_per_sec": None, "cpu_seconds_per_sample": float(k),
            "source": "prior (no ingest probe): per-element and per-byte costs of the service hop"}


def _rate(model: NodeModel, agg: pd.DataFrame, t: int, c: int) -> tuple[float, bool]:
    row = agg[(agg["tasks"] == t) & (agg["cpus_per_task"] == c)]
    if len(row):
        return float(row["mean"].iloc[0]), True
    return model.model_rate(t, c), False


def _agg_value(agg: pd.DataFrame, t: int, c: int, col: str) -> Any:
    """Column ``col`` of layout ``t × c`` in :func:`aggregate`'s table; ``None`` when the
    layout was not probed or the value is NaN."""
    row = agg[(agg["tasks"] == t) & (agg["cpus_per_task"] == c)]
    if not len(row) or col not in row or pd.isna(row[col].iloc[0]):
        return None
    return row[col].iloc[0]


def capped_speedup(speedup: float, added: float, what: str) -> tuple[float, str]:
    """``(min(speedup, added), clause)``: ``added`` the factor of resources added, ``what`` their
    name ("CPUs", "tasks"); ``clause`` says when it capped (else ``""``; NaN as is). Rule:
    docs/ANALYZER.md "Evidence never exceeds the resources added"."""
    if not math.isfinite(speedup) or speedup <= added * (1 + 1e-9):
        return speedup, ""
    return added, (f" (capped: ×{speedup:.2f} was measured with ×{added:g} the {what}, a speed-up larger "
                   f"than the resources added: a disturbed measurement)")


def _oversubscribed(agg: pd.DataFrame, n: int, n_one: float) -> tuple[int, float | None, str]:
    """The most oversubscribed ``T×1`` probe (``T > n``): ``(T, its speed-up over n×1
    capped at T/n, the cap's clause)``; ``(0, None, "")`` when none was probed."""
    over = agg[(agg["cpus_per_task"] == 1) & (agg["tasks"] > n)]
    if not len(over) or not n_one > 0:
        return 0, None, ""
    top = over.sort_values("tasks").iloc[-1]
    t = int(top["tasks"])
    speedup, clause = capped_speedup(float(top["mean"]) / n_one, t / n, "tasks")
    return t, speedup, clause


def _bottleneck_class(n: int, cpu_speedup: float, task_speedup: float, over_speedup: float | None,
                      util_all: float | None, idle_all: float | None) -> tuple[str, str]:
    """The class (:data:`CPU_PARALLEL`, :data:`SERIAL`, :data:`IO_BOUND`) from the capped
    speed-ups and the ``n×1`` probes' CPU use, and the sentence saying why."""
    io_like = (over_speedup is not None and over_speedup >= 1.2 and (util_all is None or util_all < 0.7)
               and (idle_all is None or idle_all > 0.2)) \
        or (util_all is not None and util_all < 0.45 and idle_all is not None and idle_all > 0.4)
    ideal = 1.0 + 0.5 * (n - 1)  # half of linear CPU scaling
    if io_like:
        return IO_BOUND, ("throughput grows past the core count while the CPUs are not busy: "
                          "the tasks wait on I/O or latency; more tasks per node (and more nodes) help")
    if n > 1 and cpu_speedup < ideal and task_speedup >= 1.3 * cpu_speedup:
        return SERIAL, ("more CPUs per task do not help but more tasks do: a serial stage "
                        "(a GIL-bound py_function, a sequential source) limits each task; use 1 CPU per task")
    return CPU_PARALLEL, "throughput scales with CPUs per task: the pipeline's map stages use the cores"


def classify(probes: pd.DataFrame, model: NodeModel) -> dict[str, Any]:
    """Bottleneck class of the input pipeline, with its evidence.

    Returns ``{"class": one of CPU_PARALLEL | SERIAL | IO_BOUND, "evidence": [str, ...],
    "cpu_speedup", "task_speedup", "oversubscribed_speedup" (None if not probed),
    "cpu_util_all_tasks", "cpu_util_one_task", "disturbed"}`` where the speedups compare node
    rates: ``1×n`` over ``1×1`` (more CPUs per task), ``n×1`` over ``1×1`` (more tasks) and
    the most oversubscribed ``T×1`` (``T > n``) over ``n×1``, each capped at the resources
    added (:func:`capped_speedup`). Measured values are used where probed, the model
    elsewhere (the evidence says which). ``disturbed`` is True when a speed-up was capped or
    a bracket (``1×1``, ``1×n``, ``n×1``) was measured only while other processes kept the
    node's CPUs busy (the evidence says so: the class may then be wrong).
    """
    agg = aggregate(probes)
    n = model.node_cpus
    base, base_m = _rate(model, agg, 1, 1)
    one_n, one_n_m = _rate(model, agg, 1, n)
    n_one, n_one_m = _rate(model, agg, n, 1)
    cpu_speedup, cpu_cap = capped_speedup(one_n / base if base > 0 else math.nan, n, "CPUs")
    task_speedup, task_cap = capped_speedup(n_one / base if base > 0 else math.nan, n, "tasks")
    over_tasks, over_speedup, over_cap = _oversubscribed(agg, n, n_one)
    util_all = _agg_value(agg, n, 1, "cpu_util")
    # Idle share of the host during the n x 1 probes: low use of the CPUs only means
    # I/O or latency when the CPUs were free (not taken by other processes).
    other = float(_agg_value(agg, n, 1, "other_cores_busy") or 0.0)
    idle_all = None if util_all is None else max(0.0, 1.0 - util_all - other / max(n, 1))
    util_one = _agg_value(agg, 1, n, "cpu_util")

    src = lambda m: "measured" if m else "model"  # noqa: E731
    ev = [
        f"1 task: {base:.0f} samples/s on 1 CPU ({src(base_m)}), {one_n:.0f} on {n} CPUs "
        f"({src(one_n_m)}): ×{cpu_speedup:.2f} from more CPUs per task{cpu_cap} "
        f"(fitted parallel fraction p = {model.p:.2f})",
        f"{n} tasks × 1 CPU: {n_one:.0f} samples/s ({src(n_one_m)}): ×{task_speedup:.2f} from more tasks"
        + task_cap,
    ]
    if util_one is not None:
        ev.append(f"1 task × {n} CPUs keeps {util_one * 100:.0f} % of its CPUs busy")
    if util_all is not None:
        ev.append(f"{n} tasks × 1 CPU keep {util_all * 100:.0f} % of the node's CPUs busy")
    if over_speedup is not None:
        ev.append(f"{over_tasks} tasks on {n} CPUs (oversubscribed): ×{over_speedup:.2f} over {n} tasks{over_cap}")
    if other > 0.2 * n:
        ev.append(f"other processes kept {other:.2f} of the {n} CPUs busy during the {n} × 1 probes")
    shaky = [f"{t}×{c}" for t, c in dict.fromkeys([(1, 1), (1, n), (n, 1)]) if _agg_value(agg, t, c, "contended")]
    if shaky:
        ev.append(f"{', '.join(shaky)} measured only while other processes kept the node's CPUs busy "
                  "(see the warning at the top): this class may be wrong")
    cls, why = _bottleneck_class(n, cpu_speedup, task_speedup, over_speedup, util_all, idle_all)
    ev.append(why)
    return {"class": cls, "evidence": ev, "cpu_speedup": cpu_speedup, "task_speedup": task_speedup,
            "oversubscribed_speedup": over_speedup, "cpu_util_all_tasks": util_all,
            "cpu_util_one_task": util_one, "disturbed": bool(cpu_cap or task_cap or over_cap or shaky)}
