"""launcher/container.py: a container runtime wrapping the task's command, and its refusals."""

import pytest

from csrun_common.errors import CsrunError
from launcher.builders import CpuRequest
from launcher.container import Container, split_mount_dirs

PY = "/opt/venv/bin/python"


def test_containers_wrap_the_command():
    sing = Container("singularity", "/img/tf.sif", ("/data", "/scratch"))
    assert sing.wrap(["python", "x.py"]) == ["singularity", "exec", "-B", "/data,/scratch", "/img/tf.sif", "python",
                                             "x.py"]
    assert Container("apptainer", "/i.sif").wrap(["a"]) == ["apptainer", "exec", "/i.sif", "a"]
    pyx = Container("pyxis", "nvcr.io#tf", ("/data",))
    assert pyx.wrap(["a"]) == ["a"]
    assert pyx.srun_options() == ["--container-image=nvcr.io#tf", "--container-mounts=/data:/data"]
    req = CpuRequest(command=("python", "x.py"), python=PY, node_cpus=2, container=pyx, exclude_node="node1")
    assert "--container-image=nvcr.io#tf" in req.materialize_srun()


def test_container_errors():
    with pytest.raises(CsrunError, match="container.image is empty"):
        Container("singularity", "").validate()
    with pytest.raises(CsrunError, match="--mount-dirs 'a,b:c'"):
        split_mount_dirs("a,b:c")
    assert split_mount_dirs("/a,,/b") == ("/a", "/b")
