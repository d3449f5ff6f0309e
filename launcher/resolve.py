"""From the command line and the site configuration to what a launch needs, as named steps
the CLIs (:mod:`launcher.cli`) call in turn:

1. :func:`site_policy` — time limit, account, QOS, reservation, constraint, verbatim options
   (flag, else config key), checked without Slurm;
2. :func:`requeue_spec` — ``--requeue``'s signal, lead time and budget;
3. :func:`cluster_view` — the partition's nodes and a CPU node's CPUs from Slurm, or, for a
   ``--dry-run`` while slurmctld does not answer, what can be known without it;
4. :func:`check_site_names` — account, QOS, reservation and constraint features that Slurm
   does not know are refused, naming the valid ones it reports;
5. :func:`task_env` — what every task gets exported to quiet TensorFlow's C++ logging.

Every bad value raises :class:`CsrunError` naming the flag (or config key) and the value,
before anything is submitted.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from csrun_common.env import VERBOSE
from csrun_common.errors import CsrunError, SlurmUnavailable
from csrun_common.hostlist import expand_hostlist
from csrun_common.layout import flag

from . import slurm
from .config import KEY_OF, SiteConfig
from .policy import POLICY_KEYS, SitePolicy, constraint_features, merge_extra_args
from .requeue import RequeueSpec

__all__ = ["site_policy", "requeue_spec", "ClusterView", "cluster_view", "check_site_names",
           "task_env", "QUIET_ENV", "VERBOSE_ENV", "gres_nodes"]

#: Exported to every launched task unless the user's environment sets it already: hides
#: TensorFlow's C++ INFO lines (the tf.data service servers' configuration dumps, CPU
#: feature notes, XLA notes) and keeps its warnings and errors (``TF_CPP_MIN_LOG_LEVEL``:
#: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR).
QUIET_ENV = (("TF_CPP_MIN_LOG_LEVEL", "1"),)
#: ``--verbose`` (or ``CSRUN_VERBOSE=1``): every C++ log line.
VERBOSE_ENV = (("TF_CPP_MIN_LOG_LEVEL", "0"),)


def site_policy(given: Mapping[str, Any], cfg: SiteConfig) -> tuple[SitePolicy, dict[str, str]]:
    """The launch's :class:`SitePolicy`: the site's (``cfg.slurm``) with the policy flags
    ``given`` (parameter name -> value, ``None``: not given; :attr:`launcher.flags.CommonFlags.policy`)
    winning over their keys, and ``--slurm-arg`` adding to ``slurm.extra_args``; and, per field,
    where it came from (``--qos`` or ``slurm.qos``) for messages. Raises :class:`CsrunError`
    (:meth:`SitePolicy.validate`)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for k in POLICY_KEYS:
        assert k.spec is not None  # every [slurm] key has its flag
        value = given.get(k.spec.name)
        if k.type is list:  # the flag adds to the key; a bad config entry names the key, a bad flag the flag
            for arg in k.value(cfg.slurm):
                SitePolicy(extra_args=(arg,)).validate({k.attr: k.dotted})
            values[k.attr], sources[k.attr] = merge_extra_args(k.value(cfg.slurm), value or ()), k.flag
        else:
            values[k.attr] = value if value is not None else k.value(cfg.slurm)
            sources[k.attr] = k.flag if value is not None else k.dotted
    policy = SitePolicy(**values)
    policy.validate(sources)
    return policy, sources


def requeue_spec(enabled: bool | None, signal_spec: str | None, max_requeues: int | None, cfg: SiteConfig,
                 policy: SitePolicy, time_source: str) -> RequeueSpec | None:
    """``--requeue`` (else ``requeue.enabled``) with its signal (``--requeue-signal``, else
    ``requeue.signal``) and budget (``--max-requeues``, else ``requeue.max_requeues``);
    ``None`` without requeue. Raises :class:`CsrunError` for a bad signal spec, a negative
    budget, or a lead time not shorter than the time limit."""
    on = cfg.requeue if enabled is None else enabled
    sig, budget = KEY_OF["requeue_signal"], KEY_OF["max_requeues"]
    if not on:
        for given, k in ((signal_spec, sig), (max_requeues, budget)):
            if given is not None:
                raise CsrunError(f"{k.flag} {given}: only with {KEY_OF['requeue'].flag}")
        return None
    sig_source = sig.flag if signal_spec is not None else sig.dotted
    spec = RequeueSpec.parse(
        signal_spec if signal_spec is not None else cfg.requeue_signal,
        max_requeues if max_requeues is not None else cfg.max_requeues,
        flag=sig_source, max_flag=budget.flag if max_requeues is not None else budget.dotted)
    spec.check_time_limit(policy.time_seconds, time_source, sig_source)
    return spec


@dataclass(frozen=True)
class ClusterView:
    """What a launch knows of the cluster.

    Attributes:
        nodes: the partition's nodes (``sinfo``); empty when Slurm did not answer.
        node_cpus: CPUs of one CPU node (the smallest), or ``None`` when unknown.
        online: Slurm answered; ``False`` only for a ``--dry-run`` without slurmctld.
        note: why the view is partial (the dry run prints it on stderr).
    """

    nodes: tuple[slurm.NodeInfo, ...] = ()
    node_cpus: int | None = None
    online: bool = True
    note: str = ""


def gres_nodes(value: str) -> frozenset[str]:
    """The node names of the site's ``gres.node`` (a name, a comma list or a Slurm hostlist,
    ``"gpu[01-04]"``: :func:`csrun_common.hostlist.expand_hostlist`); empty for ``""``. Raises
    :class:`CsrunError` naming the key for an expression that does not parse."""
    try:
        return frozenset(expand_hostlist(value))
    except ValueError as exc:
        raise CsrunError(f"gres.node = {value!r}: not a node name or Slurm hostlist ({exc})") from None


def cluster_view(partition: str, partition_source: str, cfg: SiteConfig, dry_run: bool,
                 exclude: str = "") -> ClusterView:
    """Ask Slurm for the partition's nodes and a CPU node's CPUs; raises
    :class:`CsrunError` for an unknown partition and :class:`SlurmUnavailable` when
    slurmctld does not answer — except for a ``--dry-run``, which then goes on with
    ``defaults.node_cpus`` (when set) and says what it could not check. ``exclude``: the GRES
    node(s) (``gres.node``, :func:`gres_nodes`), left out of the CPU node's CPUs.

    Slurm is pinged first (:func:`launcher.slurm.ping`, one connection attempt): a controller
    that says it is down ends a launch at once, and a dry run goes on without it after at most
    :data:`launcher.slurm.PING_TIMEOUT_S` instead of waiting out ``sinfo``'s query timeout
    (issue 24: 5.2 s measured before)."""
    try:
        state, message = slurm.ping()
        if state == "down" or (dry_run and state == "timeout"):
            raise SlurmUnavailable(message)
        nodes = slurm.list_nodes(partition, partition_source)
    except SlurmUnavailable as exc:
        if not dry_run:
            raise
        return ClusterView((), cfg.node_cpus or None, online=False,
                           note=f"{exc}; printed without checking the partition, node count, GRES, account, "
                                "QOS, reservation and constraint")
    return ClusterView(tuple(nodes), slurm.cpu_node_cpus(nodes, exclude=gres_nodes(exclude)))


def offline_node_cpus(view: ClusterView, tasks_per_node: int | None, cpus_per_task: int | None,
                      single_task_nodes: int) -> int:
    """A CPU node's CPUs for a layout planned without Slurm: ``defaults.node_cpus`` when set;
    else ``T × C`` when both the tasks per node and the CPUs per task are given (the
    layout needs no more of a node) and no single-task node must hold a whole node.
    Raises :class:`CsrunError` naming what is missing."""
    if view.node_cpus:
        return view.node_cpus
    if single_task_nodes:
        raise CsrunError(f"{flag('single_task_nodes')} {single_task_nodes}: a single-task node holds all the CPUs of a "
                         "node, which are unknown while slurmctld does not answer; set defaults.node_cpus in "
                         "the site config")
    if tasks_per_node is None or cpus_per_task is None:
        raise CsrunError("--dry-run: slurmctld does not answer and the CPUs of a node are unknown: give "
                         f"{flag('tasks_per_node')} and {flag('cpus_per_task')}, or set defaults.node_cpus in the "
                         "site config")
    return tasks_per_node * cpus_per_task


def _unknown(source: str, value: str, kind: str, valid: Sequence[str]) -> CsrunError:
    listed = ", ".join(valid) if valid else "none"
    plural = kind if kind == "QOS" else f"{kind}s"
    return CsrunError(f"{source} {value!r}: no such {kind} in Slurm ({plural}: {listed})")


def check_site_names(policy: SitePolicy, sources: Mapping[str, str]) -> None:
    """Refuse an account, QOS, reservation or constraint feature Slurm does not know,
    naming the value and the valid ones it reports. Accounts and QOS are checked only where
    the cluster keeps accounting (``sacctmgr``; without it Slurm does not check them
    either). Raises :class:`CsrunError`; :class:`SlurmUnavailable` when slurmctld does not
    answer."""
    if policy.account:
        known = slurm.accounts()
        if known is not None and policy.account not in known:
            raise _unknown(sources.get("account", "--account"), policy.account, "account", known)
    if policy.qos:
        known = slurm.qos_names()
        if known is not None and policy.qos not in known:
            raise _unknown(sources.get("qos", "--qos"), policy.qos, "QOS", known)
    if policy.reservation:
        known = slurm.reservations()
        for name in policy.reservation.split(","):
            if name not in known:
                raise _unknown(sources.get("reservation", "--reservation"), name, "reservation", known)
    if policy.constraint:
        known = slurm.node_features(policy.partition)
        for name in constraint_features(policy.constraint):
            if name not in known:
                raise _unknown(sources.get("constraint", "--constraint"), name, "feature", known)


def task_env(verbose: bool, environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """Variables exported to every task: :data:`QUIET_ENV`, or :data:`VERBOSE_ENV` with
    ``--verbose`` or ``CSRUN_VERBOSE=1``; a variable the user's environment already sets is
    left to it (``--export=ALL`` carries it)."""
    env = os.environ if environ is None else environ
    loud = verbose or VERBOSE.flag(env)
    chosen = VERBOSE_ENV if loud else QUIET_ENV
    return tuple((k, v) for k, v in chosen if k not in env)
