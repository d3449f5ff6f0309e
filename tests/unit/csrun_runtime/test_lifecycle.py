"""csrun_runtime.lifecycle: one task's life for every backend. The hooks are each real backend's
``runner.Hooks`` (its params, its exception types) with the chief and the input worker replaced by
doubles of csrun's own interfaces (``backend.ChiefTask``, ``backend.Task``): nothing trains, no
Slurm, no framework is imported. What is checked: the exit-code ladder for each kind of
exception, ``done.json``'s status (``ok``, ``failed``, ``stopped``) for both frameworks, the chief
closed after ``done.json``, trainer ranks other than 0 idle in the modes rank 0 runs alone, and
an input worker's and a bad environment's exit codes through :func:`lifecycle.main`."""
from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
import yaml

from csrun_common.roles import Role
from csrun_runtime import lifecycle, preemption, registry
from csrun_runtime.params import ParamsError, resolve_params
from csrun_runtime.rankgroup import RankLost
from csrun_runtime.rendezvous import Rendezvous
from csrun_runtime.streams import InputStalled
from tests.fixtures.runtime.helpers import task_env

FRAMEWORKS = registry.FRAMEWORKS


@pytest.fixture(autouse=True)
def signals():
    """:func:`lifecycle.main` installs the stop-signal handlers: restore them, forget a stop."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)}
    preemption.reset()
    yield
    for s, h in old.items():
        signal.signal(s, h)
    preemption.reset()


class Lines(logging.Handler):
    """The runtime's log records: ``(level name, message, with a traceback)``."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[tuple[str, str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.got.append((record.levelname, record.getMessage(), record.exc_info is not None))


@pytest.fixture()
def lines():
    """The runtime's log records while the test runs (:func:`lifecycle.main` sets its logging up
    anew, as every task does: restored after the test)."""
    log = logging.getLogger("csrun.runtime")
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    handler = Lines()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler.got
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = propagate


class FakeChief:
    """A double of ``backend.ChiefTask``: its input workers report, then its mode returns
    ``outcome`` (an int) or raises it; ``close`` records whether ``done.json`` was there."""

    def __init__(self, rdv: Rendezvous | None, workers: int, outcome: int | BaseException):
        self.rdv, self.workers, self.outcome = rdv, workers, outcome
        self.ranks = None
        self.closed_after_done: bool | None = None

    def run_mode(self) -> int:
        if self.rdv is not None:
            for i in range(self.workers):
                self.rdv.write_report(i, {"status": "ok"})
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def close(self) -> None:
        self.closed_after_done = self.rdv is None or self.rdv.done() is not None

    def missing_reports(self) -> int:
        return 0


class FakeWorker:
    """A double of ``backend.Task``: an input worker that returns or raises ``outcome``."""

    def __init__(self, outcome: int | BaseException):
        self.outcome = outcome

    def run(self) -> int:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def hooks_of(framework: str, outcome: int | BaseException = 0):
    """``framework``'s real hooks, with a :class:`FakeChief` and a :class:`FakeWorker`."""
    base = registry.entry(framework, "runner").Hooks

    class Hooks(base):  # type: ignore[misc, valid-type]
        made: list[FakeChief] = []

        def chief(self, role, resolved, rdv, t_proc):
            self.made.append(FakeChief(rdv, role.num_input_workers, outcome))
            return self.made[-1]

        def worker(self, role, resolved):
            return FakeWorker(outcome)

    def unused(*args):
        raise AssertionError("a double's function was called")

    return Hooks(unused, unused, unused)


def chief_role(workers: int = 1, rank: int = 0, world: int = 1) -> Role:
    return Role(kind="chief", worker_index=None, num_input_workers=workers, component="chief", het_group=0,
                procid=0, job_id="77", step_id="0", node="node1", host="localhost", rank=rank, world_size=world)


def params_file(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"train_input": {"batch_size": 2}, "eval_input": {"batch_size": 2},
                                 "runconfig": {"max_steps": 1}}))
    return p


def resolved_in(tmp_path: Path, mode: str = "train"):
    return resolve_params(["--params", str(params_file(tmp_path)), "--model_dir", str(tmp_path / "md"),
                           "--mode", mode])


def live(framework: str, outcome: int | BaseException, tmp_path: Path, role: Role | None = None, mode: str = "train"):
    """Run the chief's life; returns ``(exit code, done.json or None, the chief double)``."""
    role = role or chief_role()
    hooks = hooks_of(framework, outcome)
    code = lifecycle.ChiefLife(hooks, role, resolved_in(tmp_path, mode), 0.0).run()
    done = Rendezvous(tmp_path / "md", role.rendezvous_key).done() if role.rendezvous_key else None
    return code, done, (hooks.made[-1] if hooks.made else None)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("outcome, code, status", [
    (0, 0, "ok"), (75, 75, "stopped"), (143, 143, "stopped"),
    (preemption.Interrupted("SIGTERM", 15), 143, "stopped"), (KeyboardInterrupt(), 130, "stopped"),
    (ParamsError(["runconfig.a must be 1", "runconfig.b must be 2"]), 2, "failed"),
    (InputStalled("no batch from any input worker for 30 s"), 1, "failed"),
    (RankLost("trainer rank 1 lost"), 1, "failed"), (RuntimeError("boom"), 1, "failed"),
])
def test_the_exit_code_and_done_json_of_each_outcome(framework, outcome, code, status, tmp_path, lines):
    got, done, chief = live(framework, outcome, tmp_path)
    assert (got, done["status"]) == (code, status)
    assert chief.closed_after_done is True  # the workers read the chief's status before its source closes
    errors = [(m, tb) for lvl, m, tb in lines if lvl == "ERROR"]
    if isinstance(outcome, ParamsError):
        assert errors == [("runconfig.a must be 1", False), ("runconfig.b must be 2", False)]
    elif isinstance(outcome, InputStalled | RankLost):
        assert errors == [(str(outcome), False)]  # one line, no traceback
    elif isinstance(outcome, RuntimeError):
        assert errors == [("run failed: boom", True)] and done["reason"] == "RuntimeError: boom"
    else:
        assert errors == []
    if isinstance(outcome, preemption.Interrupted):
        assert ("INFO", f"stopped by SIGTERM {lifecycle.OUTSIDE_THE_LOOP}", False) in lines


CONTRACT = {"tensorflow": ("contract", "Refused", (["train_input: one", "train_input: two"],),
                           ["train_input: one", "train_input: two"]),
            "pytorch": ("contract", "ContractError", ("train_input: not a DataLoader",),
                        ["train_input: not a DataLoader"])}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_backends_contract_violation_is_2_in_its_own_lines(framework, tmp_path, lines):
    module, name, args, want = CONTRACT[framework]
    error = getattr(registry.entry(framework, module), name)(*args)
    code, done, _ = live(framework, error, tmp_path)
    assert (code, done["status"]) == (2, "failed")
    assert [m for lvl, m, _tb in lines if lvl == "ERROR"] == want


def test_a_pytorch_workers_violations_are_2_each_named(tmp_path, lines):
    error = registry.entry("pytorch", "remote").WorkerFailed(3, ["train_input: drop_last must be true"])
    code, done, _ = live("pytorch", error, tmp_path)
    assert (code, done["status"]) == (2, "failed")
    assert [m for lvl, m, _tb in lines if lvl == "ERROR"] == ["input worker 3: train_input: drop_last must be true"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_exception_the_ladder_does_not_know_is_raised_after_done_json(framework, tmp_path):
    with pytest.raises(SystemExit):
        live(framework, SystemExit(3), tmp_path)
    assert Rendezvous(tmp_path / "md", chief_role().rendezvous_key).done()["status"] == "failed"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_stop_signal_makes_a_failure_stopped(framework, tmp_path):
    preemption.adopt_stop(signal.SIGUSR2, requeue=True)  # as if --requeue's signal had arrived
    code, done, _ = live(framework, RuntimeError("the loop broke while stopping"), tmp_path)
    assert (code, done["status"]) == (1, "stopped")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("mode", ["eval", "validate_only", "compile_only"])
def test_a_trainer_rank_other_than_0_is_idle_in_a_mode_of_rank_0(framework, mode, tmp_path, lines):
    code, done, chief = live(framework, RuntimeError("must not run"), tmp_path, chief_role(0, rank=1, world=2), mode)
    assert (code, done, chief) == (0, None, None)  # no rendezvous without input workers; no chief made
    assert ("INFO", f"mode {mode} runs on trainer rank 0 alone; rank 1 has nothing to do", False) in lines
    code, _, chief = live(framework, 0, tmp_path / "r0", chief_role(0, rank=0, world=2), mode)
    assert code == 0 and chief is not None  # rank 0 runs it


def test_training_runs_on_every_rank():
    assert not lifecycle.rank_idle(chief_role(0, rank=1, world=2), "train")
    assert not lifecycle.rank_idle(chief_role(0, rank=1, world=2), "train_and_eval")
    assert lifecycle.rank_idle(chief_role(0, rank=1, world=2), "eval")


def test_no_rendezvous_in_single_process_mode_or_without_workers(tmp_path):
    single = Role(kind="chief", worker_index=None, num_input_workers=0)
    assert lifecycle.open_rendezvous(single, tmp_path) is None
    assert lifecycle.open_rendezvous(chief_role(0), tmp_path) is None
    rdv = lifecycle.open_rendezvous(chief_role(2), tmp_path)
    assert rdv is not None and rdv.workers_dir.is_dir() and rdv.done() is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("outcome, code", [(0, 0), (RuntimeError("pipeline broke"), 1),
                                           (preemption.Interrupted("SIGINT", 2), 0)])
def test_an_input_workers_exit_code_through_main(framework, outcome, code, tmp_path, lines, capsys):
    env = task_env("worker", 1, 1, 0, 1, "node2", 1, "77")
    argv = ["--params", str(params_file(tmp_path)), "--model_dir", str(tmp_path / "md")]
    assert lifecycle.main(hooks_of(framework, outcome), argv, env) == code
    err = capsys.readouterr().err  # main() logs to stderr as a task does: "LEVEL:csrun:[worker 0 node2] ..."
    if code == 1:
        assert "ERROR:csrun:[worker 0 node2] input worker failed\nTraceback" in err
    if isinstance(outcome, preemption.Interrupted):
        assert "INFO:csrun:[worker 0 node2] stopped by SIGINT before serving" in err


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_bad_environment_or_bad_params_are_2_through_main(framework, tmp_path, lines, capsys):
    env = {**task_env("chief", 0, 0, 0, 1, "node1", 0, "77"), "CSRUN_NUM_WORKERS": "many"}
    assert lifecycle.main(hooks_of(framework), [], env) == 2
    assert capsys.readouterr().err.startswith("ERROR:csrun:environment: CSRUN_NUM_WORKERS")
    env = task_env("chief", 0, 0, 0, 1, "node1", 0, "77")
    assert lifecycle.main(hooks_of(framework), ["--params", str(params_file(tmp_path)), "--max_steps", "0"], env) == 2
    assert "ERROR:csrun:" in capsys.readouterr().err
