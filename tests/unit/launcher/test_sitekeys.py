"""launcher/sitekeys.py: a site-config key declared as a dataclass field, read back as a Key."""
from __future__ import annotations

from dataclasses import dataclass

from csrun_common.flagspec import FlagSpec
from launcher.sitekeys import build, flag_notes, key, keys_of, section


@dataclass(frozen=True)
class _Policy:
    qos: str = key("slurm", "qos", "", "QOS of every job", FlagSpec("qos", "--qos", str, None, "QOS"), "{key}")
    extra: tuple[str, ...] = key("slurm", "extra", (), "verbatim",
                                 FlagSpec("args", "--arg", str, (), "Added to {key}."))


@dataclass(frozen=True)
class _Config:
    tries: int = key("retry", "tries", 3, "tries", FlagSpec("tries", "--tries", int, None, "Tries"),
                     "{key}, {default}", zero_allowed=True)
    slurm: _Policy = section(_Policy)
    name: str = key("job", "name", "x", "the job's name")


def test_keys_are_read_from_the_fields_in_order_a_section_in_its_place():
    keys = list(keys_of(_Config))
    assert [(k.dotted, k.attr, k.path, k.type, k.default) for k in keys] == [
        ("retry.tries", "tries", "", int, 3), ("slurm.qos", "qos", "slurm", str, ""),
        ("slurm.extra", "extra", "slurm", list, []), ("job.name", "name", "", str, "x")]
    assert keys[0].zero_allowed and not keys[3].zero_allowed and keys[3].flag == ""


def test_the_flag_help_and_the_note_name_the_key_and_its_default():
    keys = tuple(keys_of(_Config))
    assert keys[2].spec is not None and keys[2].spec.help == "Added to slurm.extra."
    assert flag_notes(keys) == {"tries": "retry.tries, 3", "qos": "slurm.qos"}


def test_build_fills_the_sections_turns_lists_into_tuples_and_keeps_defaults():
    cfg = build(_Config, {"slurm.extra": ["--mem=0"], "retry.tries": 0}, name="y")
    assert cfg == _Config(tries=0, slurm=_Policy(extra=("--mem=0",)), name="y")
    keys = tuple(keys_of(_Config))
    assert [k.value(cfg) for k in keys] == [0, "", ("--mem=0",), "y"]
    assert build(_Config, {}) == _Config()
