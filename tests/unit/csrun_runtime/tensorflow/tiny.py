"""A tiny Keras model and its inputs for the TensorFlow runtime's in-process unit tests: float32[8, 4]
features, int32[8] labels of 3 classes (the sign pattern of two features), a one-layer classifier
compiled with SGD, sparse cross-entropy and accuracy; params YAML in a temporary model_dir. Training
input repeats (the contract's rule); the eval input is 3 batches. XLA is off (``jit_compile:
false``) so that a step compiles in well under a second on CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from csrun_common.roles import Role, resolve_role
from csrun_runtime.params import Resolved, resolve_params

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

BATCH = 8
EVAL_SAMPLES = 24  # 3 eval batches


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32))
    return x, y


def input_fn(params: dict[str, Any]) -> Any:
    """The training input: batches of 8, repeated."""
    x, y = _data(64, 1)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


def eval_input_fn(params: dict[str, Any]) -> Any:
    """The held-out input: 24 samples in 3 batches of 8, once."""
    x, y = _data(EVAL_SAMPLES, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def model_fn(params: dict[str, Any]) -> Any:
    """float32[B, 4] -> logits[B, 3], compiled."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def write_params(tmp: Path, **runconfig: Any) -> Path:
    """``tmp/params.yaml`` with ``runconfig`` over the defaults below (model_dir ``tmp/md``)."""
    rc = {"model_dir": str(tmp / "md"), "max_steps": 6, "log_steps": 2, "checkpoint_steps": 3, "seed": 1,
          "jit_compile": False, "compile_only_steps": 2, **runconfig}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump({"train_input": {"batch_size": BATCH}, "eval_input": {"batch_size": BATCH},
                                    "model": {}, "optimizer": {}, "runconfig": rc}))
    return path


def resolved(tmp: Path, mode: str, **runconfig: Any) -> Resolved:
    """The params of ``run.py --params tmp/params.yaml --mode mode`` as the runtime resolves them."""
    return resolve_params(["--params", str(write_params(tmp, **runconfig)), "--mode", mode], run_py=None)


def single_role() -> Role:
    """The role of a run.py started by hand (no csrun_wse, no Slurm): the chief, no input workers."""
    return resolve_role({})
