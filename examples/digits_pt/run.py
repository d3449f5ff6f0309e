"""Digits with PyTorch through csrun, in the Model Zoo R1.6.1 shape (docs/PYTORCH.md)::

    python examples/digits_pt/run.py --mode train                       # one local process
    csrun_wse --total-nodes 3 --tasks-per-node 1 python-pt examples/digits_pt/run.py --mode train
    csrun_wse --total-nodes 3 --tasks-per-node 1 python-pt examples/digits_pt/run.py --mode eval
"""
import os
import sys

from csrun_runtime.pytorch import run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import eval_data_fn, train_data_fn  # noqa: E402
from model import model_fn  # noqa: E402

if __name__ == "__main__":
    run(model_fn, train_data_fn, eval_data_fn)
