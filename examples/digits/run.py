"""Digits: train/evaluate a small fully connected classifier on real data through csrun.

    python examples/digits/run.py --params examples/digits/configs/params.yaml --mode train
    csrun_wse --total-nodes 4 --single-task-nodes 1 --tasks-per-node 2 \
        python-ws examples/digits/run.py --params examples/digits/configs/params.yaml \
        --mode train --max_steps 400
"""
# isort: off
# csrun_runtime first, before data/model import TensorFlow: it sets TensorFlow's C++ log level
# and catches csrun_wse --requeue's stop signals while TensorFlow still loads.
from csrun_runtime import run
from data import eval_input_fn, input_fn
from model import model_fn
# isort: on

if __name__ == "__main__":
    run(input_fn=input_fn, model_fn=model_fn, eval_input_fn=eval_input_fn)
