"""The compose test cluster's container engine (``compose_cluster.py``): podman (with
podman-compose) or Docker (``docker compose``) run as commands with their output in the
cluster's log (:class:`Engine`), the checks that refuse a missing or broken engine with the
fix (:func:`check_engine`, :func:`explain_start_failure`), and the cluster's image, built from
``docker/Dockerfile`` when missing, on a base image made with debootstrap when no registry
answers (:func:`ensure_image`). Every failure is a :class:`ClusterError`: one line, the cause
and the fix.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOCKER_DIR = HERE / "docker"
BASE = "debian:bookworm-slim"


class ClusterError(Exception):
    """A failure reported as one line (cause and fix), exit status 2."""


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
        """``<engine> args``, output appended to the log; :class:`ClusterError` if ``check`` and it fails."""
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
