"""csrun_runtime/tensorflow/facts.py: the TensorFlow backend's own ``runconfig`` keys, their
defaults and refusals as the params resolve them (one line naming ``runconfig.<key>``), read
without TensorFlow."""
from __future__ import annotations

import pytest
import yaml

from csrun_runtime.params import ParamsError, resolve_params
from csrun_runtime.tensorflow.facts import FACTS


def resolve(tmp_path, **runconfig):
    path = tmp_path / "params.yaml"
    rc = {"model_dir": "md", "max_steps": 1, **runconfig}
    path.write_text(yaml.safe_dump({"train_input": {"batch_size": 8}, "runconfig": rc}))
    return resolve_params(["--params", str(path), "--mode", "train"], run_py=None).params["runconfig"]


def test_the_defaults_fill_the_runconfig(tmp_path):
    rc = resolve(tmp_path)
    assert {k: rc[k] for k in FACTS.runconfig} == {"jit_compile": "auto", "input_bundle": "auto",
                                                   "transport": "dataplane"}
    assert FACTS.launcher == "python-ws" and FACTS.probe.ingest_probe and not FACTS.probe.dataloader_workers


@pytest.mark.parametrize("key, value, says", [
    ("jit_compile", "maybe", "runconfig.jit_compile must be auto, true or false"),
    ("input_bundle", 0, "runconfig.input_bundle must be auto or an integer >= 1"),
    ("transport", "grpc", "runconfig.transport must be service (tf.data service) or dataplane"),
])
def test_a_bad_value_is_refused_naming_the_key(tmp_path, key, value, says):
    with pytest.raises(ParamsError) as e:
        resolve(tmp_path, **{key: value})
    assert e.value.problems[0].startswith(says), e.value.problems


def test_a_good_value_is_kept(tmp_path):
    rc = resolve(tmp_path, jit_compile=False, input_bundle=4, transport="service")
    assert (rc["jit_compile"], rc["input_bundle"], rc["transport"]) == (False, 4, "service")
