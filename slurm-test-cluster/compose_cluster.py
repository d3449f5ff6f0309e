#!/usr/bin/env python3
"""The compose test cluster: the native test cluster's topology -- slurmctld (with slurmdbd and
MariaDB), node1 with the GRES gpu:1, node2-node5 -- as one container each, on a real network
(a bridge of its own, one IP per container), run with podman (podman-compose) or Docker
(``docker compose``).

Called by ``slurm-test-cluster/cluster`` for ``--engine podman|docker`` (or
``CSRUN_TEST_ENGINE``): ``up``, ``down``, ``status``, ``env``, ``exec [--node NAME] CMD...``.

Where things run, and why (docs/TESTING.md, "The compose test cluster"): the csrun tools and Slurm's
commands run on the host, like a login node outside the compute nodes: the host reaches every
container by its IP on the cluster's bridge and runs its own munged with the cluster's key, so
``srun``, ``sbatch``, ``sacct`` and the integration tests run there unchanged (Ctrl-C reaches
srun itself). The containers see the repository, its Python environment (the venv, its base
interpreter, any site-packages it points at), the cluster's directory and ``/tmp`` at the same
paths as the host (bind mounts: a shared file system, as a real cluster has), so a task runs
the very interpreter and files the host names. The image holds packages only (Slurm, munge,
MariaDB, the shared libraries the interpreter needs); it is built when missing, from a base
image made with debootstrap when no registry answers.

Every failure is one line on stderr naming the cause and the fix, exit status 2, and a failed
``up`` takes down what it started.
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOCKER_DIR = HERE / "docker"
NODES = 5
SERVICES = ["slurmctld"] + [f"node{k}" for k in range(1, NODES + 1)]
BASE = "debian:bookworm-slim"
SLURMCTLD_PORT, SLURMD_PORT, SLURMDBD_PORT = 6817, 6818, 6819
UP_TIMEOUT = float(os.environ.get("CSRUN_CLUSTER_UP_TIMEOUT", "180"))


class ClusterError(Exception):
    """A failure reported as one line (cause and fix), exit status 2."""


# --------------------------------------------------------------------------- the engine
@dataclass
class Engine:
    """A container engine: ``podman`` (with podman-compose) or ``docker`` (``docker compose``).

    podman runs with ``CONTAINERS_CONF`` = ``docker/containers.conf`` (the OCI runtime runc
    and no default ulimits: crun fails on these hosts' hybrid cgroups and on raising
    RLIMIT_NOFILE/NPROC), or ``$CSRUN_CONTAINERS_CONF`` when set."""

    name: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def named(cls, name: str, log: Path) -> Engine:
        env = dict(os.environ)
        if name == "podman":
            env["CONTAINERS_CONF"] = os.environ.get("CSRUN_CONTAINERS_CONF", str(DOCKER_DIR / "containers.conf"))
        return cls(name, log, env)

    def run(self, args: list[str], *, timeout: float = 600, check: bool = False,
            stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        """``<engine> args``; output appended to the log. Raises :class:`ClusterError` when
        ``check`` and the command fails (with its last output line)."""
        return self._run([self.name, *args], timeout=timeout, check=check, stdin=stdin)

    def compose(self, project: str, file: Path, args: list[str],
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """The compose tool on ``file`` as project ``project``."""
        tool = [self.compose_tool()] if self.name == "podman" else ["docker", "compose"]
        return self._run([*tool, "-p", project, "-f", str(file), *args], timeout=timeout)

    def compose_tool(self) -> str:
        """podman-compose: on PATH or beside the running Python (the project's venv)."""
        for cand in (shutil.which("podman-compose"), Path(sys.executable).parent / "podman-compose",
                     REPO / ".venv" / "bin" / "podman-compose"):
            if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
                return str(cand)
        raise ClusterError("podman-compose not found: pip install podman-compose "
                           "(scripts/setup.sh installs it into .venv)")

    def _run(self, argv: list[str], *, timeout: float, check: bool = False,
             stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        # Output goes to the log file, never to a pipe: the container monitors (conmon) that
        # podman leaves running inherit its stdout, and a pipe would never reach end-of-file.
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            start = log.tell()
            try:
                proc = subprocess.run(argv, env=self.env, input=stdin, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=None if stdin is not None else subprocess.DEVNULL, timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                raise ClusterError(f"{argv[0]} {argv[1]} did not finish in {timeout:.0f} s; see {self.log}") from exc
        with self.log.open("rb") as log:
            log.seek(start)
            out = log.read().decode(errors="replace")
        result = subprocess.CompletedProcess(argv, proc.returncode, out, "")
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv[:3])} failed: {last_line(out)}; see {self.log}")
        return result


def last_line(text: str) -> str:
    """The last non-empty line of a command's output (its error, usually)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def check_engine(engine: Engine) -> None:
    """Refuse early, naming the fix: no engine installed, no compose tool, an engine that does
    not answer, or (podman) no runc. Raises :class:`ClusterError`."""
    if not shutil.which(engine.name):
        fix = ("apt-get install podman runc debootstrap (scripts/setup.sh does)" if engine.name == "podman"
               else "install Docker Engine with its compose plugin, or use --engine podman")
        raise ClusterError(f"--engine {engine.name}: {engine.name} is not installed: {fix}")
    if engine.name == "podman":
        engine.compose_tool()
        if not shutil.which("runc"):
            raise ClusterError("--engine podman: runc is not installed (crun fails on this kernel's hybrid "
                               "cgroups): apt-get install runc (scripts/setup.sh does)")
    elif engine.run(["compose", "version"], timeout=30).returncode != 0:
        raise ClusterError("--engine docker: the docker compose plugin is missing: install docker-compose-plugin")
    info = engine.run(["info"], timeout=60)
    if info.returncode != 0:
        explained = explain_start_failure(engine, info.stdout)
        if explained.startswith(f"{engine.name} could not start"):
            explained = (f"--engine {engine.name}: the engine does not answer ({last_line(info.stdout)}): "
                         f"start it, or check its configuration; see {engine.log}")
        raise ClusterError(explained)


def explain_start_failure(engine: Engine, output: str) -> str:
    """One line naming the cause and the fix of a failed container start, from the engine's output."""
    low = output.lower()
    if "crun" in low and ("rlimit" in low or "cgroup" in low or "setrlimit" in low):
        return (f"{engine.name} cannot start containers with the OCI runtime crun here ({last_line(output)}): "
                "use runc and no default ulimits, as slurm-test-cluster/docker/containers.conf does "
                "(unset CSRUN_CONTAINERS_CONF; apt-get install runc)")
    if "rlimit" in low or "ulimit" in low:
        return (f"{engine.name} cannot raise the containers' ulimits here ({last_line(output)}): "
                "set default_ulimits = [] as slurm-test-cluster/docker/containers.conf does")
    if re.search(r'oci runtime "?[\w./-]+"? not found', low):
        return f"{engine.name}: its OCI runtime is missing ({last_line(output)}): apt-get install runc"
    if "already in use" in low or "already exists" in low:
        return (f"a container or network name of this cluster is taken ({last_line(output)}): "
                "bring the other cluster down or choose another CSRUN_CLUSTER_PORT")
    if "subnet" in low or "address already in use" in low or "overlap" in low:
        return (f"the cluster's network cannot be made ({last_line(output)}): "
                "set CSRUN_COMPOSE_SUBNET to a free /24, e.g. 10.214.7.0/24")
    return f"{engine.name} could not start the cluster: {last_line(output)}; see {engine.log}"


# --------------------------------------------------------------------------- the cluster
@dataclass
class Cluster:
    """Where a compose cluster lives: its directory (config, munge key, logs, the compose
    file), project name (container and network names), its /24 subnet (the host is ``.1``,
    slurmctld ``.2``, node ``k`` ``.(10+k)``) and the CPUs each node declares."""

    engine: Engine
    dir: Path
    project: str
    subnet: ipaddress.IPv4Network
    cpus: int
    accounting: bool

    @classmethod
    def from_env(cls, engine_name: str) -> Cluster:
        port = os.environ.get("CSRUN_CLUSTER_PORT", "16817")
        if not port.isdigit():
            raise ClusterError(f"CSRUN_CLUSTER_PORT must be an integer, got {port!r}")
        directory = Path(os.environ.get("CSRUN_CLUSTER_DIR") or HERE / f"run-{engine_name}").resolve()
        subnet_text = os.environ.get("CSRUN_COMPOSE_SUBNET") or f"10.213.{int(port) % 250}.0/24"
        try:
            subnet = ipaddress.IPv4Network(subnet_text)
        except ValueError as exc:
            raise ClusterError(f"CSRUN_COMPOSE_SUBNET {subnet_text!r}: {exc}") from exc
        if subnet.prefixlen > 26:
            raise ClusterError(f"CSRUN_COMPOSE_SUBNET {subnet_text}: needs at least 64 addresses (a /26 or larger)")
        accounting = os.environ.get("CSRUN_CLUSTER_ACCOUNTING", "1") != "0"
        engine = Engine.named(engine_name, directory / "log" / "engine.log")
        return cls(engine, directory, f"csrun{port}-{engine_name}", subnet, max(2, os.cpu_count() or 2), accounting)

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        """munged's socket, at a path outside every shared directory: on the host the host's
        munged, in each container that container's own (its /run is private)."""
        return Path("/run/csrun-munge") / self.project / "munge.socket"

    @property
    def compose_file(self) -> Path:
        return self.dir / "compose.yaml"

    def ip(self, service: str) -> str:
        """The container's address: slurmctld ``.2``, node ``k`` ``.(10+k)``."""
        offset = 2 if service == "slurmctld" else 10 + int(service[4:])
        return str(self.subnet.network_address + offset)

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def container(self, service: str) -> str:
        return f"{self.project}-{service}"

    def slurm_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}


# --------------------------------------------------------------------------- images
def dockerfile_tag() -> str:
    """The image tag: a hash of the Dockerfile, so an edit builds a new image."""
    return "csrun-slurm:" + hashlib.sha256((DOCKER_DIR / "Dockerfile").read_bytes()).hexdigest()[:12]


def image_exists(engine: Engine, ref: str) -> bool:
    return engine.run(["image", "inspect", ref], timeout=60).returncode == 0


def ensure_base_image(engine: Engine, workdir: Path) -> str:
    """A local ``debian:bookworm-slim``: already there, pulled, or made with debootstrap from
    the host's Debian mirror when no registry answers (about a minute). Returns its reference."""
    local = [f"localhost/{BASE}", f"docker.io/library/{BASE}"] if engine.name == "podman" else [BASE]
    for ref in local:
        if image_exists(engine, ref):
            return ref
    if engine.run(["pull", f"docker.io/library/{BASE}"], timeout=300).returncode == 0:
        return f"docker.io/library/{BASE}"
    ref = local[0]
    print(f"cluster: no registry answers; building {ref} with debootstrap (about a minute)", file=sys.stderr)
    debootstrap_import(engine, ref, workdir)
    return ref


def debian_mirror() -> str:
    """The host's Debian mirror (``URIs:`` of /etc/apt/sources.list.d/*.sources or a ``deb``
    line of /etc/apt/sources.list), else deb.debian.org."""
    texts = [p.read_text(errors="replace") for p in sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    for text in texts:
        for block in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
            if uris and "security" not in uris.group(1) and re.search(r"^Suites:.*\bbookworm\b", block, re.M):
                return uris.group(1)
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", sources.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


def debootstrap_import(engine: Engine, ref: str, workdir: Path) -> None:
    """``debootstrap --variant=minbase bookworm`` into a temporary directory, imported as ``ref``."""
    if not shutil.which("debootstrap"):
        raise ClusterError(f"no image registry answers and debootstrap is not installed: "
                           f"apt-get install debootstrap (scripts/setup.sh does), or load {BASE} into {engine.name}")
    with tempfile.TemporaryDirectory(prefix="csrun-rootfs-", dir=workdir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = engine._run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), debian_mirror()],
                           timeout=900)
        if proc.returncode != 0:
            raise ClusterError(f"debootstrap failed: {last_line(proc.stdout)}; see {engine.log}")
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        engine.run(["import", "-", ref], stdin=tar, timeout=600, check=True)


def ensure_image(engine: Engine, workdir: Path) -> str:
    """The cluster's image, built from docker/Dockerfile when missing (~35 s with apt inside).
    Returns its reference."""
    tag = dockerfile_tag()
    ref = f"localhost/{tag}" if engine.name == "podman" else tag
    if image_exists(engine, ref):
        return ref
    base = ensure_base_image(engine, workdir)
    print(f"cluster: building image {ref} from slurm-test-cluster/docker/Dockerfile", file=sys.stderr)
    engine.run(["build", "--build-arg", f"BASE={base}", "-t", ref, str(DOCKER_DIR)], timeout=1800, check=True)
    return ref


# --------------------------------------------------------------------------- files
def shared_dirs(cluster: Cluster) -> list[Path]:
    """Host directories the containers see at the same paths: the repository, the cluster's
    directory, the Python environment of ``.venv`` (or of the running Python) -- its prefix,
    base interpreter and every directory on its ``sys.path`` outside the system's -- and
    ``$CSRUN_COMPOSE_SHARED`` (``:``-separated, default ``/tmp``)."""
    python = REPO / ".venv" / "bin" / "python"
    python_cmd = str(python) if python.exists() else sys.executable
    code = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, *sys.path]))"
    probe = subprocess.run([python_cmd, "-c", code], capture_output=True, text=True, check=True)
    paths = [Path(p) for p in json.loads(probe.stdout) if p.startswith("/")]
    extra = [Path(p) for p in os.environ.get("CSRUN_COMPOSE_SHARED", "/tmp").split(":") if p]
    system = (Path("/usr"), Path("/lib"), Path("/lib64"), Path("/bin"), Path("/etc"))
    found: list[Path] = []
    for p in [REPO, cluster.dir, *paths, *extra]:
        real = p.resolve()
        if not real.is_dir() or real == Path("/") or any(real == s or s in real.parents for s in system):
            continue
        found.append(real)
    found = sorted(set(found))
    return [p for p in found if not any(q in p.parents for q in found)]


def slurm_conf(cluster: Cluster) -> str:
    """slurm.conf for the host and every container (the same file, at the same path)."""
    lines = ["# Generated by slurm-test-cluster/cluster --engine; edits are overwritten by 'up'.",
             (HERE / "slurm.common.conf").read_text().rstrip("\n"),
             "# This cluster: one container per daemon on the bridge " + str(cluster.subnet),
             f"SlurmctldHost=slurmctld({cluster.ip('slurmctld')})",
             f"SlurmctldPort={SLURMCTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
             # cred_expire=10: a requeued job may start again after 10 s, not 120 (slurm.conf(5), AuthInfo)
             f"AuthInfo=socket={cluster.munge_socket},cred_expire=10",
             "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd",
             "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid",
             "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log"]
    if cluster.accounting:
        lines += [(HERE / "slurm.accounting.conf").read_text().rstrip("\n"),
                  f"AccountingStorageHost={cluster.ip('slurmctld')}", f"AccountingStoragePort={SLURMDBD_PORT}",
                  f"AccountingStoragePass={cluster.munge_socket}"]
    else:
        lines += ["AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none"]
    for k in range(1, NODES + 1):
        gres = " Gres=gpu:1" if k == 1 else ""
        lines.append(f"NodeName=node{k} NodeHostname=node{k} NodeAddr={cluster.ip(f'node{k}')} "
                     f"CPUs={cluster.cpus} RealMemory=1000{gres} State=UNKNOWN")
    lines.append("PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def slurmdbd_conf(cluster: Cluster) -> str:
    """slurmdbd.conf for the slurmctld container: MariaDB in the same container, reached as
    root over its Unix socket."""
    return "\n".join([
        "# Generated by slurm-test-cluster/cluster --engine; edits are overwritten by 'up'.",
        "AuthType=auth/munge", f"AuthInfo=socket={cluster.munge_socket}",
        "DbdHost=slurmctld", f"DbdPort={SLURMDBD_PORT}", "SlurmUser=root",
        "PidFile=/run/slurmdbd.pid", "LogFile=/var/log/slurm/slurmdbd.log", "DebugLevel=info",
        "StorageType=accounting_storage/mysql", "StorageHost=localhost", "StorageUser=root",
        "StorageLoc=slurm_acct_db"]) + "\n"


def compose_spec(cluster: Cluster, image: str, shared: list[Path]) -> dict[str, object]:
    """The compose file (JSON, which is YAML): one service per daemon, fixed IPs on the
    cluster's own bridge, every name in every container's /etc/hosts (and the host's name as
    the bridge's gateway), the shared directories and the container's logs in
    ``<dir>/log/<service>``. No ``depends_on``: slurmd waits for slurmctld by itself, and a
    compose tool waiting on a container that failed to start would wait for ever."""
    hosts = [f"{s}:{cluster.ip(s)}" for s in SERVICES] + [f"{socket.gethostname()}:{cluster.gateway}"]
    services: dict[str, dict[str, object]] = {}
    for svc in SERVICES:
        volumes = [f"{p}:{p}" for p in shared] + [f"{cluster.dir / 'log' / svc}:/var/log/slurm"]
        services[svc] = {
            "image": image, "container_name": cluster.container(svc), "hostname": svc,
            "entrypoint": [str(DOCKER_DIR / "entrypoint.sh")],
            "command": ["slurmctld" if svc == "slurmctld" else "slurmd"],
            "environment": {"CSRUN_CLUSTER_DIR": str(cluster.dir)},
            "volumes": volumes,
            "networks": {"cluster": {"ipv4_address": cluster.ip(svc)}},
            "extra_hosts": hosts, "labels": {"csrun.cluster-dir": str(cluster.dir)},
            "stop_grace_period": "5s",
        }
    network = {"name": f"{cluster.project}-net",
               "ipam": {"config": [{"subnet": str(cluster.subnet), "gateway": cluster.gateway}]}}
    return {"name": cluster.project, "services": services, "networks": {"cluster": network}}


def write_files(cluster: Cluster, image: str) -> None:
    """slurm.conf, gres.conf, slurmdbd.conf (0600), the munge key (once, 0400) and the compose file."""
    etc = cluster.dir / "etc"
    for d in (etc, cluster.munge_socket.parent, cluster.dir / "run", *(cluster.dir / "log" / s for s in SERVICES)):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(cluster.munge_socket.parent, 0o700)
    key = etc / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
    write_text(cluster.conf, slurm_conf(cluster))
    write_text(etc / "gres.conf", (HERE / "gres.conf").read_text())
    write_text(etc / "slurmdbd.conf", slurmdbd_conf(cluster), mode=0o600)
    write_text(cluster.compose_file, json.dumps(compose_spec(cluster, image, shared_dirs(cluster)), indent=2) + "\n")
    write_text(etc / "topology", f"ENGINE={cluster.engine.name}\nACCOUNTING={int(cluster.accounting)}\n"
                                 f"PINNED=0\nNODE_CPUS={cluster.cpus}\nHOST_CPUS={os.cpu_count()}\nNODES={NODES}\n")


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` through a temporary file renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


# --------------------------------------------------------------------------- host munged
def munged_pid(cluster: Cluster) -> int | None:
    """The host's munged of this cluster, if it runs."""
    try:
        pid = int((cluster.dir / "run" / "munged.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_host_munged(cluster: Cluster) -> None:
    """The host's own munged with the cluster's key (the host is the login node)."""
    if munged_pid(cluster):
        return
    munged = shutil.which("munged") or "/usr/sbin/munged"
    if not Path(munged).exists():
        raise ClusterError("munged not found on the host: apt-get install munge (scripts/setup.sh does)")
    d = cluster.dir
    subprocess.run([munged, "--force", "-S", str(cluster.munge_socket), f"--key-file={d}/etc/munge.key",
                    f"--pid-file={d}/run/munged.pid", f"--log-file={d}/log/munged.log",
                    f"--seed-file={cluster.munge_socket.parent}/munged.seed"], check=True, capture_output=True)


def stop_host_munged(cluster: Cluster) -> None:
    pid = munged_pid(cluster)
    if pid is None:
        return
    os.kill(pid, 15)
    for _ in range(50):
        if munged_pid(cluster) is None:
            return
        time.sleep(0.1)
    os.kill(pid, 9)


# --------------------------------------------------------------------------- up / down
def running_containers(cluster: Cluster) -> dict[str, str]:
    """``{container name: status}`` of every container labelled with this cluster's directory."""
    proc = cluster.engine.run(["ps", "-a", "--filter", f"label=csrun.cluster-dir={cluster.dir}",
                               "--format", "{{.Names}}|{{.Status}}"], timeout=60)
    out = {}
    for line in proc.stdout.splitlines():
        if "|" in line:
            name, status = line.split("|", 1)
            out[name.strip()] = status.strip()
    return out


def check_names_free(cluster: Cluster) -> None:
    """Refuse when a container name of this cluster belongs to something else (another cluster
    directory, or not a csrun container at all)."""
    for svc in SERVICES:
        name = cluster.container(svc)
        proc = cluster.engine.run(["container", "inspect", "--format",
                                   '{{index .Config.Labels "csrun.cluster-dir"}}', name], timeout=60)
        if proc.returncode == 0 and proc.stdout.strip() != str(cluster.dir):
            owner = proc.stdout.strip() or "not a csrun test cluster"
            raise ClusterError(f"container name {name} is taken ({owner}): remove it, or choose another "
                               "CSRUN_CLUSTER_PORT")


def check_subnet_free(cluster: Cluster) -> None:
    """Refuse when the subnet overlaps a route of the host that is not this cluster's network."""
    if cluster.engine.run(["network", "inspect", f"{cluster.project}-net"], timeout=60).returncode == 0:
        return  # ours, from an earlier up
    routes = subprocess.run(["ip", "-4", "-o", "route"], capture_output=True, text=True).stdout
    for line in routes.splitlines():
        dest = line.split()[0] if line.split() else ""
        try:
            net = ipaddress.IPv4Network(dest, strict=False)
        except ValueError:
            continue
        if dest != "default" and net.overlaps(cluster.subnet):
            raise ClusterError(f"subnet {cluster.subnet} is taken on this host ({line.strip()}): "
                               "set CSRUN_COMPOSE_SUBNET to a free one, e.g. 10.214.7.0/24")


def node_states(cluster: Cluster) -> dict[str, str]:
    """``{node: state}`` from the host's ``sinfo`` ({} while slurmctld does not answer)."""
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=cluster.slurm_env(),
                              capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)


def wait_nodes(cluster: Cluster) -> None:
    """Until every node is idle (or busy with jobs) as the host's Slurm commands see it."""
    deadline = time.monotonic() + UP_TIMEOUT
    while time.monotonic() < deadline:
        states = node_states(cluster)
        if len(states) == NODES and all(s.rstrip("*") in ("idle", "alloc", "mix", "comp") and not s.endswith("*")
                                         for s in states.values()):
            return
        time.sleep(1.0)
    raise ClusterError(f"nodes not up after {UP_TIMEOUT:.0f} s (sinfo: {node_states(cluster) or 'no answer'}); "
                       f"logs in {cluster.dir}/log")


def cmd_up(cluster: Cluster) -> None:
    """Start the cluster (idempotent): image, files, host munged, containers; waits for the nodes."""
    check_engine(cluster.engine)
    cluster.dir.mkdir(parents=True, exist_ok=True)
    present = running_containers(cluster)
    if len(present) == len(SERVICES) and all(s.startswith("Up") for s in present.values()) and munged_pid(cluster):
        wait_nodes(cluster)
        cmd_status(cluster)
        return
    check_names_free(cluster)
    check_subnet_free(cluster)
    image = ensure_image(cluster.engine, cluster.dir)
    if present:
        cluster.engine.compose(cluster.project, cluster.compose_file, ["down", "-t", "5"])
    write_files(cluster, image)
    try:
        start_host_munged(cluster)
        proc = cluster.engine.compose(cluster.project, cluster.compose_file, ["up", "-d"], timeout=300)
        if proc.returncode != 0 or len(running_containers(cluster)) != len(SERVICES):
            raise ClusterError(explain_start_failure(cluster.engine, proc.stdout))
        wait_nodes(cluster)
    except BaseException:
        take_down(cluster)  # no half-started cluster left behind
        raise
    cmd_status(cluster)


def take_down(cluster: Cluster) -> None:
    """Remove the containers and the network (compose down, then anything still labelled) and
    stop the host's munged."""
    if cluster.compose_file.exists():
        cluster.engine.compose(cluster.project, cluster.compose_file, ["down", "-t", "5"])
    left = list(running_containers(cluster))
    if left:
        cluster.engine.run(["rm", "-f", "-t", "5", *left] if cluster.engine.name == "podman" else ["rm", "-f", *left],
                           timeout=120)
    if cluster.engine.run(["network", "inspect", f"{cluster.project}-net"], timeout=60).returncode == 0:
        cluster.engine.run(["network", "rm", f"{cluster.project}-net"], timeout=60)
    stop_host_munged(cluster)


def cmd_down(cluster: Cluster) -> None:
    if shutil.which(cluster.engine.name):
        take_down(cluster)
    else:
        stop_host_munged(cluster)
    print(f"cluster: down ({cluster.engine.name}, {cluster.dir})")


def cmd_status(cluster: Cluster) -> None:
    """Containers, the host's munged, the network, accounting and sinfo."""
    present = running_containers(cluster) if shutil.which(cluster.engine.name) else {}
    for svc in SERVICES:
        name = cluster.container(svc)
        print(f"{svc}: {present.get(name, 'absent')} ({cluster.engine.name} container {name}, {cluster.ip(svc)})")
    pid = munged_pid(cluster)
    print(f"munged (host): {f'running (pid {pid})' if pid else 'stopped'}")
    print(f"network: {cluster.project}-net {cluster.subnet}, the host is {cluster.gateway}")
    print(f"cpus: every node declares {cluster.cpus} CPUs; the containers share the host's "
          f"{os.cpu_count()} CPUs (no per-container CPU limit)")
    print("accounting: " + (f"slurmdbd and MariaDB in the slurmctld container ({cluster.ip('slurmctld')}:"
                            f"{SLURMDBD_PORT}); enforced: associations,limits,qos" if cluster.accounting
                            else "none (CSRUN_CLUSTER_ACCOUNTING=0)"))
    print(f"SLURM_CONF={cluster.conf}")
    if present:
        subprocess.run(["sinfo", "-N", "-o", "%N %P %t %c %G"], env=cluster.slurm_env(), timeout=15, check=False)


def cmd_exec(cluster: Cluster, node: str | None, argv: list[str]) -> None:
    """Run ``argv`` on the host with SLURM_CONF set, or inside container ``node``."""
    if not argv:
        raise ClusterError("exec: no command given")
    if node is not None and node not in SERVICES:
        raise ClusterError(f"exec --node {node}: no such container; one of {', '.join(SERVICES)}")
    if node is None:
        command, env = argv, cluster.slurm_env()
    else:
        tty = ["-t"] if sys.stdin.isatty() and sys.stdout.isatty() else []
        command = [cluster.engine.name, "exec", "-i", *tty, "-e", f"SLURM_CONF={cluster.conf}",
                   cluster.container(node), *argv]
        env = cluster.engine.env
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise ClusterError(f"exec: {command[0]}: {exc.strerror}") from exc


def exec_node(node: str | None, args: list[str]) -> tuple[str | None, list[str]]:
    """``--node NAME`` (or ``--node=NAME``) at the head of exec's arguments, which argparse
    leaves inside the command it takes verbatim."""
    if args[:1] == ["--node"] and len(args) >= 2:
        return args[1], args[2:]
    if args and args[0].startswith("--node="):
        return args[0].split("=", 1)[1], args[1:]
    return node, args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["podman", "docker"], required=True)
    parser.add_argument("command", choices=["up", "down", "status", "env", "exec"])
    parser.add_argument("--node", help="exec: run inside this container (slurmctld, node1..node5)")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    try:
        cluster = Cluster.from_env(ns.engine)
        if ns.command == "exec":
            node, args = exec_node(ns.node, ns.args)
            cmd_exec(cluster, node, args)
        elif ns.args:
            raise ClusterError(f"{ns.command}: unexpected arguments {' '.join(ns.args)}")
        elif ns.command == "env":
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            {"up": cmd_up, "down": cmd_down, "status": cmd_status}[ns.command](cluster)
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
