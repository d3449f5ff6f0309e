"""Code both sides of csrun share: the CLI side (``launcher``, ``analyzer``) and the task
side (``csrun_runtime``).

Modules: :mod:`.errors` (the one-line error family), :mod:`.cli` (the one-line exit of the
three CLIs), :mod:`.atomic` (atomic file writes), :mod:`.roles` (the environment contract
between ``csrun_wse`` and its tasks), :mod:`.shardplan_schema` (the shard-plan file),
:mod:`.layout` (the csrun_wse layout and its one encoder to flags), :mod:`.env` (every
``CSRUN_*`` variable, declared once, and the task contract's codec), :mod:`.exits` (csrun's
exit statuses), :mod:`.tfrecord` (TFRecord framing without TensorFlow).
Pure Python: imports neither TensorFlow nor anything from ``launcher``, ``analyzer`` or
``csrun_runtime``.
"""
