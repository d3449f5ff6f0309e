"""A site-config key declared once: a dataclass field holding its :class:`Key` (TOML place,
help, the :class:`~csrun_common.flagspec.FlagSpec` of the flag that wins over it).

:class:`launcher.config.SiteConfig` and its ``[slurm]`` section :class:`launcher.policy.SitePolicy`
declare their fields with :func:`key`; the field's annotation is the key's type and its
default the key's embedded default. Everything else is read from the fields by
:func:`keys_of`: the TOML schema, ``--show-config``, the click options of the flags
(:mod:`launcher.flags`) and their help's ``[default: ...]`` (:func:`flag_notes`). The shape is
submitit's (the valid keys are one declaration, read by introspection).
"""
from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from csrun_common.flagspec import FlagSpec

__all__ = ["Key", "key", "section", "keys_of", "build", "flag_notes"]

_KEY = "csrun.key"
_SECTION = "csrun.section"


@dataclass(frozen=True)
class Key:
    """One site-config key.

    Attributes:
        section, name: its TOML place, ``section.name``.
        help: the one line ``templates/config.toml`` and the README paraphrase.
        spec: the flag that wins over it (``None``: no flag does), its help's ``{key}`` already
            the dotted name.
        note: the ``[default: ...]`` that flag's help shows (``None``: none).
        zero_allowed: an ``int`` key for which 0 is valid (the others must be positive).
        attr: the field holding it; ``path``: the section field above it (``"slurm"``) or ``""``.
        type: ``int``, ``str``, ``bool`` or ``list`` (a ``tuple[str, ...]`` field); ``default``: the
            embedded default (a list for ``list``).
    """

    section: str
    name: str
    help: str
    spec: FlagSpec | None = None
    note: str | None = None
    zero_allowed: bool = False
    attr: str = ""
    path: str = ""
    type: type = str
    default: Any = None

    @property
    def dotted(self) -> str:
        """``section.name``, as ``--show-config`` and the error messages write it."""
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        """The flag text that wins over the key (``""`` when none does)."""
        return self.spec.flag if self.spec else ""

    def value(self, obj: Any) -> Any:
        """The key's value in ``obj`` (a :class:`launcher.config.SiteConfig`)."""
        return getattr(getattr(obj, self.path) if self.path else obj, self.attr)


def key(section: str, name: str, default: Any, help: str, spec: FlagSpec | None = None,
        note: str | None = None, zero_allowed: bool = False) -> Any:
    """The dataclass field of key ``section.name`` (embedded ``default``). In ``spec``'s help
    and in ``note``, ``{key}`` is the dotted name and ``{default}`` the default."""
    dotted = f"{section}.{name}"
    if spec is not None:
        spec = replace(spec, help=spec.help.replace("{key}", dotted))
    if note is not None:
        note = note.replace("{key}", dotted).replace("{default}", str(default))
    return field(default=default, metadata={_KEY: Key(section, name, help, spec, note, zero_allowed)})


def section(cls: type) -> Any:
    """The field of a section whose keys ``cls`` declares (its own :func:`key` fields)."""
    return field(default_factory=cls, metadata={_SECTION: True})


def _typed(f: Field, hints: Mapping[str, Any], path: str) -> Key:
    k: Key = f.metadata[_KEY]
    typ = hints[f.name]
    default: Any = f.default
    is_list = typing.get_origin(typ) is tuple
    return replace(k, attr=f.name, path=path, type=list if is_list else typ,
                   default=list(default) if is_list else default)


def keys_of(cls: type, path: str = "") -> Iterator[Key]:
    """The keys ``cls`` declares, in field order, a :func:`section` field's in its place."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get(_SECTION):
            yield from keys_of(hints[f.name], f.name)
        elif _KEY in f.metadata:
            yield _typed(f, hints, path)


def build(cls: type, values: Mapping[str, Any], **extra: Any) -> Any:
    """An instance of ``cls`` holding ``values`` (``section.name`` -> value; a missing key: its
    default; a list: as a tuple), its sections built the same way; ``extra``: other fields'
    values (they win)."""
    hints = typing.get_type_hints(cls)
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get(_SECTION):
            kw[f.name] = build(hints[f.name], values)
        elif _KEY in f.metadata:
            k = _typed(f, hints, "")
            value = values.get(k.dotted, k.default)
            kw[f.name] = tuple(value) if k.type is list else value
    return cls(**{**kw, **extra})


def flag_notes(keys: tuple[Key, ...]) -> dict[str, str]:
    """Flag parameter name -> the ``[default: ...]`` its help shows (the keys' ``note``)."""
    return {k.spec.name: k.note for k in keys if k.spec is not None and k.note is not None}
