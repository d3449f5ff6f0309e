"""Serial pipeline: a GIL-bound ``tf.py_function`` per sample (benchmark 3's third pipeline).

Each sample runs a pure-Python loop inside ``tf.py_function``: it holds the Python GIL, so
one process gains nothing from more CPUs (threads wait for the GIL) and only more *tasks*
(processes) scale it. The analyzer should find that out and recommend tasks × 1 CPU.

    python bench/pipelines/serial/run.py --params bench/pipelines/serial/configs/params.yaml --mode train
    cs_input_analyzer --no-run-command python bench/pipelines/serial/run.py \
        --params bench/pipelines/serial/configs/params.yaml --mode validate_only
"""
from csrun_runtime import run  # first: it quiets TensorFlow's C++ start-up logging  # noqa: I001

from data import input_fn  # noqa: E402
from model import model_fn  # noqa: E402

if __name__ == "__main__":
    run(input_fn=input_fn, model_fn=model_fn)
