"""launcher/runs/live.py: the live figures read from the chief's log, with the lines the runtime
prints (csrun_runtime/loop.py, elastic.py, autoscale.py), and the runtime's threshold."""
from __future__ import annotations

from csrun_runtime.artifacts import INPUT_BOTTLENECK_THRESHOLD
from launcher.runs import live

CHIEF_LOG = """\
INFO:csrun:chief: training from global step 0 to 500
INFO:csrun:chief: global_step = 50, loss = 1.2
INFO:csrun:chief: rate over global steps 1..60 (1.20 s, 3 call(s)): 812.5 samples/s, input wait 3.1 %
WARNING:csrun:chief: input worker 2 on node3 (pid 4242) lost 0.3 s ago: its process died; waiting for its replacement
WARNING:csrun:chief: input worker 2 replaced on node3 (pid 4250, replacement 1) 1.1 s after its loss; reopened
INFO:csrun:chief: autoscale: remove input worker 3 on node3 (now 3 streaming): wait below 5 %
INFO:csrun:chief: autoscale: remove input worker 1 on node2 (now 2 streaming): wait below 5 %
INFO:csrun:chief: autoscale: add input worker 1 on node2 (now 3 streaming): wait above 10 %
WARNING:csrun:chief: input worker 0 lost 4 times: given up; training continues without it
INFO:csrun:chief: global_step = 120, loss = 0.9
INFO:csrun:chief: rate over global steps 61..130 (1.00 s, 2 call(s)): 640.0 samples/s, input wait 24.0 %
"""


def test_the_chiefs_lines_give_the_live_figures(tmp_path):
    (tmp_path / "task-0.log").write_text(CHIEF_LOG)
    got = live.read(tmp_path / "task-0.log")
    assert got.step == 130 and got.samples_per_sec == 640.0 and abs(got.input_wait - 0.24) < 1e-9
    assert got.verdict == "input-bound"
    assert got.workers == {"lost": [2], "replaced": [2], "given_up": [0], "paused": [3]}


def test_nothing_logged_yet(tmp_path):
    got = live.read(tmp_path / "missing.log")
    assert got.step is None and got.verdict is None and got.workers["lost"] == []
    assert live.parse("INFO:csrun:chief: global_step = 7, loss = 2\n").step == 7


def test_the_live_threshold_is_the_runtimes():
    assert live.INPUT_BOUND == INPUT_BOTTLENECK_THRESHOLD
