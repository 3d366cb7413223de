"""Settings <-> flags and files: every setting of settings.py as a path and a flag, checked,
and a run's config as JSON.

A setting's path is "group.field" ('optim.lr'; `leaves` lists them all) and its flag is
--field (`flag_of`); `check` stops a value outside its range, naming the flag; `to_dict`
(and `from_dict`) keep a run's config as JSON in its folder, so `--resume` reads the
run's own settings; `refuse` stops a combination of flags that cannot work in one line.
"""

import dataclasses
import math
from typing import Any


def leaves(cfg) -> list[tuple[str, dataclasses.Field, Any]]:
    """(path, field, value) of every setting: 'lr' on top, 'optim.lr' inside a group."""
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += [(f"{f.name}.{p}", g, v) for p, g, v in leaves(value)]
        else:
            out.append((f.name, f, value))
    return out


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", f"--{f.name}")


def replace_paths(cfg, changes: dict):
    """A copy of cfg with {'group.field': value} (or {'field': value}) changed."""
    groups, top = {}, {}
    for path, value in changes.items():
        owner, _, name = path.rpartition(".")
        (groups.setdefault(owner, {}) if owner else top)[name] = value
    for owner, values in groups.items():
        top[owner] = dataclasses.replace(getattr(cfg, owner), **values)
    return dataclasses.replace(cfg, **top)


def check(cfg) -> None:
    """Stop with the flag and the allowed range when a value is out of bounds."""
    for _, f, value in leaves(cfg):
        meta, values = f.metadata, value if isinstance(value, tuple | list) else (value,)
        for v in values:
            if not isinstance(v, int | float) or isinstance(v, bool):
                continue
            if not math.isfinite(v):
                raise SystemExit(f"{flag_of(f)} must be a finite number, got {value}")
            if "minimum" in meta and v < meta["minimum"]:
                raise SystemExit(f"{flag_of(f)} must be at least {meta['minimum']}, got {value}")
            if meta.get("positive") and v <= 0:
                raise SystemExit(f"{flag_of(f)} must be above 0, got {value}")
            if "maximum" in meta and v > meta["maximum"]:
                raise SystemExit(f"{flag_of(f)} must be at most {meta['maximum']}, got {value}")
        choices = meta.get("choices")
        if choices and any(v not in choices for v in values if v is not None):
            raise SystemExit(f"{flag_of(f)} {value!r} is not one of {list(choices)}")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def refuse(condition, message: str):
    """Stop with one line saying why, when a combination of flags cannot work."""
    if condition:
        raise SystemExit(message)


def from_dict(cls, saved: dict, source="config"):
    """A config from its JSON form; fields added since it was saved keep today's defaults.
    A value of the wrong type, or a setting this version lacks (a typo, one removed since),
    stops with the field and the file (`source`). `saved` is a dict: base_bert.read_json_object
    reads a run's config.json and refuses anything else."""
    cfg = cls()
    known = {path for path, _, _ in leaves(cfg)}
    given = set()
    for key, value in saved.items():  # 'seed' on top, 'optim.lr' inside a group
        given |= {f"{key}.{n}" for n in value} if isinstance(value, dict) else {key}
    if given - known:  # a typo would otherwise run with the default
        raise SystemExit(f"{source}: unknown settings {', '.join(sorted(given - known))}")
    if not given:
        raise SystemExit(f"{source}: no settings; expected those of a run's config.json")
    changes = {}
    for path, _, default in leaves(cfg):
        owner, _, name = path.rpartition(".")
        node = saved.get(owner, {}) if owner else saved
        if not isinstance(node, dict) or name not in node:
            continue
        value = node[name]
        expected = str if default is None else type(default)
        numeric = expected is float and isinstance(value, int) and not isinstance(value, bool)
        fits = isinstance(value, list if expected is tuple else expected) or numeric
        if not (fits or (default is None and value is None)):
            raise SystemExit(f"{source}: {path} is {value!r}; expected a {expected.__name__}")
        changes[path] = tuple(value) if expected is tuple else value
    cfg = replace_paths(cfg, changes)
    check(cfg)
    return cfg
