"""csrun_runtime/pytorch/checkpoint.py: the newest checkpoints kept and resumed from, their files' mode
under the umask."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


from csrun_runtime.pytorch import checkpoint  # noqa: E402


# ------------------------------------------------------------------ checkpoints and events
def test_checkpoint_round_trip_keeps_the_newest_and_resumes(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.rand(5, 3)).sum().backward()
    opt.step()
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, step, m, opt, keep=2)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [30, 40]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters(), lr=0.1)
    assert checkpoint.load(checkpoint.latest(tmp_path), m2, opt2) == 40
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values(), strict=True))
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    with pytest.raises(checkpoint.CheckpointError, match="does not fit the model"):
        checkpoint.load(checkpoint.latest(tmp_path), torch.nn.Linear(4, 2))
    (tmp_path / "model-ckpt-50.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoint.CheckpointError, match="model-ckpt-50.pt: cannot be read"):
        checkpoint.load(checkpoint.latest(tmp_path), m2)
    assert checkpoint.latest(tmp_path / "missing") is None


def test_checkpoint_file_mode_honours_the_umask(tmp_path):
    """Teammates on a shared cluster read checkpoints: 0o666 & ~umask, as a plain open() gives."""
    import os

    m = torch.nn.Linear(2, 1)
    old = os.umask(0o022)
    try:
        p = checkpoint.save(tmp_path, 1, m, None, keep=2)
        os.umask(0o027)
        q = checkpoint.save(tmp_path, 2, m, None, keep=2)
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777, q.stat().st_mode & 0o777) == (0o644, 0o640)
