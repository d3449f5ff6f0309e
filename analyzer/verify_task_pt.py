"""``python -m analyzer.verify_task_pt [--seconds S] [--warmup W] [--dataloader-workers K] --out FILE
run.py ARGS...``: ``cs_input_analyzer verify``'s task for a PyTorch run.py, launched with
``csrun_wse ... python-pt`` on every task of the layout (the TensorFlow one:
:mod:`analyzer.verify_task`). Per role (:func:`csrun_common.roles.resolve_role`):

* an **input worker** runs exactly what a PyTorch training job's worker runs:
  :class:`csrun_runtime.pytorch.worker.InputWorker` (its DataLoader as streamer ``i`` of ``W``,
  streamed over the data plane) until the chief is done;
* the **chief** sets up what the PyTorch chief sets up for training — the rendezvous with its
  heartbeat, the CPU split and input worker 0 in its own task with ``CSRUN_CHIEF_INPUT_CPUS``
  (:class:`csrun_runtime.pytorch.own_input.OwnInput`), the data-plane receiver
  (:class:`csrun_runtime.pytorch.remote.RemoteSource`) — or, with no input worker, the
  in-process DataLoader (:func:`csrun_runtime.pytorch.worker.build_loader`, ``torch`` held to
  the task's CPUs); instead of training it only drains the stream
  (:func:`analyzer.verify_task.drain`), writes the result JSON, marks the job done and exits.

``--dataloader-workers K`` sets ``train_input.num_workers`` (the DataLoader's worker processes)
in every task: verify measures the count the report recommends for the layout, not the YAML's.
Result JSON: :mod:`analyzer.verify_task`'s (``job_cpu_cores_on_host`` counts the chief only).
No TensorFlow.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from csrun_common.roles import Role, RoleError
from csrun_runtime.params import Resolved
from csrun_runtime.pytorch.contract import batch_size_of
from csrun_runtime.rendezvous import Heartbeat, Rendezvous
from csrun_runtime.task import process_start_time

from .verify_task import _train_argv, _write, begin_drain, drain, failed_result

__all__ = ["main"]


class _Remote:
    """:class:`csrun_runtime.pytorch.remote.RemoteSource` with the ``get(timeout) -> (worker,
    batch)`` and ``counts`` that :func:`analyzer.verify_task.drain` reads (its own timeouts:
    ``runconfig``'s, raising ``InputStalled``)."""

    def __init__(self, remote: Any):
        self.remote = remote

    @property
    def counts(self) -> dict[int, int]:
        return self.remote.counts

    def get(self, timeout: float) -> tuple[int, Any]:
        nest, worker = self.remote.next()
        if nest is None:
            raise InterruptedError("stopped by a signal")
        return worker, nest


class _Local:
    """The chief's own DataLoader, pass after pass, as ``get(timeout) -> (0, batch)``."""

    def __init__(self, loader: Any):
        from csrun_runtime.pytorch.contract import epochs

        self.it = epochs(loader)

    def get(self, timeout: float) -> tuple[int, Any]:
        return 0, next(self.it)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m analyzer.verify_task_pt", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window (s) [20]")
    ap.add_argument("--warmup", type=float, default=5.0, help="drain this long (s) before measuring [5]")
    ap.add_argument("--dataloader-workers", type=int, default=None,
                    help="train_input.num_workers in every task [the params']")
    ap.add_argument("--out", default=None, help="result JSON (chief only) [stdout]")
    ap.add_argument("run_py")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). Returns the exit code: 0, 1 (failed), 2 (usage)."""
    t_proc = process_start_time()
    ns = _parse(argv)

    def adjust(resolved: Resolved, entry: Any) -> None:
        resolved.params = entry.params  # default_params_fn applied, as the runtime does
        if ns.dataloader_workers is not None:
            resolved.params["train_input"] = {**(resolved.params.get("train_input") or {}),
                                              "num_workers": int(ns.dataloader_workers)}

    started = begin_drain(ns.run_py, _train_argv(list(ns.args)), ns.out, adjust)
    if isinstance(started, int):
        return started
    role, entry, resolved = started
    if role.kind == "worker":
        from csrun_runtime.pytorch.worker import InputWorker

        return InputWorker(role, resolved, entry.input_fn).run()
    return _chief(ns, role, entry.input_fn, resolved, t_proc)


def _chief(ns: argparse.Namespace, role: Role, train_data_fn: Any, resolved: Resolved, t_proc: float) -> int:
    """The chief's part (module docstring); returns 0, or 1 when the drain failed (its error
    in the result)."""
    from csrun_runtime.pytorch.own_input import OwnInput
    from csrun_runtime.pytorch.remote import RemoteSource
    from csrun_runtime.pytorch.worker import build_loader

    rc = resolved.params["runconfig"]
    model_dir = Path(resolved.model_dir)
    own = OwnInput(role, os.environ)
    rdv: Rendezvous | None = None
    heartbeat: Heartbeat | None = None
    remote: Any = None
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        if role.num_input_workers > 0:
            if role.rendezvous_key is None:
                raise RoleError("SLURM_JOB_ID is required when CSRUN_NUM_WORKERS > 0")
            rdv = Rendezvous(model_dir, role.rendezvous_key)
            rdv.reset()
            heartbeat = Heartbeat(rdv, "chief").start()
            own.place()
            remote = RemoteSource(rdv, role, rc)
            own.start()
            source: Any = _Remote(remote)
        else:
            loader, _, _ = build_loader(train_data_fn, resolved.params, 0, 1, 0, threads=role.cpus_per_task or None)
            source = _Local(loader)
        res = drain(source, ns.warmup, ns.seconds, float(rc["worker_start_timeout_secs"]),
                    float(rc["input_timeout_secs"]), t_proc, [], samples_of=lambda b: batch_size_of(b) or 1)
        res.update(num_workers=role.num_input_workers, node=role.node, framework="pytorch",
                   dataloader_workers=(resolved.params.get("train_input") or {}).get("num_workers"),
                   **own.describe())
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported in the result
        res, code = failed_result(exc, role.num_input_workers), 1
    _write(ns.out, res)
    if rdv is not None:
        rdv.mark_done("ok" if code == 0 else "failed", "drain finished")
    if remote is not None:
        remote.close()
    own.stop()
    if heartbeat is not None:
        heartbeat.stop()
    print(f"drain: {json.dumps({k: res.get(k) for k in ('status', 'samples_per_sec', 'num_workers', 'error')})}",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # DataLoader worker processes and zmq threads must not hold the exit
