"""A command's way out: a mistake in the user's files or flags, an exercise still open, a
full disk or a GPU out of memory ends in one line saying what to do, not a traceback
(--debug shows it). Every command's `main` runs under `run_cli`."""

import errno
import os
import sys
import traceback

import torch

from base_bert import ModelError
from engine.checkpoint import CheckpointError
from engine.tsv import DataError

USER_ERRORS = (DataError, ModelError, CheckpointError, FileNotFoundError)


def run_cli(main, argv=None):
    """Run a command's main(argv): a mistake in the user's files or flags prints one line
    (what, where, what was expected) and exits 1; --debug shows the traceback instead."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return main(argv)
    except USER_ERRORS as e:
        if "--debug" in argv:
            raise
        raise SystemExit(f"error: {e}") from None
    except NotImplementedError as e:  # an exercise of a student's copy, still open
        if not str(e).startswith("exercise ") or "--debug" in argv:
            raise
        raise SystemExit(open_exercise(e)) from None
    except BrokenPipeError:  # the reader stopped early (| head): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except OSError as e:  # a full disk is the machine's state, not a bug: say what to do
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or "--debug" in argv:
            raise
        where = f" writing {e.filename}" if e.filename else ""
        raise SystemExit(
            f"error: the disk is full{where}; free space and run it again (a training run: "
            "--resume its folder, whose last checkpoint is intact)"
        ) from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None


# An open exercise a run can step around, and the flag that does (exercises.py names them).
AVOIDED_BY = {
    "attention": "--attention sdpa (torch's fused attention)",
    "adamw": "--foreach_adamw (the exercise adamw_foreach's loop-free AdamW)",
    "adamw_foreach": "no --foreach_adamw",
}


def open_exercise(e: NotImplementedError) -> str:
    """One line for a run that reached an exercise left open: which, where, how to go on."""
    name = str(e).removeprefix("exercise ").partition(":")[0]
    frame = traceback.extract_tb(e.__traceback__)[-1]
    where = f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    avoid = (
        f"; or run with {AVOIDED_BY[name]}, which does not call it" if name in AVOIDED_BY else ""
    )
    return (
        f"error: exercise {name} is still open ({where}): write it, then `python exercises.py "
        f"check {name}`{avoid}"
    )


def out_of_memory(e: torch.cuda.OutOfMemoryError, accumulate: int, run_dir) -> str:
    """One line for a GPU that ran out of memory in a run (`run_dir`, trained with
    --accumulate `accumulate`): what to lower, and how to go on."""
    _, found, rest = str(e).partition("Tried to allocate ")
    tried = found + " ".join(rest.split()[:2]).rstrip(".") if found else "no detail given"
    more = 2 * accumulate
    return (
        f"error: the GPU ran out of memory ({tried}); continue from the last checkpoint "
        f"with --resume {run_dir} --accumulate {more} (each batch in {more} pieces, the same "
        f"gradient), or start again with a smaller --batch_size, --max_length or "
        f"--eval_batch_size (scoring)"
    )
