"""model_fn of the digits example: a fully connected classifier in the spirit of Model Zoo's
fc_mnist (``depth`` hidden layers of ``hidden_size`` units, ``activation_fn``, ``dropout``;
``batch_norm: true`` puts a BatchNormalization after each hidden layer)."""
from __future__ import annotations

import keras


def model_fn(params: dict) -> keras.Model:
    """Compiled ``keras.Model``: float32[B, 64] -> logits[B, 10]; sparse CE loss, accuracy."""
    m = params.get("model", {})
    o = params.get("optimizer", {})
    layers = [keras.Input((64,), name="image")]
    for _ in range(int(m.get("depth", 2))):
        layers.append(keras.layers.Dense(int(m.get("hidden_size", 64)),
                                         activation=m.get("activation_fn", "relu")))
        if m.get("batch_norm"):
            layers.append(keras.layers.BatchNormalization())
        if float(m.get("dropout", 0.0)) > 0:
            layers.append(keras.layers.Dropout(float(m["dropout"])))
    layers.append(keras.layers.Dense(int(m.get("num_classes", 10)), name="logits"))
    model = keras.Sequential(layers, name="fc_digits")
    kind = str(o.get("optimizer_type", "adam")).lower()
    lr = float(o.get("learning_rate", 0.01))
    if kind == "sgd":
        opt = keras.optimizers.SGD(lr, momentum=float(o.get("momentum", 0.0)))
    elif kind == "adam":
        opt = keras.optimizers.Adam(lr)
    else:
        raise ValueError(f"optimizer.optimizer_type {kind!r}: use adam or sgd")
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
