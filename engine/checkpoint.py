"""Checkpoints of a run folder: safetensors and JSON, written atomically, never unpickled.

- best.safetensors: the best model so far, with its config and its table row;
- state.safetensors: everything needed to continue after the last finished stage, or from
  a step inside a stage (model, optimizer moments, random generators, gradient scaler,
  best-so-far, table rows; inside a stage also the teacher and the position);
- metrics.jsonl (the forgetting table, a JSON row per stage), steps.jsonl (a line per
  training step), forgetting.json (the table's measures) and config.json: text.

A checkpoint is one safetensors file: the tensors, plus one JSON document in the file's
metadata. Loading it runs no code (unlike torch.load of a pickle), so a crafted file in a
run folder can do no harm. Every file is written to a temporary name, flushed to disk and
renamed: a crash, a kill or a full disk leaves the previous version whole. A Ctrl-C or
SIGTERM that arrives during a write waits until the write is done.
"""

import contextlib
import errno
import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

BEST, STATE = "best.safetensors", "state.safetensors"
METRICS = "metrics.jsonl"  # the forgetting table of a run folder: one JSON row per stage
STEPS = "steps.jsonl"  # the step log: one JSON line per training step
FORGETTING = "forgetting.json"  # evaluation.forgetting of the table, written at the end


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; the message names the file."""


# ---------------------------------------------------------------------------------------
# Atomic files


@contextlib.contextmanager
def signals_caught():
    """Within the block, Ctrl-C and SIGTERM are noted in the yielded list instead of
    stopping the program; the caller decides when to stop."""
    caught = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in handlers:
            signal.signal(s, lambda number, frame: caught.append(number))
    except ValueError:  # not the main thread: signals cannot be caught here anyway
        handlers = {}
    try:
        yield caught
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred():
    """Hold Ctrl-C and SIGTERM until the block is done, then deliver them to the handlers
    in place before it (Ctrl-C: KeyboardInterrupt; inside signals_caught: noted there)."""
    with signals_caught() as caught:
        yield
    for number in caught:
        signal.raise_signal(number)


def atomic_write(data: bytes | str, path: Path) -> None:
    """Write to path.tmp, flush it to disk, rename over path."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    data = data.encode() if isinstance(data, str) else data
    with signals_deferred():
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_folder(path.parent)  # the rename itself survives a power loss
        except OSError as e:
            tmp.unlink(missing_ok=True)
            full = " (the disk is full)" if e.errno == errno.ENOSPC else ""
            raise CheckpointError(
                f"cannot write {path}: {e.strerror}{full}; the previous {path.name}, if any, "
                "is unchanged"
            ) from None


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without folder handles (Windows): the rename is enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (network mounts) cannot sync a folder
    finally:
        os.close(fd)


def write_tensors(tensors: dict, info: dict, path: Path) -> None:
    """One safetensors file: the tensors and `info` (JSON) in its metadata."""
    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write(save(flat, metadata={"info": json.dumps(info)}), path)


def read_tensors(path: Path) -> tuple[dict, dict]:
    """(tensors, info) of a file written by write_tensors."""
    path = Path(path)
    try:
        with safe_open(str(path), "pt") as f:  # one read: the metadata, then the tensors
            info = json.loads((f.metadata() or {})["info"])
            return {k: f.get_tensor(k) for k in f.keys()}, info
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({type(e).__name__}: {e}); it may be "
            "truncated or from another program"
        ) from None


# ---------------------------------------------------------------------------------------
# The best model and the run's state


def check_compatible(saved: dict, current: dict, path):
    """Stop with the differing fields when a checkpoint was made for another model."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [
                f"{key}.{k}: {a.get(k)!r} vs {b.get(k)!r}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        elif a != b:
            diffs.append(f"{key}: {a!r} vs {b!r}")
    if diffs:
        raise CheckpointError(
            f"{path} was saved for another model (checkpoint vs now): " + "; ".join(diffs)
        )


def split(tensors: dict, prefix: str) -> dict:
    """The tensors named `prefix...`, by the rest of their name."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def _load_weights(model, tensors: dict, info: dict, path: Path) -> None:
    check_compatible(info["config"], json.loads(json.dumps(model.checkpoint_config())), path)
    weights = split(tensors, "model.")
    try:  # strict: every tensor by its name (a module's pre-hook may rename older names)
        model.load_state_dict(weights)
    except RuntimeError as e:  # its first line names the model; the next, the keys
        detail = (str(e).splitlines()[1:] or [str(e)])[0].strip()
        raise CheckpointError(f"{path}: its tensors are not this model's ({detail})") from None


def load_model(model, path: Path) -> dict:
    """Load a best or state checkpoint's weights into `model` after checking that it was
    made for this model; returns the checkpoint's info (its table row, for best)."""
    tensors, info = read_tensors(path)
    _load_weights(model, tensors, info, path)
    return info


def save_best(model, row: dict, path: Path):
    write_best(model.state_dict(), model.checkpoint_config(), row, path)


def write_best(weights: dict, config: dict, row: dict, path: Path):
    """A best model's file: its weights, its config and its row of the table."""
    tensors = {f"model.{k}": v for k, v in weights.items()}
    write_tensors(tensors, {"config": config, "row": row}, path)


def save_state(model, optimizer, scaler, progress: dict, path: Path, extra=None, rng=None):
    """The run after a finished stage, or inside one. progress: best, rows, next_stage
    (and `within`: the position inside that stage; `stopped`: the stage after which
    --patience ended the run); extra: more tensors by name; rng: the generators' states
    (rng_state()) to keep instead of the present ones."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors |= {f"extra.{k}": v for k, v in (extra or {}).items()}
    opt = optimizer.state_dict()
    opt_info = {"param_groups": opt["param_groups"], "state": {}}
    for index, state in opt["state"].items():
        for name, value in state.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{name}"] = value
            else:
                opt_info["state"].setdefault(str(index), {})[name] = value
    rng_tensors, rng_info = rng or rng_state()
    tensors |= {f"rng.{k}": v for k, v in rng_tensors.items()}
    info = {"config": model.checkpoint_config(), "optimizer": opt_info, "rng": rng_info}
    info["scaler"] = scaler.state_dict() if scaler else None
    write_tensors(tensors, info | progress, path)


def load_state(model, optimizer, scaler, path: Path) -> tuple[dict, dict, tuple]:
    """Restore the model, optimizer and scaler that save_state wrote; returns (progress,
    extra tensors, random generator states for set_rng_state, to apply when it is time)."""
    tensors, info = read_tensors(path)
    missing = [k for k in ("optimizer", "rng") if k not in info]
    if missing:
        what = f"no {' or '.join(missing)}"
        raise CheckpointError(f"{path}: not a training state ({what}), a copy of {BEST}?")
    _load_weights(model, tensors, info, path)
    opt_state = {int(i): dict(v) for i, v in info["optimizer"]["state"].items()}
    for key, value in split(tensors, "optimizer.").items():
        index, name = key.split(".", 1)
        opt_state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict(
        {"state": opt_state, "param_groups": info["optimizer"]["param_groups"]}
    )
    if scaler and info.get("scaler"):
        scaler.load_state_dict(info["scaler"])
    keys = ("best", "rows", "next_stage", "within", "stopped")
    progress = {k: info[k] for k in keys if k in info}
    return progress, split(tensors, "extra."), (split(tensors, "rng."), info["rng"])


def rng_state() -> tuple[dict, dict]:
    """Every random generator's state: (tensors, JSON-able rest)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    tensors = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available():
        tensors |= {f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    info = {"numpy": [kind, pos, has_gauss, gauss], "python": random.getstate()}
    return tensors, info


def by_index(tensors: dict, prefix: str) -> list:
    """The tensors named prefix + 0, 1, 2, ... in the order of their numbers (sorted names
    would put 'cuda.10' before 'cuda.2')."""
    found = {int(k.removeprefix(prefix)): v for k, v in tensors.items() if k.startswith(prefix)}
    return [found[i] for i in sorted(found)]


def set_rng_state(tensors: dict, info: dict):
    torch.set_rng_state(tensors["torch"])
    kind, pos, has_gauss, gauss = info["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = info["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = by_index(tensors, "cuda.")
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------------------------
# The run folder's text files, and positions inside a stage


def write_rows(run_dir: Path, rows: list[dict]) -> None:
    atomic_write("".join(json.dumps(r) + "\n" for r in rows), run_dir / METRICS)


def read_rows(run_dir: Path) -> list[dict]:
    """The forgetting table of a run folder, a dict per stage (the start row first)."""
    path, rows = Path(run_dir) / METRICS, []
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text; expected JSON rows") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():  # a hand edit's blank line
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):  # written whole each time: a copy cut short?
            raise CheckpointError(f"{path}:{n}: not a JSON row of scores")
        rows.append(row)
    if not rows:
        raise CheckpointError(f"{path}: empty; expected the start row at least")
    return rows


def keep_logged_steps(path: Path, progress: dict) -> int:
    """The step log of what the checkpoint holds (a resumed run logs the rest again); returns
    its number of steps."""
    done = (progress["next_stage"], progress.get("within", {}).get("step", 0))
    kept = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a killed run may be cut short
            continue
        if (record["stage"], record["step"]) <= done:
            kept.append(line + "\n")
    atomic_write("".join(kept), path)
    return len(kept)


def save_position(model, optimizer, scaler, progress: dict, position: dict, path: Path):
    """A checkpoint inside stage progress['next_stage']: position holds the step, the
    running loss, the SMART teacher (or None), the best epoch (r, weights or None) and,
    at the stage's end, the generators as they were then ('rng')."""
    teacher, (r, state) = position.pop("teacher"), position.pop("best_epoch")
    rng = position.pop("rng", None)
    extra = {f"best_epoch.{k}": v for k, v in (state or {}).items()}
    if teacher:
        extra |= {f"teacher.{k}": v for k, v in teacher.params.items()}
        position["teacher_step"] = teacher.step
    within = position | {"best_epoch_r": r}
    save_state(model, optimizer, scaler, progress | {"within": within}, path, extra, rng)


def resume_position(within: dict, extra: dict, rng, device) -> dict:
    """A position saved by save_position, from a checkpoint's parts, as train_stage reads
    it: teacher (parameters, step) or None, best_epoch (r, weights or None), rng."""
    teacher = {k: v.to(device) for k, v in split(extra, "teacher.").items()}
    state = {k: v.to(device) for k, v in split(extra, "best_epoch.").items()}
    return within | {
        "teacher": (teacher, within["teacher_step"]) if teacher else None,
        "best_epoch": (within["best_epoch_r"], state or None),
        "rng": rng,
    }


# ---------------------------------------------------------------------------------------
# One process per run folder, and a clean stop


@contextlib.contextmanager
def sigterm_stops():
    """Within the block, SIGTERM (`kill`, a notebook's stop) ends the run the way Ctrl-C
    does: between two checkpoint writes, never in the middle of one."""
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)  # KeyboardInterrupt
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def refuse_held(run_dir: Path) -> None:
    """A new run stops at a folder that holds one (any sub-run's state)."""
    if any(Path(run_dir).rglob(STATE)):
        raise SystemExit(f"{run_dir} already holds a run: continue it with --resume {run_dir}")


@contextlib.contextmanager
def locked(run_dir: Path):
    """Hold run_dir/.lock while a run writes there; a second process is refused."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot make the run folder {run_dir}: {e.strerror}") from None
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; runs are not guarded there
        yield
        return
    try:
        lock = open(run_dir / ".lock", "a+")  # not "w": the holder's pid stays readable
    except OSError as e:
        raise CheckpointError(f"cannot write in the run folder {run_dir}: {e.strerror}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(
                f"{run_dir} is in use by another run; wait for it or choose another --run_dir"
            ) from None
        except OSError:  # a filesystem without locks (some network mounts): run unguarded
            yield
            return
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield
