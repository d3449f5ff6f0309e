"""csrun_runtime/pytorch/facts.py: the PyTorch backend's own ``runconfig`` keys, their defaults and
refusals as the params resolve them (one line naming ``runconfig.<key>``), read without torch:
``runconfig.ddp`` takes DistributedDataParallel's own option names, true or false."""
from __future__ import annotations

import pytest
import yaml

from csrun_runtime.params import ParamsError, resolve_params
from csrun_runtime.pytorch.facts import DDP_KEYS, FACTS


def resolve(tmp_path, **runconfig):
    path = tmp_path / "params.yaml"
    rc = {"model_dir": "md", "max_steps": 1, **runconfig}
    path.write_text(yaml.safe_dump({"train_input": {"batch_size": 8}, "runconfig": rc}))
    return resolve_params(["--params", str(path), "--mode", "train"], run_py=None).params["runconfig"]


def test_the_defaults_fill_the_runconfig(tmp_path):
    rc = resolve(tmp_path)
    assert (rc["input_read_ahead_batches"], rc["ddp"]) == (32, {})
    assert FACTS.launcher == "python-pt" and FACTS.probe.dataloader_workers and not FACTS.probe.ingest_probe


def test_ddp_takes_ddps_own_names(tmp_path):
    ddp = {"find_unused_parameters": True, "static_graph": False}
    assert resolve(tmp_path, ddp=ddp)["ddp"] == ddp and "broadcast_buffers" in DDP_KEYS


@pytest.mark.parametrize("ddp, says", [
    ([], "runconfig.ddp must be a mapping of find_unused_parameters"),
    ({"bucket_cap_mb": 25}, "runconfig.ddp has 'bucket_cap_mb', not a DistributedDataParallel option csrun passes"),
    ({"static_graph": "yes"}, "runconfig.ddp static_graph must be true or false"),
])
def test_a_bad_ddp_is_refused_naming_the_key(tmp_path, ddp, says):
    with pytest.raises(ParamsError) as e:
        resolve(tmp_path, ddp=ddp)
    assert e.value.problems[0].startswith(says), e.value.problems


def test_a_negative_read_ahead_is_refused(tmp_path):
    with pytest.raises(ParamsError, match=r"runconfig.input_read_ahead_batches must be an integer >= 0"):
        resolve(tmp_path, input_read_ahead_batches=-1)
