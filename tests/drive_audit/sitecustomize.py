"""What a stand-in Google Drive would be charged for: on PYTHONPATH, every Python process
(the notebook's kernel and the runs it starts) logs, with an audit hook (PEP 578), each
file operation under $MINBERT_AUDIT_ROOT to $MINBERT_AUDIT_LOG, one JSON line each:

    {"op": "replace", "path": DST, "bytes": size of SRC, "replaced": size DST had}
    {"op": "remove", "path": P, "replaced": size P had}
    {"op": "open", "path": P, "mode": MODE, "replaced": size a truncating open threw away}

Drive keeps every replaced or removed file (in the bin, or as an old version) for 30 days,
so "replaced" is what a run leaves counted against the quota beyond its live files.
"""

import json
import os
import sys

ROOT, LOG = os.environ.get("MINBERT_AUDIT_ROOT"), os.environ.get("MINBERT_AUDIT_LOG")


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except (OSError, TypeError, ValueError):
        return 0


def _under_root(path) -> bool:
    return isinstance(path, str | bytes | os.PathLike) and os.path.abspath(
        os.fsdecode(path)
    ).startswith(ROOT)


def _record(fd: int, entry: dict) -> None:
    entry["path"] = os.path.abspath(os.fsdecode(entry["path"]))
    os.write(fd, (json.dumps(entry) + "\n").encode())  # os.write raises no audit event


def _hook(fd: int):
    def hook(event, args):
        if event in ("os.rename", "os.replace") and _under_root(args[1]):
            entry = {"op": "replace", "path": args[1], "bytes": _size(args[0])}
            _record(fd, entry | {"replaced": _size(args[1])})
        elif event == "os.remove" and _under_root(args[0]):
            _record(fd, {"op": "remove", "path": args[0], "replaced": _size(args[0])})
        elif event == "open" and _under_root(args[0]):
            mode, flags = args[1] or "", args[2] or 0
            truncates = "w" in mode or (not mode and flags & os.O_TRUNC)
            if truncates or "a" in mode or "+" in mode:
                replaced = _size(args[0]) if truncates else 0
                _record(fd, {"op": "open", "path": args[0], "mode": mode, "replaced": replaced})

    return hook


if ROOT and LOG:
    ROOT = os.path.abspath(ROOT)
    sys.addaudithook(_hook(os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)))
