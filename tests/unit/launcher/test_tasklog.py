"""launcher.tasklog: srun's labelled output of a csrun_wse job → what the terminal shows.

The recordings in tests/fixtures/tasklog/ are the real stdout+stderr of the srun line csrun_wse
runs (``--label --verbose``, Slurm 22.05.8 test cluster, ``--total-nodes 3 --tasks-per-node 2``:
het group 0 = the chief and an input worker on node1, het group 1 = 4 input workers on two
nodes), paths rewritten; the golden files hold what csrun_wse shows for each.
"""
from __future__ import annotations

import pytest

from launcher.tasklog import (
    TaskGroup,
    TaskOutput,
    is_supervisor_notice,
    parse_label,
    parse_ranges,
    summarise,
)
from tests.unit.golden import assert_golden
from tests.unit.paths import FIXTURES

RECORDED = FIXTURES / "tasklog"
GROUPS = (TaskGroup(0, "chief", 0, 2), TaskGroup(1, "worker", 2, 4))
LOG = "csrun_logs/csrun_wse-31.log"


@pytest.mark.parametrize("name,status", [("misspelled", 2), ("all_fail", 143), ("worker_first", 143),
                                         ("killed_chief", 143), ("success", 0)])
def test_recorded_job_golden(name, status):
    lines = (RECORDED / f"{name}.txt").read_text().splitlines()
    assert_golden(f"tasklog_{name}.txt", "\n".join(summarise(lines, GROUPS, status, LOG)) + "\n")


@pytest.mark.parametrize("name,status", [("misspelled", 2), ("all_fail", 143)])
def test_the_error_is_shown_once_though_every_task_printed_it(name, status):
    lines = (RECORDED / f"{name}.txt").read_text().splitlines()
    marker = {"misspelled": "can't open file", "all_fail": "ValueError: bad data_dir"}[name]
    assert sum(marker in ln for ln in lines) >= 4  # every task printed it
    shown = summarise(lines, GROUPS, status, LOG)
    assert sum(marker in ln for ln in shown) == 1, shown
    assert not any(ln.startswith("srun: error:") for ln in shown), shown
    # the first failing task's own exit code (1), not srun's 143 for the tasks it ended after it
    own = {"misspelled": 2, "all_fail": 1}[name]
    assert shown[-1] == f"csrun_wse: exit status {own}; every task's output and srun's messages: {LOG}"


def test_a_failing_worker_is_named_with_its_het_group_role_and_node():
    lines = (RECORDED / "worker_first.txt").read_text().splitlines()
    shown = summarise(lines, GROUPS, 143, LOG)
    header = next(ln for ln in shown if "failed first" in ln)
    assert header.startswith("csrun_wse: task 2 (het group 1, worker) on node3 failed first: Exited with exit code 1")
    # the chief's progress lines before the failure are kept, in order
    assert shown.index("INFO: step 100 progress") < shown.index(header)


def test_labels_and_task_ranges():
    assert parse_label(" 3: text: more") == (3, "text: more")
    assert parse_label("12: ") == (12, "")
    assert parse_label("srun: error: node2: task 0: Killed") == (None, "srun: error: node2: task 0: Killed")
    assert parse_ranges("0") == [0] and parse_ranges("[0-1]") == [0, 1] and parse_ranges("2,5-6") == [2, 5, 6]
    with pytest.raises(ValueError):
        parse_ranges("node1")


def test_the_chief_error_is_held_until_the_chief_goes_on_or_the_job_ends():
    out = TaskOutput(groups=GROUPS)
    assert out.line("err", "0: INFO: step 1") == [("err", "INFO: step 1")]
    assert out.line("err", "0: ERROR:csrun:input worker 3 lost") == []  # held from here on
    assert out.line("err", "1: INFO: a worker") == []  # never shown live
    assert out.line("out", "0: INFO: step 2") == [("err", "ERROR:csrun:input worker 3 lost"),
                                                  ("out", "INFO: step 2")]  # it went on: shown
    assert out.line("err", "0: Traceback (most recent call last):") == []
    assert out.line("err", "0: RuntimeError: at the end") == []
    assert out.finish(0, LOG) == [("err", "Traceback (most recent call last):"), ("err", "RuntimeError: at the end")]


def test_a_failing_chief_whose_error_is_above_is_named_without_repeating_it():
    out = TaskOutput(groups=GROUPS)
    out.line("err", "srun: launching StepId=12.0 on host node1, 2 tasks: [0-1]")
    out.line("err", "0: ERROR:csrun:runconfig.checkpoint_path: no checkpoint at /x")
    assert out.line("err", "0: INFO:csrun:verdict: no training") != []
    out.line("err", "srun: error: node1: task 0: Exited with exit code 2")
    shown = [t for _, t in out.finish(2, LOG)]
    assert shown == ["csrun_wse: task 0 (het group 0, chief) on node1 failed first: Exited with exit code 2 "
                     "(its error is above)",
                     f"csrun_wse: exit status 2; every task's output and srun's messages: {LOG}"]


def test_the_same_error_from_the_chief_and_a_worker_is_the_chiefs():
    out = TaskOutput(groups=GROUPS)
    out.line("err", "srun: launching StepId=13.0 on host node2, 2 tasks: [0-1]")
    out.line("err", "srun: launching StepId=12.0 on host node1, 2 tasks: [0-1]")
    for task in (2, 0):
        out.line("err", f"{task}: usage: run.py [-h] --mode MODE")
        out.line("err", f"{task}: run.py: error: unrecognized arguments: --total-nodes")
    out.line("err", "srun: error: node2: task 0: Exited with exit code 2")  # the worker is reported first
    shown = [t for _, t in out.finish(2, LOG)]
    assert shown[0].startswith("csrun_wse: task 0 (het group 0, chief) on node1 failed first")
    assert sum("unrecognized arguments" in t for t in shown) == 1, shown


def test_the_same_error_from_two_trainer_ranks_is_shown_once():
    """Issue 44: rank 1 prints the error rank 0 prints, under its label ``[rank 1 node1]``, and
    srun reports rank 1 first: the terminal shows the error once (recorded: the unused-parameter
    refusal of 2 PyTorch ranks on node1)."""
    error = ("runconfig.ddp.find_unused_parameters: the model's unused got no gradient in a step (not used in the "
             "loss); DistributedDataParallel needs runconfig.ddp: {find_unused_parameters: true} for that")
    lines = ["srun: launching StepId=4.0 on host node1, 2 tasks: [0-1]", "0: INFO:csrun:global_step = 1, loss = 4.1",
             f"1: ERROR:csrun:[rank 1 node1] {error}", f"0: ERROR:csrun:{error}",
             "srun: error: node1: task 1: Exited with exit code 2",
             "srun: error: node1: task 0: Exited with exit code 2"]
    shown = summarise(lines, (TaskGroup(0, "chief", 0, 2),), 2, LOG)
    assert sum(error in t for t in shown) == 1, shown
    assert shown[1] == "csrun_wse: task 0 (het group 0, chief) on node1 failed first: Exited with exit code 2, " \
                       "with this error:" and shown[2] == f"  ERROR:csrun:{error}", shown


def test_an_interrupted_job_shows_the_chief_lines_and_the_log():
    out = TaskOutput(groups=GROUPS)
    out.line("err", "0: Traceback (most recent call last):")
    out.line("err", "0: KeyboardInterrupt")
    shown = out.finish(130, LOG, interrupted=True)
    assert shown[:2] == [("err", "Traceback (most recent call last):"), ("err", "KeyboardInterrupt")]
    assert "failed first" not in "".join(t for _, t in shown) and LOG in shown[-1][1]


def test_the_requeue_status_is_no_failure():
    out = TaskOutput(groups=GROUPS, ok_statuses=frozenset({0, 75}))
    out.line("err", "srun: error: node1: task 0: Exited with exit code 75")
    assert out.finish(75, LOG) == []


def test_srun_refusing_the_allocation_reaches_the_terminal():
    out = TaskOutput(groups=GROUPS)
    assert out.line("err", "srun: defined options") == []
    msg = "srun: error: Unable to allocate resources: Requested node configuration is not available"
    assert out.line("err", msg) == [("err", msg)]
    assert out.finish(1, LOG)[-1][1].startswith("csrun_wse: exit status 1;")


def test_another_tasks_warning_is_shown_once_naming_the_task():
    out = TaskOutput(groups=GROUPS)
    out.line("err", "srun: launching StepId=13.0 on host node2, 2 tasks: [0-1]")
    out.line("err", "srun: launching StepId=12.0 on host node1, 2 tasks: [0-1]")
    warn = "WARNING:csrun:3 shard-plan file(s) of this worker lie outside train_input.data_dir"
    assert out.line("err", f"2: {warn}") == [("err", f"task 2 (het group 1, worker) on node2: {warn}")]
    assert out.line("err", "3: WARNING:csrun:5 shard-plan file(s) of this worker lie outside "
                           "train_input.data_dir") == []  # the same warning, other numbers
    assert out.line("err", "1: INFO:csrun:serving input_fn") == []
    assert out.line("err", "1: W1125 12:00:00.1 12 op.cc:1] TensorFlow's own warning") == []


def test_a_supervisors_notice_that_a_worker_starts_again_reaches_the_terminal():
    """Every notice (not once per text: two replacements are two events), naming the task."""
    out = TaskOutput(groups=GROUPS)
    out.line("err", "srun: launching StepId=13.0 on host node2, 2 tasks: [0-1]")
    out.line("err", "srun: launching StepId=12.0 on host node1, 2 tasks: [0-1]")
    died = "csrun: input worker 1 (pid 4242) died of SIGKILL at 12:00:01; starting its replacement (1 of 2)"
    assert out.line("err", f"2: {died}") == [("err", f"task 2 (het group 1, worker) on node2: {died}")]
    again = died.replace("(1 of 2)", "(2 of 2)")
    assert out.line("err", f"2: {again}") == [("err", f"task 2 (het group 1, worker) on node2: {again}")]
    adopted = ("csrun: input worker 1, lost with node node3, starts again on node2 (task 2, pid 77, "
               "replacement 1)")
    assert is_supervisor_notice(adopted) and out.line("err", f"3: {adopted}")[0][1].endswith(adopted)
    assert out.line("err", "2: csrun: cannot execute 'x': No such file or directory") == []
    assert not is_supervisor_notice("INFO:csrun:input worker 1 died")


# issue 33 item 5: a worker of het group 1 fails at import with sys.exit("...") (no error-looking
# line); recorded on the test cluster (--total-nodes 3 --tasks-per-node 2, the chief killed before
# its own sys.exit). srun's error line says "node2: task 0" (het group 1's own id), --label "2:".
WORKER_IMPORT = "run.py failed at import: no module named 'modelzoo' (worker)"


def test_a_worker_failing_at_import_is_shown_once_with_its_last_words():
    lines = (RECORDED / "worker_import.txt").read_text().splitlines()
    assert "srun: error: node2: task 0: Exited with exit code 1" in lines and f"2: {WORKER_IMPORT}" in lines
    shown = summarise(lines, GROUPS, 143, LOG)
    assert_golden("tasklog_worker_import.txt", "\n".join(shown) + "\n")
    assert sum(WORKER_IMPORT in ln for ln in shown) == 1 and len(shown[-3:]) == 3
    assert shown[-3:] == ["csrun_wse: task 2 (het group 1, worker) on node2 failed first: Exited with exit code 1, "
                          "its last output:", f"  {WORKER_IMPORT}",
                          f"csrun_wse: exit status 1; every task's output and srun's messages: {LOG}"]


def test_the_failing_task_is_found_from_the_layout_when_srun_named_no_launch():
    """Without srun's ``launching ... on host`` lines the node's het group is unknown: the
    layout's offsets give the candidates (task 0 of group 0 or of group 1: global 0 or 2), and
    the one that printed anything is it."""
    lines = [ln for ln in (RECORDED / "worker_import.txt").read_text().splitlines()
             if not ln.startswith("srun: launching")]
    shown = summarise(lines, GROUPS, 143, LOG)
    assert shown[-3].startswith("csrun_wse: task 2 (het group 1, worker) failed first: Exited with exit code 1")
    assert shown[-2] == f"  {WORKER_IMPORT}"


def test_exit_status_is_the_first_failing_tasks_own():
    out = TaskOutput(groups=GROUPS)
    for raw in ["srun: launching StepId=5.0 on host node1, 2 tasks: [0-1]",
                "srun: launching StepId=6.0 on host node2, 2 tasks: [0-1]",
                "srun: launching StepId=6.0 on host node3, 2 tasks: [2-3]",
                "0: ERROR:csrun:[chief node1] train_input: [Unsupported PyTorch] ... got list",
                "srun: error: node1: task 0: Exited with exit code 2",
                "srun: error: node3: tasks 2-3: Terminated"]:
        out.line("err", raw)
    assert out.exit_status(143) == 2  # not srun's highest status (the workers it ended: 143)
    assert out.exit_status(143, interrupted=True) == 143 and out.exit_status(0) == 0
    killed = TaskOutput(groups=GROUPS)
    killed.line("err", "srun: launching StepId=5.0 on host node1, 2 tasks: [0-1]")
    killed.line("err", "srun: error: node1: task 0: Killed")
    assert killed.exit_status(137) == 137  # a signal: srun's status stands


def _feed(out: TaskOutput, lines: list[tuple[str, str]]) -> None:
    for stream, raw in lines:
        out.line(stream, raw)


LAUNCHES = [("err", "srun: launching StepId=12.0 on host node1, 2 tasks: [0-1]"),
            ("err", "srun: launching StepId=13.0 on host node2, 2 tasks: [0-1]")]
TRACEBACK = ["Traceback (most recent call last):", '  File "/u/run.py", line 6, in <module>',
             '    raise ValueError("bad data_dir")', "ValueError: bad data_dir"]


@pytest.mark.parametrize("at", range(len(TRACEBACK) + 1))
def test_a_chief_line_of_the_other_stream_inside_its_error_does_not_show_it_twice(at):
    """srun relays a task's stdout and stderr on two pipes: the chief's stdout line, written before
    its traceback, may be read in the middle of it, and a worker may be reported first."""
    out = TaskOutput(groups=GROUPS)
    chief = [("err", f"0: {t}") for t in TRACEBACK]
    chief.insert(at, ("out", "0: PROGRESS global_step = 100"))
    _feed(out, [*LAUNCHES, *[("err", f"2: {t}") for t in TRACEBACK], *chief,
                ("err", "srun: error: node2: task 0: Exited with exit code 1"),
                ("err", "srun: error: node1: task 0: Exited with exit code 1")])
    shown = [t for _, t in out.finish(out.exit_status(1), LOG)]
    assert sum("ValueError: bad data_dir" in t for t in shown) == 1, shown
    assert sum("PROGRESS" in t for t in shown) == (0 if at == 0 else 1), shown  # a held line is kept
    assert any(t.startswith("csrun_wse: task 0 (het group 0, chief) on node1 failed first") for t in shown), shown


def test_the_task_that_exited_decides_though_srun_reported_a_terminated_one_first():
    """``--kill-on-bad-exit`` ends the other tasks with SIGTERM; srun may report one of them first.
    The same mistake then gives the same task and exit status in either order."""
    for order in ((0, 1), (1, 0)):
        out = TaskOutput(groups=GROUPS)
        reports = ["srun: error: node2: task 1: Exited with exit code 1", "srun: error: node1: task 0: Terminated"]
        _feed(out, [*LAUNCHES, ("err", "3: run.py failed at import: no module named x"),
                    *[("err", reports[i]) for i in order]])
        shown = [t for _, t in out.finish(out.exit_status(143), LOG)]
        assert shown[0].startswith("csrun_wse: task 3 (het group 1, worker) on node2 failed first: "
                                   "Exited with exit code 1"), (order, shown)
        assert shown[-1].startswith("csrun_wse: exit status 1; "), (order, shown)


def test_slurmstepds_notice_glued_to_a_killed_tasks_line_is_not_shown():
    out = TaskOutput(groups=GROUPS)
    _feed(out, [*LAUNCHES, ("err", "2: Traceback (most recent call last):"),
                ("err", '2:   File "/u/run.py", line 3, in <modslurmstepd-node2: error: *** STEP 13.0 ON node2 '
                        'CANCELLED AT 2026-11-28T07:19:54 ***'),
                ("err", "srun: error: node2: task 0: Exited with exit code 1")])
    shown = "\n".join(t for _, t in out.finish(out.exit_status(1), LOG))
    assert "slurmstepd" not in shown and "CANCELLED" not in shown, shown
    assert '  File "/u/run.py", line 3, in <mod' in shown


def test_a_line_that_arrives_after_the_summary_is_not_shown():
    out = TaskOutput(groups=GROUPS)
    _feed(out, [*LAUNCHES, ("err", "3: run.py failed at import: x"),
                ("err", "srun: error: node2: task 1: Exited with exit code 1")])
    out.finish(1, LOG)
    assert out.line("err", "0: run.py failed at import: x") == []
