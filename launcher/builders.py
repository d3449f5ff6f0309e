"""Pure builders: a request (dataclass) → the srun argv or the sbatch script text.

In the style of torchx's ``slurm_scheduler``: the request is data, ``materialize_*``
turns it into exactly what will run, and ``--dry-run`` prints that. Every option of
every het component is written out (srun(1): "Heterogeneous Job Support"; in an sbatch
het job each srun component names its ``--het-group``). Nothing here runs a process.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from csrun_common.autoscale import AutoscaleSpec
from csrun_common.env import LOG_DIR, SHARD_PLAN, TaskEnv
from csrun_common.roles import RENDEZVOUS_ENV

from .attempts import SCRIPT_ATTEMPT_DIR
from .container import Container
from .layout import CHIEF, WORKER, Component, JobLayout
from .policy import SitePolicy
from .requeue import REQUEUE_EXIT, RequeueSpec
from .tasklog import EXIT_STATUS_FILE, STATUS_LINE, TaskGroup, TaskOutput, encode_groups

TEMPLATES = Path(__file__).resolve().parent / "templates"

#: The task-side module every csrun_wse task runs its command through (named, never imported:
#: the launcher does not import the runtime).
SUPERVISE = "csrun_runtime.supervise"

#: Seconds the input workers' own job (``--survive-node-loss``) gets, after the chief's srun
#: ended, to end by itself (its workers leave on the chief's ``done.json``) before it is
#: cancelled: by csrun_wse on the srun path, by the batch script on the sbatch path.
WORKER_JOB_GRACE_S = 60

#: srun options of every csrun_wse launch on the srun path: each line of a task labelled with
#: its task id, and srun's lines naming the job and each task's node (read by
#: :mod:`launcher.tasklog`, which keeps srun's verbose lines in the task log). Such a launch
#: leaves out ``--unbuffered``: with it, srun labels each write of a task as a line of its own
#: (``ValueError`` / ``: `` / ``boom``, measured with Slurm 22.05); without it, slurmstepd
#: forwards whole lines, as soon as each is written (tasks run with ``PYTHONUNBUFFERED=1``).
OUTPUT_OPTIONS = ("--label", "--verbose")

#: The role :meth:`WseRequest.task_output` gives the chief's het group of several trainer ranks
#: (every task a rank; :mod:`launcher.tasklog` names a failing task's role with it).
RANKS = "rank"

#: python-ws / python-pt as the first word of a command: the execution mode exported.
EXECUTION_MODES = {"python-ws": "weight_streaming", "python-pt": "pytorch"}


@cache
def _template(name: str):
    import jinja2  # only the sbatch path needs it

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda s: shlex.quote(str(s))
    return env.get_template(name)


def expand_python_word(command: Sequence[str], python: str) -> tuple[list[str], str | None]:
    """``python-ws run.py ...`` → ``[python, "run.py", ...]`` and the execution mode; the command
    unchanged and ``None`` when its first word is not ``python-ws``/``python-pt``."""
    if command and command[0] in EXECUTION_MODES:
        return [python, *command[1:]], EXECUTION_MODES[command[0]]
    return list(command), None


def protect_argv(command: Sequence[str], python: str) -> list[str]:
    """``command`` safe on an srun line: one holding a lone ``:`` (srun's het separator) runs
    through :mod:`launcher.argv_exec`, which execs the exact argv from JSON."""
    if ":" in command:
        return [python, "-m", "launcher.argv_exec", json.dumps(list(command))]
    return list(command)


def _common(policy: SitePolicy, job_name: str) -> list[str]:
    return [f"--job-name={job_name}", *policy.options()]


#: The first Slurm release whose srun no longer takes the CPUs per task (``--cpus-per-task=``)
#: from the job (Slurm 22.05 release notes: "srun will no longer read in SLURM_CPUS_PER_TASK",
#: so a step gives srun's ``--cpus-per-task=`` itself).
SRUN_REPEATS_CPUS_FROM = (22, 5)


def srun_needs_cpus_per_task(slurm_version: tuple[int, int] | None) -> bool:
    """Whether a batch job's srun step repeats ``--cpus-per-task=``: Slurm ≥ 22.05, or unknown."""
    return slurm_version is None or tuple(slurm_version) >= SRUN_REPEATS_CPUS_FROM


def _step_resources(allocation_options: list[str], slurm_version: tuple[int, int] | None = None) -> list[str]:
    """Options of an allocation that an srun step inside it repeats: the task shape, GRES and
    ``--cpus-per-task=`` where srun does not inherit it; not the job-level ones (name, policies,
    exclusive, exclude, signal)."""
    keep = ["--nodes=", "--ntasks=", "--ntasks-per-node=", "--gres="]
    if srun_needs_cpus_per_task(slurm_version):
        keep.append("--cpus-per-task=")
    return [o for o in allocation_options if o.startswith(tuple(keep))]


def _export(env: Sequence[tuple[str, str]]) -> str:
    return ",".join(["ALL"] + [f"{k}={v}" for k, v in env])


@dataclass(frozen=True)
class WseRequest:
    """A csrun_wse launch: a :class:`JobLayout` and the command every task runs.

    ``command`` is the final argv (``python-ws`` already expanded); ``exclude_node`` is
    the GRES node, kept out of the non-chief components; ``job_env`` are variables the
    same for the whole job (exported by csrun_wse itself so that any value survives).
    ``policy`` holds the site options written into every component; ``requeue`` the
    warning signal and retry budget of ``--requeue`` (:mod:`launcher.requeue`);
    ``task_env`` simple variables added to every component's ``--export`` (the quiet
    TensorFlow logging of csrun_wse); ``slurm_version`` (major, minor) selects
    version-dependent options (``None``: the newest behaviour); ``autoscale`` the
    ``--autoscale`` bounds, exported to every task as ``CSRUN_AUTOSCALE``. The layout's
    ``chief_input_cpus`` reaches the chief's component as ``CSRUN_CHIEF_INPUT_CPUS``. With
    several trainer ranks (the layout's :attr:`~launcher.layout.JobLayout.world_size` > 1) every
    component gets ``CSRUN_WORLD_SIZE`` and ``CSRUN_LOCAL_WORLD_SIZE``, and ``CSRUN_MASTER_PORT``
    when ``master_port`` (the site's ``ranks.master_port``; 0: each rank derives it from the job
    id) is set (docs/MULTI-RANK.md).

    ``worker_job`` (``--survive-node-loss``): the ``worker`` component is launched as a job of
    its own with ``--no-kill`` (:meth:`materialize_worker_srun`) beside the chief's job
    (:meth:`materialize_srun`), both tasks sets finding each other by ``rendezvous_key``
    (``CSRUN_RENDEZVOUS_KEY``). Why: slurmctld ends every component of a het job when any
    node of it fails (a component of one node cannot lose it), whereas a job of two or more
    nodes submitted with ``--no-kill`` keeps running on the others (sbatch(1)/srun(1)
    ``--no-kill``; measured on the test cluster, docs/RESILIENCE.md "A lost node").
    """

    layout: JobLayout
    command: tuple[str, ...]
    python: str
    container: Container = field(default_factory=Container)
    execution_mode: str | None = None
    policy: SitePolicy = field(default_factory=SitePolicy)
    exclude_node: str = ""
    job_name: str = "csrun_wse"
    shard_plan: str | None = None
    requeue: RequeueSpec | None = None
    task_env: tuple[tuple[str, str], ...] = ()
    slurm_version: tuple[int, int] | None = None
    autoscale: AutoscaleSpec | None = None
    worker_job: bool = False
    rendezvous_key: str = ""
    master_port: int = 0

    def chief_components(self) -> tuple[Component, ...]:
        """The chief's job's components: all, or all but the ``worker`` one with ``worker_job``."""
        return tuple(c for c in self.layout.components if not (self.worker_job and c.role == WORKER))

    def worker_job_component(self) -> Component | None:
        """The component launched as the input workers' own job (``worker_job``), else ``None``."""
        return self.layout.worker_component if self.worker_job else None

    def task_command(self) -> list[str]:
        """Each task's argv (container-wrapped, ``:``-safe) through :data:`SUPERVISE`, which restarts a
        killed input worker (docs/RESILIENCE.md "Lost input workers")."""
        return self.container.wrap([self.python, "-m", SUPERVISE,
                                    *protect_argv(self.command, self.python)])

    def job_env(self) -> list[tuple[str, str]]:
        """Variables csrun_wse sets in its own environment before srun (``--export=ALL``)."""
        env = [(SHARD_PLAN.name, self.shard_plan)] if self.shard_plan else []
        if self.worker_job:
            env.append((RENDEZVOUS_ENV, self.rendezvous_key))
        return env

    def component_env(self, comp: Component) -> list[tuple[str, str]]:
        """The role contract of ``docs/CONTRACT.md`` for one component: its
        :class:`csrun_common.env.TaskEnv`, encoded, then :attr:`task_env`."""
        own_job = comp is self.worker_job_component()  # its SLURM_PROCID starts at 0
        task = TaskEnv(
            comp.role, comp.het_group, 0 if own_job else comp.task_offset, comp.worker_offset,
            self.layout.num_input_workers, self.layout.num_tasks, comp.cpus_per_task,
            execution_mode=self.execution_mode,
            stop_signals=self.requeue.stop_signals() if self.requeue is not None else None,
            autoscale=self.autoscale.to_env() if self.autoscale is not None else None,
            chief_input_cpus=self.layout.chief_input_cpus if comp.role == CHIEF else 0,
            worker_job=self.worker_job, world_size=self.layout.world_size,
            local_world_size=self.layout.local_world_size,
            master_port=(self.master_port or None) if self.layout.world_size > 1 else None)
        return task.encode() + list(self.task_env)

    def allocation_options(self, comp: Component) -> list[str]:
        """Resource options of one component (shared by srun and ``#SBATCH``): name, site
        policies, task shape, GRES, exclusivity, exclusion, and the ``--requeue`` warning
        signal."""
        opts = _common(self.policy, self.job_name)
        opts += [f"--nodes={comp.nodes}", f"--ntasks={comp.ntasks}",
                 f"--ntasks-per-node={comp.tasks_per_node}"]
        if comp.cpus_per_task:
            opts.append(f"--cpus-per-task={comp.cpus_per_task}")
        if comp.gres:
            opts.append(f"--gres={comp.gres}")
        if comp.exclusive:
            opts.append("--exclusive")
        if comp.role != CHIEF and self.exclude_node:
            opts.append(f"--exclude={self.exclude_node}")
        if self.requeue is not None:
            opts.append(self.requeue.sbatch_option())
        return opts

    def step_options(self, comp: Component) -> list[str]:
        """Step options of one component: distribution, failure policy, output, env."""
        return [f"--distribution={comp.distribution}", "--kill-on-bad-exit=1", "--unbuffered",
                f"--export={_export(self.component_env(comp))}", *self.container.srun_options()]

    def materialize_srun(self) -> list[str]:
        """The full srun argv of the chief's job: ``srun --label --verbose <comp 0 options> CMD :
        <comp 1 options> CMD ...`` (without the ``worker`` component with ``worker_job``).
        ``--label`` and ``--verbose`` (:data:`OUTPUT_OPTIONS`) let csrun_wse tell the tasks'
        lines apart and the node of each (:mod:`launcher.tasklog`)."""
        argv = ["srun", *OUTPUT_OPTIONS]
        cmd = self.task_command()
        for i, comp in enumerate(self.chief_components()):
            if i:
                argv.append(":")
            step = [o for o in self.step_options(comp) if o != "--unbuffered"]  # see OUTPUT_OPTIONS
            argv += self.allocation_options(comp) + step + cmd
        return argv

    def task_output(self) -> TaskOutput:
        """A fresh :class:`~launcher.tasklog.TaskOutput` for one launch of
        :meth:`materialize_srun`: its het components (global task ids as ``--label`` numbers
        them) and the statuses that are no failure (0, and :data:`REQUEUE_EXIT` with
        ``requeue``)."""
        groups, first = [], 0
        for comp in self.chief_components():
            role = RANKS if comp.role == CHIEF and comp.trainer_tasks > 1 else comp.role
            groups.append(TaskGroup(comp.het_group, role, first, comp.ntasks))
            first += comp.ntasks
        ok = {0, REQUEUE_EXIT} if self.requeue is not None else {0}
        return TaskOutput(groups=tuple(groups), ok_statuses=frozenset(ok))

    def worker_srun_options(self) -> list[str] | None:
        """The srun options of the input workers' own job (``worker_job``), else ``None``: the
        ``worker`` component's options with ``--no-kill`` for ``--kill-on-bad-exit`` (srun(1):
        "Do not automatically terminate a job if one of the nodes it has been allocated
        fails ... Tasks launched using this option will not be considered terminated (e.g.
        -K, --kill-on-bad-exit ... will have no effect upon the job step)")."""
        comp = self.worker_job_component()
        if comp is None:
            return None
        step = ["--no-kill" if o == "--kill-on-bad-exit=1" else o for o in self.step_options(comp)]
        return [*self.allocation_options(comp), *step]

    def materialize_worker_srun(self) -> list[str] | None:
        """The srun argv of the input workers' own job (``worker_job``), else ``None``:
        ``srun`` :meth:`worker_srun_options` and the task command."""
        opts = self.worker_srun_options()
        return None if opts is None else ["srun", *opts, *self.task_command()]

    def srun_line(self) -> str:
        """POSIX-shell lines that reproduce the launch, job env included: the chief's srun,
        preceded by the input workers' job run in the background with ``worker_job``."""
        env = [f"{k}={v}" for k, v in self.job_env()]
        prefix = ["env", *env] if env else []
        chief = shlex.join(prefix + self.materialize_srun())
        workers = self.materialize_worker_srun()
        return chief if workers is None else f"{shlex.join(prefix + workers)} &\n{chief}"

    def materialize_sbatch(self) -> str:
        """The sbatch het-job script (``templates/csrun_wse.sbatch.j2``).

        With ``worker_job`` the script's job is the chief's (:meth:`chief_components`), and the
        script itself starts the input workers' own job beside the chief's srun: an srun of
        :meth:`worker_srun_options` run outside this job (every ``SLURM*`` variable but
        ``SLURM_CONF`` unset, and ``SBATCH_*``, ``SRUN_*``, ``SALLOC_*``: srun asks for a new
        allocation instead of starting a step of this one, and reads none of its options),
        in a process group of its own (``set -m``: an asynchronous command of a shell without
        job control ignores SIGINT, measured on the test cluster to leave srun deaf to it). It
        is named ``<job_name>-workers.<SLURM_JOB_ID>.<SLURM_RESTART_COUNT>``; after the chief's
        srun it gets :data:`WORKER_JOB_GRACE_S` seconds to end, and the script's ``EXIT`` trap
        cancels it by that name (``scancel --name``), which also covers a cancelled or
        requeued chief's job. Each allocation has its own rendezvous key,
        ``<rendezvous_key>.r<SLURM_RESTART_COUNT>``. The chief's srun runs with
        :data:`OUTPUT_OPTIONS` and its output passes through :meth:`output_filter`, as on the srun
        path; the script exits with srun's status."""
        comps = []
        chief_comps = self.chief_components()
        for comp in chief_comps:
            sbatch = self.allocation_options(comp)
            if self.requeue is not None:
                sbatch.append("--requeue")
            if comp.het_group == 0:
                sbatch.append(f"--output={self.job_name}-%j.out")
                if self.requeue is not None:  # every allocation appends to the one output file
                    sbatch.append("--open-mode=append")
            # --het-group only in a het job: srun refuses it in a one-component job ("No
            # directives to start application on any available hetjob components").
            group = [f"--het-group={comp.het_group}"] if len(chief_comps) > 1 else []
            srun = group + _step_resources(self.allocation_options(comp), self.slurm_version) \
                + [o for o in self.step_options(comp) if o != "--unbuffered"]  # see OUTPUT_OPTIONS
            comps.append({**comp.__dict__, "sbatch_options": sbatch, "srun_options": srun})
        wcomp, workers = self.worker_job_component(), self.worker_srun_options() or []
        worker_job = None if wcomp is None else {
            "name": f"{self.job_name}-workers", "key": self.rendezvous_key, "grace": WORKER_JOB_GRACE_S,
            "nodes": wcomp.nodes, "ntasks": wcomp.ntasks,
            "srun_options": [o for o in workers if not o.startswith("--job-name=")]}
        return _template("csrun_wse.sbatch.j2").render(
            components=comps,
            command=self.task_command(),
            job_env=[(k, v) for k, v in self.job_env() if k != RENDEZVOUS_ENV],
            total_nodes=self.layout.total_nodes,
            num_tasks=self.layout.num_tasks,
            num_input_workers=self.layout.num_input_workers,
            world_size=self.layout.world_size,
            requeue=self.requeue,
            requeue_exit=REQUEUE_EXIT,
            worker_job=worker_job,
            rendezvous_env=RENDEZVOUS_ENV,
            log_dir_env=LOG_DIR,
            attempt_dir=SCRIPT_ATTEMPT_DIR % (LOG_DIR.name, self.job_name), exit_status_file=EXIT_STATUS_FILE,
            output_options=OUTPUT_OPTIONS,
            output_filter=self.output_filter(),
            status_line=STATUS_LINE,
        )

    def output_filter(self) -> list[str]:
        """The batch script's filter of its srun's output (``python -m launcher.tasklog``, in the
        container when there is one; :func:`launcher.tasklog.main`): the job's output file then
        reads as csrun_wse's terminal does. Its ``--log`` is added by the script."""
        out = self.task_output()
        ok = ",".join(str(s) for s in sorted(out.ok_statuses))
        return self.container.wrap([self.python, "-m", "launcher.tasklog", "--groups", encode_groups(out.groups),
                                    "--ok", ok])


@dataclass(frozen=True)
class CpuRequest:
    """A csrun_cpu run: one task on one CPU node.

    With ``alloc_node`` the task holds the whole node (``--exclusive`` and all its
    ``node_cpus``), as the original's ``--alloc-node`` default; otherwise it asks for
    ``cpus_per_task``. ``exclude_node`` (the GRES node) is always excluded.
    """

    command: tuple[str, ...]
    python: str
    alloc_node: bool = True
    node_cpus: int = 1
    cpus_per_task: int = 1
    container: Container = field(default_factory=Container)
    policy: SitePolicy = field(default_factory=SitePolicy)
    exclude_node: str = ""
    pty: bool = False
    job_name: str = "csrun_cpu"
    task_env: tuple[tuple[str, str], ...] = ()
    slurm_version: tuple[int, int] | None = None

    def allocation_options(self) -> list[str]:
        """Resource options (shared by srun and ``#SBATCH``): one task on one node, all the
        node's CPUs and ``--exclusive`` with ``alloc_node``, never the GRES node."""
        opts = _common(self.policy, self.job_name)
        cpus = self.node_cpus if self.alloc_node else self.cpus_per_task
        opts += ["--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}"]
        if self.alloc_node:
            opts.append("--exclusive")
        if self.exclude_node:
            opts.append(f"--exclude={self.exclude_node}")
        return opts

    def step_options(self) -> list[str]:
        """Step options: failure policy, ``--pty`` for an interactive terminal (else
        ``--unbuffered``), ``task_env`` (``--export=ALL,...``) and the Pyxis container options."""
        opts = ["--kill-on-bad-exit=1", "--pty" if self.pty else "--unbuffered"]
        if self.task_env:
            opts.append(f"--export={_export(self.task_env)}")
        return opts + self.container.srun_options()

    def task_command(self) -> list[str]:
        """The argv the task executes (container-wrapped, ``:``-safe)."""
        return self.container.wrap(protect_argv(self.command, self.python))

    def materialize_srun(self) -> list[str]:
        """The srun argv."""
        return ["srun", *self.allocation_options(), *self.step_options(), *self.task_command()]

    def srun_line(self) -> str:
        """One POSIX-shell line that reproduces the run."""
        return shlex.join(self.materialize_srun())

    def materialize_sbatch(self) -> str:
        """The sbatch script (``templates/csrun_cpu.sbatch.j2``)."""
        sbatch = self.allocation_options() + [f"--output={self.job_name}-%j.out"]
        srun = _step_resources(self.allocation_options(), self.slurm_version) \
            + [o for o in self.step_options() if o != "--pty"]
        return _template("csrun_cpu.sbatch.j2").render(
            sbatch_options=sbatch, srun_options=srun, command=self.task_command(),
            alloc_node=self.alloc_node)
