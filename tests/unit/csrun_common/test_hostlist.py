"""csrun_common/hostlist.py: a GRES node given as a Slurm hostlist."""
from __future__ import annotations

import pytest

from csrun_common.errors import CsrunError
from csrun_common.hostlist import expand_hostlist


def test_gres_node_as_a_hostlist():
    assert expand_hostlist("node[1-3,5],gpu[08-10],x") == ["node1", "node2", "node3", "node5", "gpu08",
                                                                 "gpu09", "gpu10", "x"]
    assert expand_hostlist("") == [] and expand_hostlist("node1") == ["node1"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_hostlist("node[1-2")
    from launcher.resolve import gres_nodes
    with pytest.raises(CsrunError, match=r"gres.node = 'n\[2-1\]': not a node name or Slurm hostlist"):
        gres_nodes("n[2-1]")
