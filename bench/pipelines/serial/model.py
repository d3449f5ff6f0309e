"""model_fn of the serial pipeline: a small classifier (the pipeline is what is measured)."""
from __future__ import annotations

import keras


def model_fn(params: dict) -> keras.Model:
    """Compiled ``keras.Model``: float32[B, 16] -> logits[B, 10]."""
    m = params.get("model", {})
    model = keras.Sequential([keras.Input((16,), name="features"),
                              keras.layers.Dense(int(m.get("hidden_size", 32)), activation="relu"),
                              keras.layers.Dense(10, name="logits")], name="serial_bench")
    model.compile(optimizer=keras.optimizers.Adam(float(params.get("optimizer", {}).get("learning_rate", 0.01))),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
