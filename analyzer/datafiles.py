"""Finding the data files: globs, directories, and a params YAML's ``train_input.data_dir``.

Pure standard library + PyYAML. Rules:

* a source is a file, a directory or a glob (``*``, ``?``, ``[``; ``**`` recursive);
* a directory contributes its regular, non-hidden files (not recursive): the
  ``*.tfrecord*``/``*.tfrecords`` ones when there are any (Model Zoo data directories
  hold metadata beside the records), otherwise all of them; ``pattern`` overrides;
* the result is de-duplicated (by real path) and sorted by path, so the same file set
  always yields the same list (the planner's ties are broken by this order);
* a params YAML (Model Zoo layout) gives ``train_input.data_dir`` (str or list of
  str); relative entries are taken from the current directory, or else from the YAML's
  directory when that is where they exist.
"""
from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["ParamsData", "expand_sources", "read_params", "is_glob"]

TFRECORD_PATTERNS = ("*.tfrecord", "*.tfrecord-*", "*.tfrecords", "*.tfrecord.*", "*.tfrec")


def is_glob(text: str) -> bool:
    """True when ``text`` contains a glob metacharacter (``*``, ``?``, ``[``)."""
    return any(c in text for c in "*?[")


def _dir_files(d: str, pattern: str | None) -> list[str]:
    names = []
    with os.scandir(d) as it:
        for e in it:
            if e.name.startswith(".") or not e.is_file():
                continue
            names.append(e.name)
    if pattern:
        chosen = [n for n in names if fnmatch.fnmatch(n, pattern)]
    else:
        chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in TFRECORD_PATTERNS)] or names
    return [os.path.join(d, n) for n in chosen]


def expand_sources(sources: Iterable[str], *, pattern: str | None = None,
                   what: str = "source") -> tuple[list[str], int]:
    """Expand files, directories and globs into a sorted list of absolute file paths.

    ``what`` names the source in errors (e.g. ``"--files"`` or
    ``"train_input.data_dir"``). Returns ``(paths, duplicates)``: the paths (sorted,
    de-duplicated by real path) and how many duplicates were dropped. Raises
    ``ValueError`` (one line, naming ``what`` and the value) when a source matches no
    file or does not exist.
    """
    seen: dict[str, str] = {}
    dups = 0
    for src in sources:
        src = os.path.expanduser(str(src))
        if is_glob(src):
            found = [h for h in glob.glob(src, recursive=True) if os.path.isfile(h)]
            if not found:
                raise ValueError(f"{what} {src!r}: matched no files")
        elif os.path.isdir(src):
            found = _dir_files(src, pattern)
            if not found:
                raise ValueError(f"{what} {src!r}: directory holds no data files")
        elif os.path.isfile(src):
            found = [src]
        else:
            raise ValueError(f"{what} {src!r}: no such file or directory")
        for f in found:
            real = os.path.realpath(f)
            if real in seen:
                dups += 1
                continue
            seen[real] = os.path.abspath(f)
    return sorted(seen.values()), dups


@dataclass
class ParamsData:
    """What a params YAML says about the training data.

    ``data_dirs`` (list of str, resolved as in the module rules), ``shuffle_buffer``
    (elements, or None), ``batch_size`` (elements, or None), ``shuffle_seed`` (int or
    None), ``path`` (the YAML).
    """

    path: str
    data_dirs: list[str] = field(default_factory=list)
    shuffle_buffer: int | None = None
    batch_size: int | None = None
    shuffle_seed: int | None = None


def _opt_int(value: Any, name: str, path: str, low: int = 0) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"--params {path}: {name}: expected an integer >= {low}, got {value!r}")
    return value


def read_params(path: str) -> ParamsData:
    """Read ``train_input`` of a Model Zoo params YAML.

    ``shuffle_buffer`` defaults to ``10 × batch_size`` when absent, the Model Zoo's default
    ("Size of shuffle buffer in samples. (int, optional) Default: 10 * batch_size", the
    Cerebras document "Cerebras Model Zoo YAML parameters"). Raises ``ValueError`` naming
    ``--params``, the key and the value for a missing file, invalid YAML, or a
    missing/ill-typed ``train_input.data_dir``.
    """

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ValueError(f"--params {path}: no such file") from None
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--params {path}: cannot read YAML ({first})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("train_input"), dict):
        raise ValueError(f"--params {path}: train_input: missing (expected a mapping with data_dir)")
    ti = doc["train_input"]
    raw = ti.get("data_dir")
    if isinstance(raw, str) and raw:
        dirs: Sequence[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) and x for x in raw):
        dirs = raw
    else:
        raise ValueError(f"--params {path}: train_input.data_dir: expected a path or a list of "
                         f"paths, got {raw!r}")
    base = os.path.dirname(os.path.abspath(path))
    resolved = []
    for d in dirs:
        d = os.path.expanduser(d)
        if not os.path.isabs(d) and not glob.glob(d) and glob.glob(os.path.join(base, d)):
            d = os.path.normpath(os.path.join(base, d))
        resolved.append(d)
    batch = _opt_int(ti.get("batch_size"), "train_input.batch_size", path, 1)
    buf = _opt_int(ti.get("shuffle_buffer"), "train_input.shuffle_buffer", path, 0)
    if buf is None and batch is not None:
        buf = 10 * batch
    seed = ti.get("shuffle_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"--params {path}: train_input.shuffle_seed: expected an integer, got {seed!r}")
    return ParamsData(path=path, data_dirs=list(resolved), shuffle_buffer=buf, batch_size=batch,
                      shuffle_seed=seed)
