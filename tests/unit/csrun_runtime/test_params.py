"""csrun_runtime/params.py: the Model Zoo command line and params YAML ("Cerebras Model Zoo YAML parameters"), runconfig
validation, training targets, per-worker params and the shard-plan check. No TensorFlow."""
from __future__ import annotations

import json
import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from csrun_runtime.params import (
    IGNORED_MODELZOO_KEYS,
    MODES,
    RUNCONFIG_KEYS,
    ParamsError,
    load_shard_plan,
    parse_args,
    resolve_params,
    training_target,
    validate_params,
    worker_params,
)
from tests.unit.paths import REPO

BASE = {
    "train_input": {"data_dir": "d", "batch_size": 8, "shuffle_seed": 100},
    "eval_input": {"data_dir": "d", "batch_size": 4},
    "model": {"depth": 1},
    "optimizer": {"learning_rate": 0.1},
    "runconfig": {"max_steps": 10},
}


def write(tmp_path, params, name="params.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(params))
    return str(p)


def test_defaults_and_overrides(tmp_path):
    p = write(tmp_path, BASE)
    r = resolve_params(["--params", p, "--mode", "train_and_eval", "--max_steps", "50",
                        "--model_dir", "md", "--cs_ip", "1.2.3.4:9000", "--eval_steps", "3"],
                       cwd=str(tmp_path))
    rc = r.params["runconfig"]
    assert r.mode == "train_and_eval" and rc["max_steps"] == 50 and rc["eval_steps"] == 3
    assert rc["model_dir"] == str((tmp_path / "md").resolve()) == r.model_dir
    assert rc["cs_ip"] == "1.2.3.4:9000"
    assert rc["log_steps"] == 100 and rc["checkpoint_steps"] == 0
    assert rc["autoload_last_checkpoint"] is True and rc["save_initial_checkpoint"] is False
    assert set(RUNCONFIG_KEYS) <= set(rc)
    assert r.warnings == []
    assert r.params["model"] == {"depth": 1}
    assert r.params_path == os.path.realpath(p)


def test_mode_from_yaml_and_flags(tmp_path):
    p = write(tmp_path, {**BASE, "runconfig": {"mode": "eval"}})
    assert resolve_params(["--params", p]).mode == "eval"
    assert resolve_params(["--params", p, "--validate_only"]).mode == "validate_only"
    assert resolve_params(["--params", p, "--compile_only"]).mode == "compile_only"
    p2 = write(tmp_path, {**BASE, "runconfig": {"validate_only": True}}, "b.yaml")
    assert resolve_params(["--params", p2]).mode == "validate_only"
    assert resolve_params(["--params", p2, "--mode", "train", "--max_steps", "1"]).mode == "train"


def test_default_params_beside_run_py(tmp_path):
    (tmp_path / "configs").mkdir()
    write(tmp_path / "configs", BASE)
    run_py = tmp_path / "run.py"
    run_py.write_text("")
    args = parse_args([], run_py=str(run_py))
    assert args.params == str(tmp_path / "configs" / "params.yaml")


def test_unknown_and_ignored_keys_warn(tmp_path):
    p = write(tmp_path, {**BASE, "extra": {}, "runconfig": {"max_steps": 5, "foo": 1,
                                                            "num_wgt_servers": 3}})
    r = resolve_params(["--params", p])
    text = "\n".join(r.warnings)
    assert "runconfig.foo is not a known runconfig key" in text
    assert "runconfig.num_wgt_servers is a Model Zoo key" in text
    assert "unknown section 'extra'" in text
    assert "num_wgt_servers" in IGNORED_MODELZOO_KEYS


@pytest.mark.parametrize("key,value", [
    ("max_steps", 0), ("max_steps", "ten"), ("max_steps", 1.5), ("max_steps", True),
    ("num_steps", -1), ("checkpoint_steps", -1), ("log_steps", 0), ("seed", "x"),
    ("save_initial_checkpoint", "yes"), ("autoload_last_checkpoint", 1), ("eval_steps", 0),
    ("eval_frequency", 0), ("mode", "fit"), ("model_dir", ""), ("checkpoint_path", 3),
    ("keep_checkpoint_max", 0), ("jit_compile", "maybe"), ("input_timeout_secs", 0),
    ("logging", "LOUD"),
])
def test_invalid_runconfig_value_names_the_key(tmp_path, key, value):
    p = write(tmp_path, {**BASE, "runconfig": {"max_steps": 5, key: value}})
    with pytest.raises(ParamsError) as info:
        resolve_params(["--params", p])
    assert f"runconfig.{key}" in str(info.value)
    assert repr(value) in str(info.value)


def test_every_problem_is_listed(tmp_path):
    p = write(tmp_path, {"train_input": {"batch_size": 0}, "model": [1],
                         "runconfig": {"log_steps": 0, "seed": "s"}})
    with pytest.raises(ParamsError) as info:
        resolve_params(["--params", p])
    probs = info.value.problems
    assert any("runconfig.log_steps" in x for x in probs)
    assert any("runconfig.seed" in x for x in probs)
    assert any("params.model must be a mapping" in x for x in probs)
    assert any("train_input.batch_size must be an integer >= 1" in x for x in probs)
    assert any("runconfig.max_steps or runconfig.num_steps is required" in x for x in probs)


def test_mode_needs_its_sections(tmp_path):
    p = write(tmp_path, {"runconfig": {"mode": "train_and_eval", "max_steps": 1}})
    with pytest.raises(ParamsError) as info:
        resolve_params(["--params", p])
    assert "params.train_input is required for mode train_and_eval" in str(info.value)
    assert "params.eval_input is required for mode train_and_eval" in str(info.value)


def test_command_line_errors(tmp_path):
    p = write(tmp_path, BASE)
    with pytest.raises(ParamsError, match="command line"):
        resolve_params(["--params", p, "--mode", "fit"])
    with pytest.raises(ParamsError, match="command line"):
        resolve_params(["--params", p, "--max_steps", "x"])
    with pytest.raises(ParamsError, match="command line"):
        resolve_params(["--params", p, "--bogus"])
    with pytest.raises(ParamsError, match="exclude each other"):
        resolve_params(["--params", p, "--validate_only", "--compile_only"])
    with pytest.raises(ParamsError, match="not found"):
        resolve_params(["--params", str(tmp_path / "nope.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        resolve_params(["--params", str(bad)])
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ParamsError, match="top level must be a mapping"):
        resolve_params(["--params", str(bad)])


def test_yaml_is_loaded_safely(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("runconfig: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        resolve_params(["--params", str(bad)])


def test_training_target():
    assert training_target(0, {"max_steps": 100}) == 100
    assert training_target(40, {"max_steps": 100}) == 100
    assert training_target(40, {"num_steps": 10}) == 50
    assert training_target(95, {"max_steps": 100, "num_steps": 10}) == 100
    assert training_target(120, {"max_steps": 100}) == 100
    with pytest.raises(ParamsError, match="max_steps or runconfig.num_steps"):
        training_target(0, {})


@settings(max_examples=100, deadline=None)
@given(start=st.integers(0, 10**6), ms=st.one_of(st.none(), st.integers(1, 10**6)),
       ns=st.one_of(st.none(), st.integers(1, 10**6)))
def test_training_target_never_exceeds_either_limit(start, ms, ns):
    if ms is None and ns is None:
        return
    t = training_target(start, {"max_steps": ms, "num_steps": ns})
    if ms is not None:
        assert t <= ms
    if ns is not None:
        assert t <= start + ns


def test_worker_params_seeds_and_indices():
    p, _ = validate_params(BASE)
    ws = [worker_params(p, i, 3) for i in range(3)]
    assert [w["train_input"]["shuffle_seed"] for w in ws] == [100, 101, 102]
    assert [w["train_input"]["worker_index"] for w in ws] == [0, 1, 2]
    assert all(w["train_input"]["num_workers"] == 3 for w in ws)
    assert all(w["train_input"]["base_shuffle_seed"] == 100 for w in ws)
    assert "data_files" not in ws[0]["train_input"]
    assert p["train_input"]["shuffle_seed"] == 100  # input not modified
    # worker params of worker params keep the base
    assert worker_params(ws[1], 2, 3)["train_input"]["shuffle_seed"] == 102
    # base from runconfig.seed, or none at all
    p2, _ = validate_params({**BASE, "train_input": {"batch_size": 8}, "runconfig": {"max_steps": 1, "seed": 7}})
    assert worker_params(p2, 1, 2)["train_input"]["shuffle_seed"] == 8
    p3, _ = validate_params({**BASE, "train_input": {"batch_size": 8}})
    assert worker_params(p3, 1, 2)["train_input"]["shuffle_seed"] is None
    with pytest.raises(ValueError):
        worker_params(p, 3, 3)


def plan(n, files_per=2, **kw):
    return {"schema": "csrun.shard_plan", "version": 1, "num_workers": n, "mode": "shard",
            "balance_by": "bytes",
            "workers": [{"index": i, "files": [f"/d/f{i}-{k}" for k in range(files_per)],
                         "bytes": 10, "records": None, "seed": 1000 + i} for i in range(n)], **kw}


def test_shard_plan_gives_each_worker_its_files_and_seed(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan(3)))
    pl = load_shard_plan(path, 3)
    p, _ = validate_params(BASE)
    ws = [worker_params(p, i, 3, pl)["train_input"] for i in range(3)]
    assert [w["data_files"] for w in ws] == [[f"/d/f{i}-0", f"/d/f{i}-1"] for i in range(3)]
    assert [w["shuffle_seed"] for w in ws] == [1000, 1001, 1002]
    assert ws[2]["shard_plan_entry"]["index"] == 2


def test_shard_plan_for_another_worker_count_is_refused_with_both_numbers(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan(4)))
    with pytest.raises(ParamsError) as info:
        load_shard_plan(path, 6)
    assert "4" in str(info.value) and "6" in str(info.value)
    assert str(path) in str(info.value)


def test_malformed_shard_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{")
    with pytest.raises(ParamsError, match="not valid JSON"):
        load_shard_plan(path, 1)
    with pytest.raises(ParamsError, match="no such file"):
        load_shard_plan(tmp_path / "missing.json", 1)


def test_modes_constant():
    assert MODES == ("train", "eval", "train_and_eval", "validate_only", "compile_only")


def test_every_runconfig_key_is_documented():
    doc = (REPO / "csrun_runtime" / "README.md").read_text()
    for key in RUNCONFIG_KEYS:
        assert f"`{key}`" in doc, key


def test_drop_options_removes_both_spellings_and_keeps_order():
    from csrun_runtime.params import drop_options

    argv = ["--params", "p.yaml", "--model_dir", "a b", "-o", "x", "--model_dir=y", "--validate_only", "--mode"]
    assert drop_options(argv, valued=("--model_dir", "-o"), flags=("--validate_only",)) == \
        ["--params", "p.yaml", "--mode"]
    assert drop_options(argv) == argv  # nothing named: unchanged
    assert drop_options(["--mode"], valued=("--mode",)) == ["--mode"]  # no value after it: kept


def test_the_model_zoo_r16_pytorch_runconfig_keys_are_known(tmp_path):
    """bert_base_classifier_sst2.yaml's and params_gpt2_xl.yaml's runconfig blocks (Model Zoo
    R1.6.x; issue 33): no key is "not a known runconfig key" (docs/PYTORCH.md "Model Zoo params")."""
    rc = {"max_steps": 20000, "log_steps": 1000, "checkpoint_steps": 5000, "seed": 1, "show_debug_metrics": False,
          "save_losses": True, "model_dir": "./model_dir", "save_initial_checkpoint": True, "eval_steps": 71,
          "validate_only": False, "compile_only": False, "mode": "train", "num_csx": 1, "num_act_servers": 4,
          "num_wgt_servers": 1, "num_workers_per_csx": 16}
    r = resolve_params(["--params", write(tmp_path, {**BASE, "runconfig": rc})])
    assert not [w for w in r.warnings if "not a known runconfig key" in w], r.warnings
    assert any("runconfig.show_debug_metrics is a Model Zoo key" in w for w in r.warnings)

# --------------------------------------------------------------------------- the runtime's own flags
def test_runtime_options_are_not_expanded_from_prefixes():
    assert parse_args(["--max_steps", "5"]).max_steps == 5
    for prefix in (["--max_step", "5"], ["--mod", "train"], ["--param", "p.yaml"]):
        with pytest.raises(ParamsError, match="unrecognized arguments"):
            parse_args(prefix)


def test_runconfig_transport_is_validated_with_one_line_naming_key_and_value():
    from csrun_runtime.params import ParamsError, validate_params

    def params(**rc):
        return {"train_input": {"batch_size": 8}, "runconfig": {"max_steps": 10, **rc}}

    assert validate_params(params())[0]["runconfig"]["transport"] == "dataplane"  # the default: authenticated
    assert validate_params(params(transport="service"))[0]["runconfig"]["transport"] == "service"
    with pytest.raises(ParamsError) as e:
        validate_params(params(transport="grpc"))
    (problem,) = e.value.problems
    assert problem.startswith("runconfig.transport must be service") and problem.endswith("got 'grpc'")
    assert "\n" not in problem
