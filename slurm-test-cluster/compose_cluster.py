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
``up`` takes down what it started. This module holds the commands and the host's munged;
``compose_config.py`` the cluster's addresses and the files ``up`` writes, ``compose_engine.py``
the engine and the image.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from compose_config import NODES, SERVICES, SLURMDBD_PORT, Cluster, write_files
from compose_engine import ClusterError, check_engine, ensure_image, explain_start_failure

UP_TIMEOUT = float(os.environ.get("CSRUN_CLUSTER_UP_TIMEOUT", "180"))


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
