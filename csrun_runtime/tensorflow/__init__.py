"""The TensorFlow backend of the task runtime: a run.py's ``from csrun_runtime import run`` is
:func:`csrun_runtime.tensorflow.runner.run`. Its entry modules have the same names as
:mod:`csrun_runtime.pytorch`'s; everything framework-neutral (roles, rendezvous, the data
plane, the stream merge, the training loop, stop signals, artifacts) is the core at the top of
:mod:`csrun_runtime`. TensorFlow itself is imported inside functions (:mod:`.quiet` in a
launched task), never by importing this package.
"""
