"""csrun_runtime/tensorflow/contract.py: validate_only opens every input file the pipeline lists (check_input_files)."""
from __future__ import annotations

import pytest

HOSTILE = "a'; echo foo"


# --------------------------------------------------------------------------- validate_only opens the input files
@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_validate_only_opens_every_listed_file(tf, tmp_path):
    from csrun_runtime.tensorflow.contract import check_input_files

    real = tmp_path / "train-0.csv"
    real.write_text("1,2\n")
    missing = str(tmp_path / HOSTILE)
    cases = {
        "tfrecord": tf.data.TFRecordDataset([str(real), missing]).repeat().batch(2),
        "textline": tf.data.TextLineDataset(missing).batch(2),
        "csv": tf.data.experimental.CsvDataset([str(real), missing], [tf.int32, tf.int32]),
        "interleave": tf.data.Dataset.from_tensor_slices([str(real), missing]).interleave(tf.data.TFRecordDataset),
        "directory": tf.data.TextLineDataset([str(real), str(tmp_path)]),
    }
    for name, ds in cases.items():
        rep = check_input_files(ds, "train_input")
        (v,) = rep.violations
        bad = str(tmp_path) if name == "directory" else missing
        assert v.startswith("train_input: 1 of the ") and repr(bad) in v and "check data_dir" in v, (name, v)
    ok = tf.data.Dataset.list_files(str(tmp_path / "*.csv")).interleave(tf.data.TextLineDataset).repeat()
    rep = check_input_files(ok, "eval_input")
    assert rep.ok and rep.info["eval_input_files"] == {"listed": 1, "unreadable": 0}
    labels = tf.data.Dataset.from_tensor_slices(["cat", "dog"]).map(tf.strings.length)  # strings, not files
    assert check_input_files(labels).ok
