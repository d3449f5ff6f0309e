"""Bad input to ``slurm-test-cluster/cluster``: one line on stderr naming the cause and the fix,
exit status 2, and no half-started cluster left behind.

Each case uses its own cluster directory and port (``CSRUN_CLUSTER_DIR``,
``CSRUN_CLUSTER_PORT``), so the session's test cluster is not touched. The compose cases need
podman (they skip without it); the broken-engine case needs the cluster's image, which it
builds when missing.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLUSTER

pytestmark = pytest.mark.cluster

needs_podman = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")


def cluster(args: list[str], env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The run failed with exit status 2 and exactly one line on stderr holding every needle."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("cluster: ") and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def own_env(tmp_path: Path, port: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "CSRUN_TEST_ENGINE")}
    env.update(CSRUN_CLUSTER_DIR=str(tmp_path / "cluster"), CSRUN_CLUSTER_PORT=str(port), **extra)
    return env


def processes_naming(path: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if str(path) in ln and "pytest" not in ln]


def containers_labelled(directory: Path) -> str:
    return subprocess.run(["podman", "ps", "-a", "--filter", f"label=csrun.cluster-dir={directory}",
                           "--format", "{{.Names}}"], capture_output=True, text=True).stdout.strip()


def network_exists(name: str) -> bool:
    return subprocess.run(["podman", "network", "inspect", name], capture_output=True).returncode == 0


def test_unknown_engine(tmp_path):
    one_line(cluster(["up", "--engine", "kubernetes"], own_env(tmp_path, 17410)), "--engine", "kubernetes")


def test_native_port_taken_leaves_nothing_running(tmp_path):
    port = 17420
    with socket.socket() as busy:   # MariaDB's port, CSRUN_CLUSTER_PORT + 41
        busy.bind(("127.0.0.1", port + 41))
        busy.listen()
        proc = cluster(["up", "--nodes", "2"], own_env(tmp_path, port), timeout=120)
    one_line(proc, str(port + 41), "taken", "CSRUN_CLUSTER_PORT")
    assert processes_naming(tmp_path / "cluster") == []   # munged, started first, is stopped again


def test_compose_without_the_engine_installed(tmp_path):
    # A PATH holding only what the cluster script needs before it looks for podman.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").symlink_to(sys.executable)
    env = own_env(tmp_path, 17430, PATH=str(bin_dir))
    one_line(cluster(["up", "--engine", "podman"], env), "podman is not installed", "apt-get install podman")


@pytest.mark.skipif(subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
                    if shutil.which("docker") else False, reason="a working docker compose is installed")
def test_compose_with_docker_missing_or_without_compose(tmp_path):
    proc = cluster(["up", "--engine", "docker"], own_env(tmp_path, 17440))
    one_line(proc, "--engine docker")


@needs_podman
def test_compose_container_name_taken(tmp_path):
    port = 17450
    name = f"csrun{port}-podman-node3"
    # Any local image will do for a container that is only created, never started.
    images = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True).stdout.split()
    images = [i for i in images if "<none>" not in i]
    if not images:
        pytest.skip("no local podman image to create a squatting container from")
    subprocess.run(["podman", "create", "--name", name, images[0], "true"], check=True, capture_output=True)
    try:
        proc = cluster(["up", "--engine", "podman"], own_env(tmp_path, port))
        one_line(proc, name, "taken", "CSRUN_CLUSTER_PORT")
        assert containers_labelled(tmp_path / "cluster") == ""
        assert not network_exists(f"csrun{port}-podman-net")
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True)


def _a_host_subnet() -> str:
    """A /24 inside a network this host already routes (its own LAN)."""
    routes = subprocess.run(["ip", "-4", "-o", "route"], capture_output=True, text=True).stdout.splitlines()
    for line in routes:
        dest = line.split()[0]
        if dest != "default" and "/" in dest:
            net = ipaddress.IPv4Network(dest, strict=False)
            return str(net if net.prefixlen >= 24 else next(net.subnets(new_prefix=24)))
    pytest.skip("this host routes no subnet but the default")


@needs_podman
def test_compose_subnet_taken(tmp_path):
    subnet = _a_host_subnet()
    proc = cluster(["up", "--engine", "podman"], own_env(tmp_path, 17460, CSRUN_COMPOSE_SUBNET=subnet))
    one_line(proc, f"subnet {subnet} is taken", "CSRUN_COMPOSE_SUBNET")
    assert containers_labelled(tmp_path / "cluster") == ""


@needs_podman
@pytest.mark.parametrize("conf", [
    # crun with podman's default ulimits: "crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted"
    '[engine]\nruntime = "crun"\n',
    # crun without them: "crun: cgroups in hybrid mode not supported" (or crun not installed at all)
    '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "crun"\n',
], ids=["crun-ulimits", "crun-cgroups"])
def test_compose_broken_engine_leaves_nothing_behind(tmp_path, conf):
    if sys.platform != "linux":
        pytest.skip("linux only")
    port = 17470
    (tmp_path / "containers.conf").write_text(conf)
    env = own_env(tmp_path, port, CSRUN_CONTAINERS_CONF=str(tmp_path / "containers.conf"))
    line = one_line(cluster(["up", "--engine", "podman"], env))
    assert "crun" in line and ("runc" in line), line   # the cause (crun) and the fix (runc)
    assert containers_labelled(tmp_path / "cluster") == ""
    assert not network_exists(f"csrun{port}-podman-net")
    assert processes_naming(tmp_path / "cluster") == []   # the host's munged is stopped again
