"""Each site-config key is declared once (``launcher.config.KEYS``); these tests fail when the
dataclass, the commented template, ``--show-config``, the CLIs or the README drift from it."""
from __future__ import annotations

import dataclasses
import re

import click
import pytest
import tomllib

from csrun_common.layout import LAYOUT_FLAGS
from launcher.cli import csrun_cpu, csrun_wse
from launcher.config import FLAG_NOTES, KEY_OF, KEYS, SiteConfig, format_config, load_config
from launcher.flags import CPU_OPTIONS, GROUPS, WSE_OPTIONS, CpuFlags, WseFlags
from launcher.policy import SitePolicy
from tests.unit.paths import REPO as ROOT


def _flags(cmd: click.Command) -> set[str]:
    out: set[str] = set()
    for p in cmd.params:
        if isinstance(p, click.Option):
            out.update(p.opts)
            out.update(p.secondary_opts)
    return out


def test_siteconfig_fields_are_the_declared_keys():
    """Every field of SiteConfig and of its [slurm] section declares a key; SiteConfig() holds the
    embedded defaults that load_config() falls back to."""
    top = {("", f.name) for f in dataclasses.fields(SiteConfig)} - {("", "sources"), ("", "slurm")}
    assert {(k.path, k.attr) for k in KEYS} == top | {("slurm", f.name) for f in dataclasses.fields(SitePolicy)}
    assert [v for _, v, _ in SiteConfig().items()] == [k.default for k in KEYS]


def test_a_keys_flag_shows_the_key_and_its_default_in_help():
    """The ``[default: ...]`` of a flag that falls back to a key is generated from the key."""
    helps = {p.name: p.help for p in csrun_wse.params if isinstance(p, click.Option)}
    assert helps["requeue_signal"].endswith(f"[default: requeue.signal, {KEY_OF['requeue_signal'].default}].")
    assert helps["max_requeues"].endswith(f"[default: requeue.max_requeues, {KEY_OF['max_requeues'].default}].")
    assert helps["qos"] == "Quality of service [default: slurm.qos]."
    assert "(repeatable; added to slurm.extra_args)" in helps["slurm_args"]
    assert {n: helps[n] for n in FLAG_NOTES if f"[default: {FLAG_NOTES[n]}]" not in helps[n]} == {}


def test_template_holds_every_key_with_its_default():
    data = tomllib.loads((ROOT / "templates" / "config.toml").read_text())
    found = {f"{s}.{k}": v for s, body in data.items() for k, v in body.items()}
    assert found == {k.dotted: k.default for k in KEYS}


def test_show_config_lists_every_key_in_declared_order(tmp_path):
    text = format_config(load_config({"HOME": str(tmp_path)}))
    keys = [line.split(" = ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert keys == [k.dotted for k in KEYS]


@pytest.mark.parametrize("key", [k for k in KEYS if k.flag], ids=lambda k: k.dotted)
def test_the_flag_that_wins_over_a_key_exists(key):
    assert key.flag in _flags(csrun_wse) | _flags(csrun_cpu)


@pytest.mark.parametrize("cmd", [csrun_wse, csrun_cpu], ids=lambda c: c.name)
def test_every_flag_is_documented(cmd):
    """Every option of the CLIs appears in the README or a docs/ page the README links."""
    readme = (ROOT / "README.md").read_text()
    docs = [ROOT / link for link in re.findall(r"\]\((docs/[A-Za-z0-9_\-]+\.md)", readme)]
    text = readme + "".join(p.read_text() for p in docs if p.exists())
    missing = sorted(f for f in _flags(cmd) if f.startswith("--") and f"`{f}" not in text and f" {f}" not in text)
    assert not missing, f"{cmd.name} options the README and its docs pages do not mention: {missing}"


def test_every_key_is_in_the_readme_table():
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    missing = [k.dotted for k in KEYS if not any(f"`{k.dotted}`" in row for row in rows)]
    assert not missing, f"site-config keys missing from the README's table: {missing}"


@pytest.mark.parametrize(("cmd", "flags", "specs"),
                         [(csrun_wse, WseFlags, WSE_OPTIONS), (csrun_cpu, CpuFlags, CPU_OPTIONS)], ids=["wse", "cpu"])
def test_typed_flags_are_the_declared_flags(cmd, flags, specs):
    """The click parameters are the declarations (one FlagSpec each), and the typed value the
    command works on has a field of the same name and default for each, the site-policy flags in
    its ``policy`` mapping and the layout flags in its ``layout`` mapping (WseFlags)."""
    passed = {p.name for p in cmd.params if p.expose_value and p.name != "command"}
    assert passed == {s.name for s in specs}
    groups = {f.name: f.default_factory() for f in dataclasses.fields(flags) if f.name in GROUPS}
    assert set(groups) == ({"policy", "layout"} if flags is WseFlags else {"policy"})
    grouped = {name: default for mapping in groups.values() for name, default in mapping.items()}
    typed = {f.name: f.default for f in dataclasses.fields(flags) if f.name not in GROUPS}
    assert typed == {s.name: s.default for s in specs if s.name not in grouped}
    assert grouped == {s.name: s.default for s in specs if s.name not in typed}
    assert WseFlags().layout == {s.name: s.default for s in LAYOUT_FLAGS}
    for p in cmd.params:
        if isinstance(p, click.Option) and p.name in typed:
            assert p.default == typed[p.name] or (p.multiple and tuple(p.default or ()) == typed[p.name]), p.name


def test_the_layout_flags_reach_the_typed_layout():
    flags = WseFlags.from_click({"nodes": 3, "cyclic": True, "check": True, "qos": "debug", "slurm_args": ["-a"]})
    assert flags.layout == {**WseFlags().layout, "nodes": 3, "cyclic": True} and flags.check
    assert flags.policy == {**WseFlags().policy, "qos": "debug", "slurm_args": ("-a",)}


def test_an_undeclared_parameter_is_refused_naming_it():
    with pytest.raises(TypeError, match="nodes_total"):
        WseFlags.from_click({"nodes_total": 3})
