"""The command line: a config's fields as flags, and a command's way out.

`build_parser` turns a config (settings.py) into argparse flags named after its fields
(`--lr`, `--lambda_sst`, ...), one group per dataclass; `parse` applies a preset's
overrides ("group.field" -> value) under the flags the user typed; `changed_flags` names
what a resumed run was asked to change.

    cfg, typed, _ = parse(RunConfig(), ["--lambda_sst", "5", "--lr", "5e-5"])
    cfg.optim.lr, cfg.smart.lambda_sst        # 5e-05 5.0
    typed                                     # {'smart.lambda_sst': 5.0, 'optim.lr': 5e-05}

A mistake in the user's files or flags, an exercise still open, a full disk or a GPU out
of memory ends in one line saying what to do, not a traceback (--debug shows it). Every
command's `main` runs under `run_cli`."""

import argparse
import dataclasses
import errno
import os
import sys
import traceback

import torch

from base_bert import ModelError
from commands.flags import check, flag_of, leaves, replace_paths
from engine.checkpoint import CheckpointError
from engine.runtime import eager_optimizers
from engine.tsv import DataError

USER_ERRORS = (DataError, ModelError, CheckpointError, FileNotFoundError)


def run_cli(main, argv=None):
    """Run a command's main(argv), its optimizers eager (runtime.eager_optimizers): a
    mistake in the user's files or flags prints one line (what, where, what was expected)
    and exits 1; --debug shows the traceback instead."""
    argv = sys.argv[1:] if argv is None else argv
    eager_optimizers()
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


def _add_flag(group, f: dataclasses.Field, default, suppress: bool):
    meta = f.metadata
    kw = {"dest": f.name, "help": meta["help"]}
    kw["default"] = argparse.SUPPRESS if suppress else default
    if isinstance(default, bool):
        kw["action"] = "store_false" if default else "store_true"
    else:
        if isinstance(default, tuple):
            kw["nargs"], kw["type"] = len(default), type(default[0])
        elif isinstance(default, list):
            kw["nargs"], kw["type"] = "*", meta.get("type", str)
        else:
            kw["type"] = meta.get("type", str if default is None else type(default))
        for key in ("choices", "metavar"):
            if key in meta:
                kw[key] = meta[key]
    group.add_argument(flag_of(f), **kw)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The default after each flag's help (none for switches and unset values); the
    description and epilog printed as written."""

    def _get_help_string(self, action):
        if action.default in (None, argparse.SUPPRESS) or isinstance(action.default, bool):
            return action.help
        return f"{action.help} (default: %(default)s)"


def prog() -> str | None:
    """--help's name for a lab tool run as `python -m lab.NAME` (argparse would say NAME.py,
    which does not run on its own); None: argparse's own."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return f"python -m {spec.name}" if spec and spec.name.startswith("lab.") else None


def build_parser(cfg, description: str, epilog: str = "", suppress=False, extra=()):
    """argparse flags for every field of `cfg` (an instance: its values are the defaults),
    one group per dataclass. suppress: flags the user did not type are left out (to tell
    them apart from defaults). extra: options that are not config fields, with the first
    group: (flag, help) takes a run folder, (flag, help, "switch") takes nothing,
    (flag, help, METAVAR) takes some other value (e.g. "REPO")."""
    parser = argparse.ArgumentParser(
        prog=prog(),
        description=description,
        epilog=epilog,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    groups = {}
    for path, f, value in leaves(cfg):
        owner = path.rpartition(".")[0]
        if owner not in groups:
            doc = type(getattr(cfg, owner) if owner else cfg).__doc__
            groups[owner] = parser.add_argument_group(doc.strip().splitlines()[0])
        _add_flag(groups[owner], f, value, suppress)
    groups[""].add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show the Python traceback of an error instead of one line",
    )
    for flag, help, *how in extra:  # with the first group, what to run
        kind = (
            {"action": "store_true"} if how == ["switch"] else {"metavar": (how or ["RUN_DIR"])[0]}
        )
        default = argparse.SUPPRESS if suppress else None
        groups[""].add_argument(flag, default=default, help=help, **kind)
    return parser


def parse(cfg, argv, description="", epilog="", overrides=None, extra=()):
    """(config, {path: value} of the flags the user typed, {extra option: value}): cfg's
    defaults, then what `overrides(typed)` returns (a preset's), then the typed flags."""
    build_parser(cfg, description, epilog, extra=extra).parse_args(argv)  # --help, bad values
    typed = vars(
        build_parser(cfg, description, epilog, suppress=True, extra=extra).parse_args(argv)
    )
    extras = {flag.lstrip("-"): typed.pop(flag.lstrip("-"), None) for flag, *_ in extra}
    typed.pop("debug", None)  # run_cli's
    where = {f.name: (path, default) for path, f, default in leaves(cfg)}
    typed = {
        where[name][0]: tuple(value) if isinstance(where[name][1], tuple) else value
        for name, value in typed.items()
    }
    cfg = replace_paths(cfg, (overrides(typed) if overrides else {}) | typed)
    check(cfg)
    return cfg, typed, extras


def changed_flags(saved, typed: dict, keep=()) -> str:
    """The typed flags (path -> value) outside `keep` whose value differs from the saved
    config's, each with the saved one: "--lr 1e-05 (the run's: 2e-05)"; "" when none."""
    values = {path: (f, value) for path, f, value in leaves(saved)}
    return ", ".join(
        f"{flag_of(values[path][0])} {value} (the run's: {values[path][1]})"
        for path, value in typed.items()
        if path not in keep and values[path][1] != value
    )
