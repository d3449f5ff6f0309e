"""The chief's model: built from the user's ``model_fn`` and checked, and its checkpointing
(the global step, ``tf.train.Checkpoint`` and the manager, restored from the newest or the
given checkpoint).

The functions get the values they use, not the chief (:mod:`csrun_runtime.tensorflow.chief` calls them).
TensorFlow and Keras are imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..params import ParamsError
from .contract import Refused, synthetic_batch

__all__ = ["build_model", "checkpointing"]

log = logging.getLogger("csrun.runtime")


def build_model(model_fn: Callable[..., Any], params: dict[str, Any], spec: Any) -> Any:
    """``model_fn(params)``, seeded by ``runconfig.seed``, built on a synthetic batch of
    ``spec`` when not yet built, its optimizer built. Returns the ``keras.Model``; raises
    :class:`csrun_runtime.tensorflow.contract.Refused` when ``model_fn`` returns no compiled
    ``keras.Model``."""
    import keras

    rc = params["runconfig"]
    if rc.get("seed") is not None:
        keras.utils.set_random_seed(int(rc["seed"]))
    model = model_fn(params)
    if not isinstance(model, keras.Model):
        raise Refused([f"model: model_fn must return a keras.Model, got {type(model).__name__}"])
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise Refused(["model: model_fn must return a compiled model "
                        "(model.compile(optimizer=..., loss=..., metrics=...))"])
    if not model.built:
        x, _ = synthetic_batch(spec)
        model(x)
    model.optimizer.build(model.trainable_variables)
    return model


def checkpointing(model: Any, model_dir: Path, rc: Mapping[str, Any]) -> tuple[Any, Any, Any, str | None]:
    """The global step variable (int64), the ``tf.train.Checkpoint`` of ``model``, its
    optimizer and the step, and a ``tf.train.CheckpointManager`` in ``model_dir``
    (``model-ckpt-N``, ``runconfig.keep_checkpoint_max`` kept); restored from
    ``runconfig.checkpoint_path`` or, with ``autoload_last_checkpoint``, the newest in
    ``model_dir``. Returns ``(step, ckpt, mgr, restored path or None)``; raises
    :class:`csrun_runtime.params.ParamsError` when the given checkpoint is missing or does not
    match the model."""
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, global_step=step)
    mgr = tf.train.CheckpointManager(ckpt, str(model_dir),
                                     max_to_keep=int(rc["keep_checkpoint_max"]),
                                     checkpoint_name="model-ckpt")
    path = None
    if rc.get("checkpoint_path"):
        p = rc["checkpoint_path"]
        path = tf.train.latest_checkpoint(p) if os.path.isdir(p) else p
        if path is None or not tf.io.gfile.glob(path + ".index"):
            raise ParamsError(f"runconfig.checkpoint_path: no checkpoint at {p}")
    elif rc.get("autoload_last_checkpoint", True):
        path = mgr.latest_checkpoint
    if path:
        status = ckpt.restore(path)
        try:
            status.assert_existing_objects_matched()
        except AssertionError as e:
            raise ParamsError(f"checkpoint {path} does not match the model: {e}") from None
        status.expect_partial()
        log.info("Restored checkpoint %s at global step %d", path, int(step.numpy()))
    return step, ckpt, mgr, path
