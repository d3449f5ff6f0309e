"""Where a relative data path of the params (``train_input.data_dir``, ``data_files`` ...) points:
the one rule of the launcher's pre-submission check (``launcher/preflight.py``) and the runtime
(``csrun_runtime/sharding.py``'s ``data_dir`` view), issue 33 item 10.

The rule is the job's: a task runs in the directory ``csrun_wse`` was launched from (srun and
sbatch keep the submitting directory, srun(1) ``--chdir``: "The default ... is the current
working directory of srun"), and a relative path given to ``open()``, ``glob`` or
``tf.data`` is taken from the working directory. So a relative path is the launch directory
joined with it; an absolute path and a URL (``gs://...``) are kept as they are; ``~`` is not
expanded (neither ``open()`` nor ``tf.io.gfile`` expands it). Pure; no TensorFlow, no torch.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

__all__ = ["resolve_data_path", "data_path_exists"]


def resolve_data_path(value: str, launch_dir: str | os.PathLike[str] | None = None) -> str:
    """``value`` as the job's tasks read it: joined to ``launch_dir`` (default: the current
    directory, which is the launch directory inside a task) when relative; unchanged when
    absolute or a URL. Returns a string (a glob stays a glob)."""
    if "://" in value or os.path.isabs(value):
        return value
    return os.path.join(os.fspath(Path.cwd() if launch_dir is None else launch_dir), value)


def data_path_exists(value: str, launch_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``value`` (a path or a glob), resolved by :func:`resolve_data_path`, names
    something. A URL counts as existing: it cannot be checked from here."""
    if "://" in value:
        return True
    path = resolve_data_path(value, launch_dir)
    if glob.has_magic(path):
        return bool(glob.glob(path))
    return os.path.exists(path)
