"""Site configuration of csrun, read from TOML.

The original ``csrun_cpu`` asked administrators to edit bash variables
(``DEF_NODES``, ``DEF_TASKS_PER_NODE``, ``DEF_CPUS_PER_TASK``, ``GRES_RESOURCE``,
``GRES_NODE``, ``SINGULARITY_IMAGE``, ``MOUNT_DIRS``). csrun reads the same values
from the first file found of:

1. ``$CSRUN_CONFIG``
2. ``~/.config/csrun/config.toml``
3. ``/etc/csrun/config.toml``

and falls back, key by key, to an embedded default that works on the local test
cluster (``slurm-test-cluster/``). ``templates/config.toml`` is a commented template.

Each key is declared once, as a field of :class:`SiteConfig` (or of its ``[slurm]`` section,
:class:`launcher.policy.SitePolicy`) with its flag attached (:func:`launcher.sitekeys.key`);
:data:`KEYS`, the schema, ``--show-config`` and the flags' ``[default: ...]`` are read from them.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from csrun_common.env import BATCH_CHECK_SECS, CONFIG, NO_PATH_CHECKS
from csrun_common.errors import ConfigError, CsrunError
from csrun_common.flagspec import FlagSpec
from csrun_common.layout import FLAGS, LAYOUT_FLAGS

from .policy import SitePolicy, check_slurm_arg, parse_time
from .requeue import DEFAULT_MAX_REQUEUES, DEFAULT_SIGNAL, parse_signal_spec
from .sitekeys import Key, build, flag_notes, key, keys_of, section

RUNTIMES = ("none", "singularity", "apptainer", "pyxis")
EMBEDDED = "embedded default"


_LAYOUT = {s.name: s for s in LAYOUT_FLAGS}


@dataclass(frozen=True)
class SiteConfig:
    """Resolved site configuration; each field declares its key (:func:`launcher.sitekeys.key`:
    TOML place, embedded default, help, the flag that wins over it), in ``--show-config``
    order. The embedded defaults fit the test cluster: node1 carries gpu:1, node2..node5 are
    CPU nodes with 2 CPUs each. ``slurm`` is the ``[slurm]`` section (:class:`SitePolicy`);
    ``sources`` maps every ``section.key`` to where its value came from (a file path or
    ``embedded default``)."""

    nodes: int = key("defaults", "nodes", 2, f"DEF_NODES: csrun_wse {FLAGS['nodes']} when not given",
                     _LAYOUT["nodes"], "{key}")
    tasks_per_node: int = key("defaults", "tasks_per_node", 2,
                              f"DEF_TASKS_PER_NODE: csrun_wse {FLAGS['tasks_per_node']} when not given",
                              _LAYOUT["tasks_per_node"], "{key}, or node CPUs / C")
    cpus_per_task: int = key("defaults", "cpus_per_task", 1,
                             f"DEF_CPUS_PER_TASK: csrun_wse {FLAGS['cpus_per_task']} when not given",
                             _LAYOUT["cpus_per_task"], "{key} if T of them fit, else Slurm's choice")
    node_cpus: int = key("defaults", "node_cpus", 0, "CPUs of a CPU node when Slurm cannot be asked (0: ask sinfo)",
                         zero_allowed=True)
    gres_resource: str = key("gres", "resource", "gpu:1", "GRES_RESOURCE: --gres of the chief's component")
    gres_node: str = key("gres", "node", "node1", "GRES_NODE: excluded from csrun_cpu and input-worker jobs")
    container_runtime: str = key("container", "runtime", "none", "none | singularity | apptainer | pyxis")
    container_image: str = key("container", "image", "", "SINGULARITY_IMAGE (or the Pyxis image)")
    mount_dirs: tuple[str, ...] = key(
        "container", "mount_dirs", (), "MOUNT_DIRS: always bind-mounted",
        FlagSpec("mount_dirs", "--mount-dirs", str, None, "Directories to bind-mount in the container, added to {key}.",
                 metavar="DIR[,DIR...]"))
    slurm: SitePolicy = section(SitePolicy)
    requeue: bool = key(
        "requeue", "enabled", False, "csrun_wse --requeue by default",
        FlagSpec("requeue", "--requeue", bool, None, "On the warning signal before the time limit, preemption or "
                 "scontrol requeue, checkpoint, stop and requeue the job; it resumes from the checkpoint",
                 off_flag="--no-requeue"), "{key}")
    requeue_signal: str = key(
        "requeue", "signal", DEFAULT_SIGNAL, "SIGNAL@SECONDS before the time limit",
        FlagSpec("requeue_signal", "--requeue-signal", str, None,
                 "Warning signal and its lead time before the time limit", metavar="SIG@SECONDS"), "{key}, {default}")
    max_requeues: int = key(
        "requeue", "max_requeues", DEFAULT_MAX_REQUEUES, "requeues allowed before the job is left failed",
        FlagSpec("max_requeues", "--max-requeues", int, None, "Requeues allowed before the job is left failed"),
        "{key}, {default}", zero_allowed=True)
    path_checks: bool = key(
        "checks", "paths", True, "check the script, --params, data paths, model_dir and shard plan before every launch",
        FlagSpec("no_path_checks", "--no-path-checks", bool, False, "Skip the checks every launch makes of the script, "
                 "--params, the data paths the params name, the model_dir's parent and a shard plan's files (for "
                 "clusters whose login node does not see the compute nodes' paths; also "
                 f"{NO_PATH_CHECKS.name}=1; docs/CHECKS.md).", options={"envvar": NO_PATH_CHECKS.name}))
    batch_check_secs: int = key(
        "checks", "batch_secs", 30, "seconds a launch may spend pulling one batch locally before queueing; 0 = off "
        f"(${BATCH_CHECK_SECS.name} overrides)",
        FlagSpec("no_batch_check", "--no-batch-check", bool, False, "Do not pull one batch of the training input on "
                 "this host before queueing (by default a training run's first batch is pulled, bounded by {key} "
                 "seconds, and a launch whose input code raises is refused; docs/CHECKS.md)."), zero_allowed=True)
    master_port: int = key("ranks", "master_port", 0,
                           "rank 0's port for several trainer ranks (CSRUN_MASTER_PORT, MASTER_PORT); 0 = derived "
                           "from the job id (29500 + SLURM_JOB_ID % 2000)", zero_allowed=True)
    python_executable: str = key("python", "executable", "",
                                 "interpreter of python-ws/python-pt; \"\" = the one running csrun")
    state_dir: str = key("runs", "state_dir", "",
                         "the run index of csrun list/status (\"\" = $XDG_STATE_HOME/csrun, else ~/.local/state/csrun)")
    sources: Mapping[str, str] = field(default_factory=dict)

    def items(self) -> list[tuple[str, Any, str]]:
        """Every key as ``(section.key, value, source)`` in schema order."""
        return [(k.dotted, list(k.value(self)) if k.type is list else k.value(self),
                 self.sources.get(k.dotted, EMBEDDED)) for k in KEYS]

    @property
    def python(self) -> str:
        """Interpreter that ``python-ws``/``python-pt`` run (default: ``sys.executable``)."""
        return self.python_executable or sys.executable


#: Every site-config key, in ``--show-config`` order (:class:`SiteConfig`'s fields).
KEYS: tuple[Key, ...] = tuple(keys_of(SiteConfig))
#: The flags that win over a key, by parameter name (``qos``, ``slurm_args``).
KEY_FLAGS: dict[str, FlagSpec] = {k.spec.name: k.spec for k in KEYS if k.spec}
#: Flag parameter name -> its help's ``[default: ...]``: the key it falls back to.
FLAG_NOTES: dict[str, str] = flag_notes(KEYS)
_BY_DOTTED: dict[str, Key] = {k.dotted: k for k in KEYS}
#: :class:`SiteConfig` (or :class:`SitePolicy`) field -> its key.
KEY_OF: dict[str, Key] = {k.attr: k for k in KEYS}

#: section -> key -> (type, default), derived from :data:`KEYS`.
SCHEMA: dict[str, dict[str, tuple[type, Any]]] = {}
for _k in KEYS:
    SCHEMA.setdefault(_k.section, {})[_k.name] = (_k.type, _k.default)

#: Integer keys for which 0 is a valid value (the others must be positive).
ZERO_ALLOWED = {(k.section, k.name) for k in KEYS if k.zero_allowed}

_GRES_RE = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.\-]+)*$")


def candidate_paths(env: Mapping[str, str] | None = None) -> list[tuple[Path, bool]]:
    """Config file candidates in lookup order, as ``(path, explicit)`` pairs.

    ``explicit`` is true for ``$CSRUN_CONFIG``: a missing explicit file is an error,
    a missing default location is skipped.
    """
    env = os.environ if env is None else env
    out: list[tuple[Path, bool]] = []
    if env.get(CONFIG):
        out.append((Path(env[CONFIG]), True))
    home = env.get("HOME") or str(Path.home())
    out.append((Path(home) / ".config" / "csrun" / "config.toml", False))
    out.append((Path("/etc/csrun/config.toml"), False))
    return out


def _check(path: str, sec: str, name: str, value: Any) -> Any:
    typ = _BY_DOTTED[f"{sec}.{name}"].type
    where = f"{path}: {sec}.{name}"
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} = {value!r}: must be an integer")
        if (sec, name) in ZERO_ALLOWED and value < 0:
            raise ConfigError(f"{where} = {value!r}: must be 0 or more")
        if (sec, name) not in ZERO_ALLOWED and value < 1:
            raise ConfigError(f"{where} = {value!r}: must be a positive integer")
    elif typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r}: must be true or false")
    elif typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} = {value!r}: must be a string")
    elif typ is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} = {value!r}: must be a list of strings")
    if (sec, name) == ("container", "runtime") and value not in RUNTIMES:
        raise ConfigError(f"{where} = {value!r}: must be one of {', '.join(RUNTIMES)}")
    if (sec, name) == ("ranks", "master_port") and not 0 <= value <= 65535:
        raise ConfigError(f"{where} = {value!r}: not a port (1..65535, or 0: derived from the job id)")
    if (sec, name) == ("gres", "resource") and value and not _GRES_RE.match(value):
        raise ConfigError(f"{where} = {value!r}: not a GRES spec like 'gpu:1' or 'gpu:a100:2'")
    _check_meaning(where, sec, name, value)
    return value


def _check_meaning(where: str, sec: str, name: str, value: Any) -> None:
    """Values with a syntax of their own: a Slurm time, a signal spec, verbatim options.
    Raises :class:`ConfigError` naming the file and key."""
    try:
        if (sec, name) == ("slurm", "time") and value:
            parse_time(value, where)
        elif (sec, name) == ("requeue", "signal"):
            parse_signal_spec(value, where)
        elif (sec, name) == ("slurm", "extra_args"):
            for arg in value:
                check_slurm_arg(arg, where)
    except CsrunError as exc:
        raise ConfigError(str(exc)) from None


def parse_config(data: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Validate a parsed TOML document against :data:`SCHEMA`.

    Returns ``{"section.key": value}`` for the keys present.
    Raises :class:`ConfigError` naming the file, the key and the valid keys for an
    unknown section or key, and the key and value for a wrong type.
    """
    out: dict[str, Any] = {}
    for sec, body in data.items():
        if sec not in SCHEMA:
            raise ConfigError(
                f"{path}: unknown section [{sec}]; valid sections: {', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {sec} must be a table [{sec}]")
        for name, value in body.items():
            if name not in SCHEMA[sec]:
                valid = ", ".join(f"{sec}.{k}" for k in SCHEMA[sec])
                raise ConfigError(f"{path}: unknown key {sec}.{name}; valid keys: {valid}")
            out[f"{sec}.{name}"] = _check(path, sec, name, value)
    return out


def load_config(env: Mapping[str, str] | None = None) -> SiteConfig:
    """Load the site configuration (see module docstring for the lookup order).

    Raises :class:`ConfigError` for an unreadable or malformed file, an explicit
    ``$CSRUN_CONFIG`` that does not exist, an unknown key or a wrong type.
    """
    values: dict[str, Any] = {k.dotted: k.default for k in KEYS}
    sources = {k: EMBEDDED for k in values}
    for path, explicit in candidate_paths(env):
        if not path.exists():
            if explicit:
                raise ConfigError(f"CSRUN_CONFIG={path}: no such file")
            continue
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        for dotted, value in parse_config(data, str(path)).items():
            values[dotted] = value
            sources[dotted] = str(path)
        break
    config: SiteConfig = build(SiteConfig, values, sources=sources)
    return config


def format_config(cfg: SiteConfig) -> str:
    """``--show-config`` text: one ``section.key = value  # source`` line per key."""

    lines = []
    for dotted, value, source in cfg.items():
        lines.append(f"{dotted} = {json.dumps(value)}  # {source}")
    if not cfg.python_executable:
        lines.append(f"# python.executable resolves to {cfg.python}")
    return "\n".join(lines)
