"""launcher/slurm/logfile.py: the srun path's task log, renamed after the job, and with a recorded
run each task's lines in the launch's attempt directory (the job known from srun's line)."""
from __future__ import annotations

import json

from launcher.slurm import TaskLogFile
from launcher.tasklog import TaskOutput


def test_the_attempt_directory_once_the_job_is_known(tmp_path):
    seen = []
    log = TaskLogFile(tmp_path, attempt=2, on_job=lambda job, where: seen.append((job, where)))
    out = TaskOutput()
    for line in ("srun: jobid 81: nodes(1):`node1', cpu counts: 2(x1)",
                 "srun: launching StepId=81.0 on host node1, 2 tasks: [0-1]", "0: chief says hi", "1: worker says hi"):
        out.line("err", line)
        log.write(line, out.job_id)
    log.finish(0, out)
    log.close()
    attempt = tmp_path / "csrun_wse-81" / "attempt-2"
    assert seen == [("81", attempt)]
    assert (tmp_path / "csrun_wse-81.log").read_text().count("says hi") == 2
    assert (attempt / "task-0.log").read_text() == "chief says hi\n"
    assert (attempt / "task-1.log").read_text() == "worker says hi\n"
    assert json.loads((attempt / "start.json").read_text())["attempt"] == 2
    assert json.loads((attempt / "end.json").read_text())["task_nodes"] == {"0": "node1", "1": "node1"}


def test_without_a_record_no_attempt_directory(tmp_path):
    log = TaskLogFile(tmp_path)
    log.write("0: hi", "82")
    log.finish(0, TaskOutput())
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csrun_wse-82.log"]
