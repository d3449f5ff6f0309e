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

from csrun_common.env import CONFIG
from csrun_common.errors import ConfigError, CsrunError
from csrun_common.layout import FLAGS

from .policy import check_slurm_arg, parse_time
from .requeue import DEFAULT_MAX_REQUEUES, DEFAULT_SIGNAL, parse_signal_spec

RUNTIMES = ("none", "singularity", "apptainer", "pyxis")
EMBEDDED = "embedded default"


@dataclass(frozen=True)
class Key:
    """One site-config key, declared once: its TOML place, the :class:`SiteConfig` attribute it
    fills, its type and embedded default, the one-line help that ``templates/config.toml``
    and the README paraphrase, and the flag that wins over it (``""`` when none does).
    ``tests/unit/test_options.py`` fails when the dataclass, the template or the CLI drift
    from this table."""

    section: str
    name: str
    attr: str
    type: type
    default: Any
    help: str
    flag: str = ""
    zero_allowed: bool = False  # an int key for which 0 is valid (the others must be positive)

    @property
    def dotted(self) -> str:
        """``section.name``, as ``--show-config`` and the error messages write it."""
        return f"{self.section}.{self.name}"


#: Every site-config key, in ``--show-config`` order. The embedded defaults fit the test
#: cluster: node1 carries gpu:1, node2..node5 are CPU nodes with 2 CPUs each.
KEYS: tuple[Key, ...] = (
    Key("defaults", "nodes", "nodes", int, 2, f"DEF_NODES: csrun_wse {FLAGS['nodes']} when not given",
        FLAGS["nodes"]),
    Key("defaults", "tasks_per_node", "tasks_per_node", int, 2,
        f"DEF_TASKS_PER_NODE: csrun_wse {FLAGS['tasks_per_node']} when not given", FLAGS["tasks_per_node"]),
    Key("defaults", "cpus_per_task", "cpus_per_task", int, 1,
        f"DEF_CPUS_PER_TASK: csrun_wse {FLAGS['cpus_per_task']} when not given", FLAGS["cpus_per_task"]),
    Key("defaults", "node_cpus", "node_cpus", int, 0,
        "CPUs of a CPU node when Slurm cannot be asked (0: ask sinfo)", zero_allowed=True),
    Key("gres", "resource", "gres_resource", str, "gpu:1", "GRES_RESOURCE: --gres of the chief's component"),
    Key("gres", "node", "gres_node", str, "node1", "GRES_NODE: excluded from csrun_cpu and input-worker jobs"),
    Key("container", "runtime", "container_runtime", str, "none", "none | singularity | apptainer | pyxis"),
    Key("container", "image", "container_image", str, "", "SINGULARITY_IMAGE (or the Pyxis image)"),
    Key("container", "mount_dirs", "mount_dirs", list, [], "MOUNT_DIRS: always bind-mounted", "--mount-dirs"),
    Key("slurm", "partition", "partition", str, "", "partition of every job", "--partition"),
    Key("slurm", "account", "account", str, "", "account of every job", "--account"),
    Key("slurm", "qos", "qos", str, "", "QOS of every job", "--qos"),
    Key("slurm", "reservation", "reservation", str, "", "reservation of every job", "--reservation"),
    Key("slurm", "constraint", "constraint", str, "", "node features every job requires", "--constraint"),
    Key("slurm", "time", "time", str, "", "time limit in Slurm's format (sbatch(1) --time)", "--time"),
    Key("slurm", "extra_args", "extra_args", list, [], "verbatim options for every het component",
        "--slurm-arg"),
    Key("requeue", "enabled", "requeue", bool, False, "csrun_wse --requeue by default", "--requeue"),
    Key("requeue", "signal", "requeue_signal", str, DEFAULT_SIGNAL, "SIGNAL@SECONDS before the time limit",
        "--requeue-signal"),
    Key("requeue", "max_requeues", "max_requeues", int, DEFAULT_MAX_REQUEUES,
        "requeues allowed before the job is left failed", "--max-requeues", zero_allowed=True),
    Key("checks", "paths", "path_checks", bool, True,
        "check the script, --params, data paths, model_dir and shard plan before every launch",
        "--no-path-checks"),
    Key("checks", "batch_secs", "batch_check_secs", int, 30,
        "seconds a launch may spend pulling one batch locally before queueing; 0 = off "
        "($CSRUN_BATCH_CHECK_SECS overrides)", "--no-batch-check", zero_allowed=True),
    Key("ranks", "master_port", "master_port", int, 0,
        "rank 0's port for several trainer ranks (CSRUN_MASTER_PORT, MASTER_PORT); 0 = derived from "
        "the job id (29500 + SLURM_JOB_ID % 2000)", zero_allowed=True),
    Key("python", "executable", "python_executable", str, "",
        "interpreter of python-ws/python-pt; \"\" = the one running csrun"),
    Key("runs", "state_dir", "state_dir", str, "",
        "the run index of csrun list/status (\"\" = $XDG_STATE_HOME/csrun, else ~/.local/state/csrun)"),
)

_BY_DOTTED: dict[str, Key] = {k.dotted: k for k in KEYS}

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


@dataclass(frozen=True)
class SiteConfig:
    """Resolved site configuration.

    Attributes mirror the TOML keys (``section.key``); ``sources`` maps every
    ``section.key`` to where its value came from (a file path or ``embedded default``).
    """

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gres_resource: str
    gres_node: str
    container_runtime: str
    container_image: str
    mount_dirs: tuple[str, ...]
    partition: str
    account: str
    python_executable: str
    node_cpus: int = 0
    qos: str = ""
    reservation: str = ""
    constraint: str = ""
    time: str = ""
    extra_args: tuple[str, ...] = ()
    requeue: bool = False
    requeue_signal: str = DEFAULT_SIGNAL
    max_requeues: int = DEFAULT_MAX_REQUEUES
    path_checks: bool = True
    batch_check_secs: int = 30
    master_port: int = 0
    state_dir: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)

    def items(self) -> list[tuple[str, Any, str]]:
        """Every key as ``(section.key, value, source)`` in schema order."""
        out = []
        for key in KEYS:
            value = getattr(self, key.attr)
            out.append((key.dotted, list(value) if key.type is list else value,
                        self.sources.get(key.dotted, EMBEDDED)))
        return out

    @property
    def python(self) -> str:
        """Interpreter that ``python-ws``/``python-pt`` run (default: ``sys.executable``)."""
        return self.python_executable or sys.executable


def _check(path: str, section: str, key: str, value: Any) -> Any:
    typ = _BY_DOTTED[f"{section}.{key}"].type
    where = f"{path}: {section}.{key}"
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} = {value!r}: must be an integer")
        if (section, key) in ZERO_ALLOWED and value < 0:
            raise ConfigError(f"{where} = {value!r}: must be 0 or more")
        if (section, key) not in ZERO_ALLOWED and value < 1:
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
    if (section, key) == ("container", "runtime") and value not in RUNTIMES:
        raise ConfigError(f"{where} = {value!r}: must be one of {', '.join(RUNTIMES)}")
    if (section, key) == ("ranks", "master_port") and not 0 <= value <= 65535:
        raise ConfigError(f"{where} = {value!r}: not a port (1..65535, or 0: derived from the job id)")
    if (section, key) == ("gres", "resource") and value and not _GRES_RE.match(value):
        raise ConfigError(f"{where} = {value!r}: not a GRES spec like 'gpu:1' or 'gpu:a100:2'")
    _check_meaning(where, section, key, value)
    return value


def _check_meaning(where: str, section: str, key: str, value: Any) -> None:
    """Values with a syntax of their own: a Slurm time, a signal spec, verbatim options.
    Raises :class:`ConfigError` naming the file and key."""
    try:
        if (section, key) == ("slurm", "time") and value:
            parse_time(value, where)
        elif (section, key) == ("requeue", "signal"):
            parse_signal_spec(value, where)
        elif (section, key) == ("slurm", "extra_args"):
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
    for section, body in data.items():
        if section not in SCHEMA:
            raise ConfigError(
                f"{path}: unknown section [{section}]; valid sections: {', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {section} must be a table [{section}]")
        for key, value in body.items():
            if key not in SCHEMA[section]:
                valid = ", ".join(f"{section}.{k}" for k in SCHEMA[section])
                raise ConfigError(f"{path}: unknown key {section}.{key}; valid keys: {valid}")
            out[f"{section}.{key}"] = _check(path, section, key, value)
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
        for key, value in parse_config(data, str(path)).items():
            values[key] = value
            sources[key] = str(path)
        break
    fields: dict[str, Any] = {k.attr: tuple(values[k.dotted]) if k.type is list else values[k.dotted]
                              for k in KEYS}
    return SiteConfig(**fields, sources=sources)


def format_config(cfg: SiteConfig) -> str:
    """``--show-config`` text: one ``section.key = value  # source`` line per key."""

    lines = []
    for key, value, source in cfg.items():
        lines.append(f"{key} = {json.dumps(value)}  # {source}")
    if not cfg.python_executable:
        lines.append(f"# python.executable resolves to {cfg.python}")
    return "\n".join(lines)
