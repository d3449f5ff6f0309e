"""``python -m csrun_runtime.first_batch [--workers W] [--cpus C] [--report FILE] RUN_PY [ARGS...]``:
pull one batch of a run.py's training input on this host before the job is queued (issue 33
item 9; docs/CHECKS.md "One batch before queueing").

It loads ``RUN_PY`` in capture mode (:func:`csrun_runtime.capture.load_entry`: nothing trains),
builds input worker 0 of ``W``'s training input through the run.py's framework backend
(:func:`csrun_runtime.registry.entry` ``(framework, "input_backend").INPUT_BACKEND``, as the
analyzer's probes do) held to ``C`` CPUs, and takes ONE batch from it. Exit statuses:

- 0: a batch came, or there was nothing to check (a mode that does not train: ``eval``,
  ``validate_only``, ``compile_only``);
- 2: the user's input code raised (the data function, a Dataset, a map function, a collate
  function) or broke the input contract: the report holds the worker's lines (its type, message
  and the last frames in the user's code; the backend's ``describe_error``);
- 3: not checked: run.py could not be loaded here (an import this host cannot satisfy, bad
  params: the job reports those itself), or a package the data function imports is missing here.

The report (``--report FILE``, else stdout) is the first line and the indented frames. The
process leaves with ``os._exit`` after flushing: a tf.data or DataLoader thread must not hold it
at exit. Core module: TensorFlow or torch only through the registry's backend.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from csrun_common.modes import TRAIN_MODES

__all__ = ["EXIT_OK", "EXIT_USER_ERROR", "EXIT_NOT_CHECKED", "pull_one_batch", "main"]

EXIT_OK, EXIT_USER_ERROR, EXIT_NOT_CHECKED = 0, 2, 3


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


def pull_one_batch(run_py: str, argv: Sequence[str], num_input_workers: int = 1, cpus: int = 1) -> tuple[int, str]:
    """Load ``run_py`` with ``argv`` in capture mode and pull one batch of input worker 0 of
    ``num_input_workers``'s training input with ``cpus`` CPUs (>= 1).

    Returns:
        ``(status, text)``: :data:`EXIT_OK` and what was done; :data:`EXIT_USER_ERROR` and the
        lines naming the user's error; :data:`EXIT_NOT_CHECKED` and why nothing was checked.
    """
    from .capture import CaptureError, load_entry
    from .input_backend import InputBuildError
    from .params import ParamsError
    from .registry import entry, facts

    try:
        cap = load_entry(run_py, list(argv))
    except (CaptureError, ParamsError) as e:
        return EXIT_NOT_CHECKED, f"run.py not loaded here: {_one_line(str(e))}"
    if cap.mode not in TRAIN_MODES:
        return EXIT_OK, f"mode {cap.mode}: no training input to pull"
    what = facts(cap.framework).input_what  # as the framework's input workers name it
    try:
        module = entry(cap.framework, "input_backend")
    except ImportError as e:
        return EXIT_NOT_CHECKED, f"the {cap.framework} backend cannot load here: {_one_line(str(e))}"
    try:
        built = module.INPUT_BACKEND(cap.input_fn, cap.params).build(0, max(1, num_input_workers), max(1, cpus))
    except ImportError as e:
        return EXIT_NOT_CHECKED, f"a package is missing here: {_one_line(str(e))}"
    except InputBuildError as e:
        return EXIT_USER_ERROR, e.detail or str(e)
    except Exception as e:  # noqa: BLE001 - the user's data function raised: named with its frames
        return EXIT_USER_ERROR, module.describe_error(e, what)
    try:
        next(built.batches)
    except ImportError as e:
        return EXIT_NOT_CHECKED, f"a package is missing here: {_one_line(str(e))}"
    except Exception as e:  # noqa: BLE001 - the user's Dataset, map or collate function raised
        return EXIT_USER_ERROR, module.describe_error(e, what)
    finally:
        built.close()
    return EXIT_OK, f"one batch of input worker 0 of {num_input_workers} pulled"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m csrun_runtime.first_batch",
                                description="Pull one batch of a run.py's training input.")
    p.add_argument("--workers", type=int, default=1, help="the job's input-worker count W")
    p.add_argument("--cpus", type=int, default=1, help="CPUs of the input worker")
    p.add_argument("--report", default=None, help="write the result here (default: stdout)")
    p.add_argument("run_py")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    status, text = pull_one_batch(ns.run_py, ns.args, ns.workers, ns.cpus)
    if ns.report:
        from csrun_common.atomic import write_text

        write_text(ns.report, text + "\n")
    else:
        print(text)
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a tf.data / DataLoader thread must not hold the process at exit
