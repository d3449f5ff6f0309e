"""launcher/errorblock.py: where an error starts and ends in a task's lines, and a task's last words."""
from __future__ import annotations

from launcher.tasklog import (
    first_error,
    last_words,
)


def test_error_blocks():
    chained = ["INFO: start", "Traceback (most recent call last):", '  File "a.py", line 1, in <module>',
               "KeyError: 'x'", "", "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", '  File "a.py", line 3, in <module>', "ValueError: y",
               "INFO: cleanup"]
    assert first_error(chained) == (1, 10)
    usage = ["usage: run.py [-h] --mode MODE", "run.py: error: unrecognized arguments: --total-nodes 2", "x"]
    assert first_error(usage) == (0, 2)
    assert first_error(["ERROR:csrun:runconfig.checkpoint_path: no checkpoint at /x", "INFO: done"]) == (0, 1)
    assert first_error(["F1125 12:00:00.1 123 op.cc:1] Check failed", "  detail", "I1125 next"]) == (0, 2)
    assert first_error(["E1125 12:00:00.1 123 cuda_driver.cc:1] failed call to cuInit"]) is None  # noise
    assert first_error(["INFO:csrun:global_step = 100", "WARNING:csrun: slow input"]) is None


def test_last_words_and_a_logged_exception_with_its_traceback():
    assert last_words(["INFO: start", "run.py failed at import: x", "", ""]) == ["run.py failed at import: x"]
    assert last_words(["a", "b", "c", "d"]) == ["b", "c", "d"]
    assert last_words(["INFO: going on"]) == []
    logged = ["ERROR:csrun:[worker 1 node3] input worker failed", "Traceback (most recent call last):",
              '  File "/u/data.py", line 9, in __getitem__', "    raise ValueError(i)", "ValueError: 7",
              "INFO: leaving"]
    assert first_error(logged) == (0, 5)  # logging's exception(): the record and its whole traceback
