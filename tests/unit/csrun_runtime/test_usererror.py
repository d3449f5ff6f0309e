"""csrun_runtime.usererror: one filter of a user's frames for every backend. The PyTorch cases
(real DataLoaders, a worker process's error) are in tests/unit/features/test_pytorch_usererror.py; here,
without a framework: a traceback of its own, one printed in the message (as TensorFlow prints a
``map`` function's), and a framework's generated files left out."""
from __future__ import annotations

import pytest

from csrun_runtime.usererror import UserCodeError, describe, guarded, is_user_file, user_frames

HERE = __file__


def _raise_here():
    raise ValueError("bad row 7")


def _caught() -> BaseException:
    try:
        _raise_here()
    except ValueError as e:
        return e
    raise AssertionError("not raised")


def test_the_users_own_frames_and_the_first_line():
    e = _caught()
    lines = describe(e, "train_input: input_fn").splitlines()
    assert lines[0] == "train_input: input_fn raised ValueError: bad row 7 (in _raise_here)"
    assert lines[-2] == f'  File "{HERE}", line {_raise_here.__code__.co_firstlineno + 1}, in _raise_here'
    assert lines[-1] == '    raise ValueError("bad row 7")'


def test_a_traceback_printed_in_the_message_gives_the_frames_and_the_exception_line():
    msg = ("Error in user-defined function passed to Map:\nTraceback (most recent call last):\n"
           '  File "/home/me/job/data.py", line 12, in parse\n    x = decode(row)\n'
           '  File "/tmp/__autograph_generated_fileab12.py", line 3, in tf__decode\n    raise ag__.x\n'
           "KeyError: 'label'\n\n\t [[{{node PyFunc}}]] [Op:IteratorGetNext]")
    err = RuntimeError(msg)
    text = describe(err, "train_input: input_fn", generated=("__autograph_generated_file",))
    assert text.splitlines() == ["train_input: input_fn raised KeyError: 'label' (in parse)",
                                 '  File "/home/me/job/data.py", line 12, in parse', "    x = decode(row)"]
    assert [f[2] for f in user_frames(err)] == ["parse", "tf__decode"]  # not left out without the hint


def test_files_that_are_not_the_users():
    assert is_user_file("/home/me/job/data.py")
    assert not is_user_file("<frozen importlib._bootstrap>") and not is_user_file("")
    assert not is_user_file(describe.__code__.co_filename)  # csrun's own
    assert not is_user_file("/tmp/__autograph_generated_file1.py", ("__autograph_generated_file",))
    assert describe(RuntimeError(""), "x") == "x raised RuntimeError"


def test_guarded_names_what_raised_and_lets_a_passing_error_through():
    def rows():
        yield 1
        _raise_here()

    got = []
    with pytest.raises(UserCodeError) as info:
        for r in guarded(rows(), "train_input: the DataLoader"):
            got.append(r)
    assert str(info.value).startswith("train_input: the DataLoader raised ValueError: bad row 7 (in _raise_here)")
    assert isinstance(info.value.error, ValueError) and got == [1]
    with pytest.raises(ValueError) as passed:
        list(guarded(rows(), "x", passes=lambda e: isinstance(e, ValueError)))
    assert not isinstance(passed.value, UserCodeError)
