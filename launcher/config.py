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

from csrun_common.errors import ConfigError, CsrunError

from .policy import check_slurm_arg, parse_time
from .requeue import DEFAULT_MAX_REQUEUES, DEFAULT_SIGNAL, parse_signal_spec

RUNTIMES = ("none", "singularity", "apptainer", "pyxis")
EMBEDDED = "embedded default"

# section -> key -> (type, default). The embedded default fits the test cluster:
# node1 carries gpu:1, node2..node5 are CPU nodes with 2 CPUs each.
SCHEMA: dict[str, dict[str, tuple[type, Any]]] = {
    "defaults": {
        "nodes": (int, 2),           # DEF_NODES
        "tasks_per_node": (int, 2),  # DEF_TASKS_PER_NODE
        "cpus_per_task": (int, 1),   # DEF_CPUS_PER_TASK
        "node_cpus": (int, 0),       # CPUs of a CPU node when Slurm cannot be asked (0: ask sinfo)
    },
    "gres": {
        "resource": (str, "gpu:1"),  # GRES_RESOURCE: --gres of the chief's component
        "node": (str, "node1"),      # GRES_NODE: excluded from csrun_cpu jobs
    },
    "container": {
        "runtime": (str, "none"),    # none | singularity | apptainer | pyxis
        "image": (str, ""),          # SINGULARITY_IMAGE (or the Pyxis image)
        "mount_dirs": (list, []),    # MOUNT_DIRS
    },
    "slurm": {
        "partition": (str, ""),
        "account": (str, ""),
        "qos": (str, ""),
        "reservation": (str, ""),
        "constraint": (str, ""),
        "time": (str, ""),           # Slurm time format (sbatch(1) --time); "" = the partition's default
        "extra_args": (list, []),    # verbatim options for every het component, e.g. ["--mem=0"]
    },
    "requeue": {
        "enabled": (bool, False),    # csrun_wse --requeue by default
        "signal": (str, DEFAULT_SIGNAL),          # SIGNAL@SECONDS before the time limit
        "max_requeues": (int, DEFAULT_MAX_REQUEUES),
    },
    "python": {
        "executable": (str, ""),     # interpreter of python-ws/python-pt; "" = the one running csrun
    },
}

#: Integer keys for which 0 is a valid value (the others must be positive).
ZERO_ALLOWED = {("defaults", "node_cpus"), ("requeue", "max_requeues")}

_GRES_RE = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.\-]+)*$")


def candidate_paths(env: Mapping[str, str] | None = None) -> list[tuple[Path, bool]]:
    """Config file candidates in lookup order, as ``(path, explicit)`` pairs.

    ``explicit`` is true for ``$CSRUN_CONFIG``: a missing explicit file is an error,
    a missing default location is skipped.
    """
    env = os.environ if env is None else env
    out: list[tuple[Path, bool]] = []
    if env.get("CSRUN_CONFIG"):
        out.append((Path(env["CSRUN_CONFIG"]), True))
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
    sources: Mapping[str, str] = field(default_factory=dict)

    def items(self) -> list[tuple[str, Any, str]]:
        """Every key as ``(section.key, value, source)`` in schema order."""
        values = {
            "defaults.nodes": self.nodes,
            "defaults.tasks_per_node": self.tasks_per_node,
            "defaults.cpus_per_task": self.cpus_per_task,
            "defaults.node_cpus": self.node_cpus,
            "gres.resource": self.gres_resource,
            "gres.node": self.gres_node,
            "container.runtime": self.container_runtime,
            "container.image": self.container_image,
            "container.mount_dirs": list(self.mount_dirs),
            "slurm.partition": self.partition,
            "slurm.account": self.account,
            "slurm.qos": self.qos,
            "slurm.reservation": self.reservation,
            "slurm.constraint": self.constraint,
            "slurm.time": self.time,
            "slurm.extra_args": list(self.extra_args),
            "requeue.enabled": self.requeue,
            "requeue.signal": self.requeue_signal,
            "requeue.max_requeues": self.max_requeues,
            "python.executable": self.python_executable,
        }
        return [(k, v, self.sources.get(k, EMBEDDED)) for k, v in values.items()]

    @property
    def python(self) -> str:
        """Interpreter that ``python-ws``/``python-pt`` run (default: ``sys.executable``)."""
        return self.python_executable or sys.executable


def _check(path: str, section: str, key: str, value: Any) -> Any:
    typ, _ = SCHEMA[section][key]
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
    values: dict[str, Any] = {f"{s}.{k}": d for s, keys in SCHEMA.items() for k, (_, d) in keys.items()}
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
    return SiteConfig(
        nodes=values["defaults.nodes"],
        tasks_per_node=values["defaults.tasks_per_node"],
        cpus_per_task=values["defaults.cpus_per_task"],
        node_cpus=values["defaults.node_cpus"],
        gres_resource=values["gres.resource"],
        gres_node=values["gres.node"],
        container_runtime=values["container.runtime"],
        container_image=values["container.image"],
        mount_dirs=tuple(values["container.mount_dirs"]),
        partition=values["slurm.partition"],
        account=values["slurm.account"],
        qos=values["slurm.qos"],
        reservation=values["slurm.reservation"],
        constraint=values["slurm.constraint"],
        time=values["slurm.time"],
        extra_args=tuple(values["slurm.extra_args"]),
        requeue=values["requeue.enabled"],
        requeue_signal=values["requeue.signal"],
        max_requeues=values["requeue.max_requeues"],
        python_executable=values["python.executable"],
        sources=sources,
    )


def format_config(cfg: SiteConfig) -> str:
    """``--show-config`` text: one ``section.key = value  # source`` line per key."""

    lines = []
    for key, value, source in cfg.items():
        lines.append(f"{key} = {json.dumps(value)}  # {source}")
    if not cfg.python_executable:
        lines.append(f"# python.executable resolves to {cfg.python}")
    return "\n".join(lines)
