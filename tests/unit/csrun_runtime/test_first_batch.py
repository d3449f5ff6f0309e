"""csrun_runtime/first_batch.py on real run.py files: a good PyTorch input gives one batch in process;
a run.py that cannot load here is not checked."""
from __future__ import annotations

import pytest

from tests.unit.launcher.test_batchcheck import RUN_PT, _params


def test_a_good_pytorch_input_gives_one_batch_in_process(tmp_path):
    pytest.importorskip("torch")
    from csrun_runtime.first_batch import EXIT_OK, pull_one_batch

    status, text = pull_one_batch(str(RUN_PT), ["--params", str(_params(tmp_path)), "--mode", "train"], 2, 1)
    assert (status, text) == (EXIT_OK, "one batch of input worker 0 of 2 pulled")


def test_a_run_py_that_cannot_load_here_is_not_checked(tmp_path):
    from csrun_runtime.first_batch import EXIT_NOT_CHECKED, pull_one_batch

    run_py = tmp_path / "run.py"
    run_py.write_text("import csrun_runtime\nimport no_such_package_here_xyz\n")
    status, text = pull_one_batch(str(run_py), [], 1, 1)
    assert status == EXIT_NOT_CHECKED
    assert text.startswith("run.py not loaded here: ") and "no_such_package_here_xyz" in text
