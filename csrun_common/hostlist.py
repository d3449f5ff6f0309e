"""Slurm hostlist expressions (``"node[1-3,5],gpu[08-10]"``) as node names, without asking Slurm.

Pure Python: the launcher reads the site's ``gres.node`` with it (launcher.resolve.gres_nodes)
and a trainer rank its chief nodes (csrun_runtime.ranks.chief_hosts). The syntax is Slurm's
(scontrol(1) ``show hostnames``: "Takes an optional hostlist expression as input and writes a
list of individual host names").
"""
from __future__ import annotations

__all__ = ["expand_hostlist"]


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``"a[1,3],b"`` -> ``["a[1,3]", "b"]``)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def expand_hostlist(text: str) -> list[str]:
    """Node names of a Slurm hostlist (``"node[1-3,5],gpu01"``; padding kept: ``"gpu[08-10]"`` ->
    ``gpu08, gpu09, gpu10``) as scontrol(1) ``show hostnames`` prints them; ``""``: none. Raises
    ``ValueError`` for an unbalanced bracket or a range not ``a-b`` with ``a <= b``."""
    out: list[str] = []
    for part in filter(None, (p.strip() for p in _split_top(text))):
        out += _expand_one(part)
    return out


def _expand_one(part: str) -> list[str]:
    start = part.find("[")
    if start < 0:
        if "]" in part:
            raise ValueError(f"{part!r}: unbalanced ']'")
        return [part]
    end = part.find("]", start)
    if end < 0:
        raise ValueError(f"{part!r}: unbalanced '['")
    head, body, tail = part[:start], part[start + 1:end], part[end + 1:]
    names = []
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or (hi and (not hi.isdigit() or int(hi) < int(lo))):
            raise ValueError(f"{part!r}: {item!r} is not a number or a range a-b")
        names += [f"{head}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return [f"{name}{rest}" for name in names for rest in _expand_one(tail)] if tail else names
