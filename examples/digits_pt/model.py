"""A small MLP on the 8x8 digits: ``forward(batch)`` returns the cross-entropy loss (csrun's
PyTorch contract, docs/PYTORCH.md); ``eval_metrics(batch)`` its accuracy."""
from __future__ import annotations

import torch
from torch import nn


class DigitsMLP(nn.Module):
    """``depth`` hidden layers of ``hidden_size`` (``params["model"]``), 64 inputs, 10 classes."""

    def __init__(self, model: dict):
        super().__init__()
        act = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[model.get("activation_fn", "relu")]
        layers: list[nn.Module] = []
        width = 64
        for _ in range(int(model.get("depth", 2))):
            layers += [nn.Linear(width, int(model.get("hidden_size", 64))), act()]
            width = int(model.get("hidden_size", 64))
            if model.get("dropout"):
                layers.append(nn.Dropout(float(model["dropout"])))
        layers.append(nn.Linear(width, int(model.get("num_classes", 10))))
        self.net = nn.Sequential(*layers)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, batch):
        x, y = batch
        return self.loss(self.net(x), y)

    @torch.no_grad()
    def eval_metrics(self, batch) -> dict:
        x, y = batch
        return {"accuracy": (self.net(x).argmax(dim=1) == y).float().mean().item()}


def model_fn(params: dict) -> nn.Module:
    return DigitsMLP(params.get("model") or {})
