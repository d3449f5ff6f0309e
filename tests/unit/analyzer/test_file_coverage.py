"""analyzer/file_coverage.py: what the analyzer says about the input workers' files, with and
without --strict, and a check process that cannot run. No TensorFlow (the check process itself
runs in tests/integration/test_modelzoo_local.py)."""
from __future__ import annotations

import sys

from analyzer.file_coverage import findings, run_check

OVERLAP = {"verdict": "overlap", "problems": ["3 of the 12 training file(s) are read by more than one ...; fix: x"],
           "note": "the pipeline shards by the input-worker count"}


def test_a_problem_is_a_warning_and_the_analysis_goes_on():
    said = []
    notes, stop = findings(OVERLAP, strict=False, echo=said.append)
    assert stop is None
    assert said == ["cs_input_analyzer: warning: train_input: " + OVERLAP["problems"][0]]
    assert notes[0].endswith("overlap (the pipeline shards by the input-worker count)")
    assert notes[1].startswith("warning: 3 of the 12")


def test_with_strict_a_problem_stops_the_analysis_with_exit_2():
    said = []
    _, stop = findings(OVERLAP, strict=True, echo=said.append)
    assert stop == 2 and said[0].startswith("cs_input_analyzer: error: train_input: 3 of the 12")


def test_sound_or_unknown_outcomes_never_stop():
    for result in ({"verdict": "sharded", "problems": []}, {"verdict": "unknown", "note": "not checked: x"}):
        said = []
        notes, stop = findings(result, strict=True, echo=said.append)
        assert stop is None and said == [] and result["verdict"] in notes[0]


def test_a_split_by_sample_is_said_as_such_with_no_warning():
    result = {"verdict": "sharded", "level": "sample", "problems": [], "framework": "pytorch",
              "note": "sample-level: disjoint (streamers 0 and 1 of 2 draw 719 and 719 of the 1437 samples)"}
    said = []
    notes, stop = findings(result, strict=True, echo=said.append)
    assert stop is None and said == [] and len(notes) == 1
    assert notes[0] == ("input workers' files (the DataLoader built as streamers 0 and 1 of 2): sharded by sample "
                        "(sample-level: disjoint (streamers 0 and 1 of 2 draw 719 and 719 of the 1437 samples))")


def test_a_check_process_that_cannot_run_gives_unknown(tmp_path):
    missing = run_check("run.py", [], str(tmp_path), str(tmp_path / "no-python"), tmp_path / "c.json")
    assert missing["verdict"] == "unknown" and "cannot run" in missing["note"]
    failing = run_check(str(tmp_path / "absent_run.py"), [], str(tmp_path), sys.executable, tmp_path / "c.json")
    assert failing["verdict"] == "unknown" and failing["note"].startswith("not checked:")
