"""csrun_runtime/usererror.py with PyTorch through csrun_runtime/pytorch/contract.py (issue 33 item 9):
an exception of the user's Dataset, collate or data function, named with its type, message and the
last frames in the user's code (not torch's or csrun's), also from a DataLoader worker process."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from csrun_runtime.pytorch.contract import ContractError, call_data_fn, epochs  # noqa: E402
from csrun_runtime.usererror import UserCodeError, describe, guarded, is_user_file  # noqa: E402

HERE = __file__


class Broken(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError(f"sample {i} is broken")
        return torch.tensor([float(i)])


def _first_error(loader) -> str:
    with pytest.raises(UserCodeError) as info:
        for _ in guarded(epochs(loader), "train_input: the DataLoader", passes=lambda e: isinstance(e, ContractError)):
            pass
    return str(info.value)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_raising_getitem_is_named_with_its_frames(workers):
    text = _first_error(DataLoader(Broken(), batch_size=2, num_workers=workers))
    lines = text.splitlines()
    assert lines[0] == "train_input: the DataLoader raised ValueError: sample 3 is broken (in __getitem__)", text
    assert lines[1] == f'  File "{HERE}", line 24, in __getitem__'
    assert lines[2] == '    raise ValueError(f"sample {i} is broken")'
    assert "site-packages" not in text and "csrun_runtime" not in text and len(lines) <= 7


def test_a_raising_collate_function_and_data_function():
    def collate(items):
        raise KeyError("label")

    text = _first_error(DataLoader(list(range(4)), batch_size=2, collate_fn=collate))
    assert text.startswith("train_input: the DataLoader raised KeyError: 'label' (in collate)"), text

    def data_fn(params):
        return DataLoader(Broken(), batch_size=params["train_input"]["batch_sise"])

    with pytest.raises(ContractError) as info:
        call_data_fn(data_fn, {"train_input": {}}, "train_input")
    first, frame, code = str(info.value).splitlines()
    assert first == "train_input: the data function raised KeyError: 'batch_sise' (in data_fn)"
    assert frame.startswith(f'  File "{HERE}", line ') and code.strip().startswith("return DataLoader(")


def test_user_files_and_an_exception_without_user_frames():
    assert is_user_file("/home/me/job/data.py") and not is_user_file(torch.__file__)
    assert not is_user_file("<frozen importlib._bootstrap>")
    assert describe(RuntimeError(""), "x") == "x raised RuntimeError"
