"""csrun_runtime/task.py: a task's start and end for every framework: its log prefix by role, the
``LEVEL:csrun:<prefix><message>`` lines on stderr, params problems each logged in one line, a bad
environment raised after logging is set up, and a flushed ``os._exit`` with the task's code."""
from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from csrun_common.roles import RoleError, resolve_role
from csrun_runtime import task
from csrun_runtime.params import ParamsError, resolve_params
from tests.fixtures.runtime.helpers import task_env
from tests.unit.paths import REPO


@pytest.fixture(autouse=True)
def runtime_logger():
    """The runtime logger's handlers, level and propagation restored after the test."""
    log = logging.getLogger("csrun.runtime")
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    yield log
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = propagate


def test_the_prefix_names_an_input_worker_and_a_trainer_rank_not_the_chief():
    assert task.log_prefix(resolve_role({})) == ""
    worker = resolve_role(task_env("worker", 3, 1, 0, 4, "node3", 1, "77"))
    assert task.log_prefix(worker) == "[worker 2 node3] "


def test_lines_on_stderr_at_the_runconfig_level(capfd, runtime_logger):
    task.setup_logging("[worker 2 node3] ", "WARNING")
    runtime_logger.info("hidden")
    runtime_logger.warning("slow input")
    assert capfd.readouterr().err == "WARNING:csrun:[worker 2 node3] slow input\n"


def test_each_params_problem_is_one_line_and_none_is_returned(capfd, tmp_path):
    def resolve():
        raise ParamsError(["runconfig.log_steps must be an integer >= 1, got 0", "--mode: invalid"])

    task.setup_logging()  # as task.begin() sets it up before the params are resolved
    assert task.resolve_logged(resolve, "", True) is None
    assert capfd.readouterr().err.splitlines() == ["ERROR:csrun:runconfig.log_steps must be an integer >= 1, got 0",
                                                   "ERROR:csrun:--mode: invalid"]
    params = tmp_path / "p.yaml"
    params.write_text("runconfig: {model_dir: md, max_steps: 1, logging: WARNING, bogus_key: 1}\n"
                      "train_input: {batch_size: 8}\n")
    resolved = task.resolve_logged(lambda: resolve_params(["--params", str(params)], run_py=None), "", True,
                                   ["a backend's warning"])
    assert resolved is not None and logging.getLogger("csrun.runtime").level == logging.WARNING
    err = capfd.readouterr().err.splitlines()
    assert [line for line in err if "bogus_key" in line] and err[-1] == "WARNING:csrun:a backend's warning"


def test_a_bad_environment_raises_after_logging_is_set_up(runtime_logger):
    with pytest.raises(RoleError):
        task.begin({"CSRUN_ROLE": "janitor"})
    assert runtime_logger.handlers and not runtime_logger.propagate


def test_flush_exit_leaves_with_the_code_after_the_lines():
    code = ("from csrun_runtime import task; task.setup_logging(); task.log.warning('last words'); "
            "print('out', end=''); task.flush_exit(75)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (75, "out", "WARNING:csrun:last words\n")


def test_the_process_start_is_before_now():
    assert 0 < task.process_start_time() <= time.time()
