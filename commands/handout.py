"""The CS224n handout's own command-line flags (`--use_gpu`, `--option pretrain`, ...),
rewritten into this project's before the parser reads them; on multitask_classifier.py
they pick the handout's run (the `handout` preset, with its defaults) unless --preset is
typed. The 2024 handout's `--fine-tune-mode last-linear-layer|full-model` is the 2023
handout's `--option pretrain|finetune` by another name."""

from pathlib import Path
from types import SimpleNamespace

from base_bert import load_config, resolve_model_dir
from commands.flags import refuse
from commands.outputs import prediction_path
from datasets import task_file
from evaluation import MULTITASK
from settings import ModelConfig

# The handouts' two options, each with its 2024 name: True where BERT is frozen.
MODES = {"pretrain": True, "last-linear-layer": True, "finetune": False, "full-model": False}
RENAMED = {"--fine-tune-mode": "--option"}  # the 2024 handout's flag -> the 2023 handout's


def model_config(model: ModelConfig, num_labels: int, frozen: bool) -> SimpleNamespace:
    """The config the handout's models take (BertSentimentClassifier, MultitaskBERT): its
    fields, both years' words for the option, hidden_size read from the checkpoint's
    config.json (where the handout writes bert-base's 768); and bert, the checkpoint, with
    its attention."""
    return SimpleNamespace(
        hidden_dropout_prob=model.dropout,
        num_labels=num_labels,
        hidden_size=load_config(resolve_model_dir(model.bert)).hidden_size,
        data_dir=".",
        option="pretrain" if frozen else "finetune",
        fine_tune_mode="last-linear-layer" if frozen else "full-model",
        bert=model.bert,
        attention=model.attention,
    )


def checked_mode(flag: str, mode: str) -> str:
    """`mode`, one of MODES; another is refused in one line naming the flag."""
    refuse(
        mode not in MODES,
        f"{flag} {mode}: last-linear-layer or pretrain (BERT frozen), full-model or finetune",
    )
    return mode


# The CS224n handout's own flags, as its commands take them: flag -> (how many values, the
# flags of this project it stands for, what --help says). Each command adds its own.
HANDOUT_FLAGS = {
    "--use_gpu": (0, lambda: ["--device", "cuda"], "--device cuda"),
    "--hidden_dropout_prob": (1, lambda p: ["--dropout", p], "--dropout"),
    "--fine-tune-mode": (
        1,
        lambda mode: ["--option", checked_mode("--fine-tune-mode", mode)],
        "--option (2024's name): last-linear-layer is pretrain, full-model is finetune",
    ),
}
FOLDERS = ("--data_dir", "--predictions_dir")  # one folder each, however many flags name it


def rewrite(argv: list[str], table: dict) -> tuple[list[str], list[str]]:
    """(argv with each of the handout's flags in `table` rewritten into this project's, one
    'flag value -> ours' note per rewritten flag)."""
    out, notes, i = [], [], 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        if flag not in table:
            out, i = [*out, argv[i]], i + 1
            continue
        arity, ours, _ = table[flag]
        values = [inline] if inline else argv[i + 1 : i + 1 + arity]
        if len(values) != arity or any(v.startswith("--") for v in values):
            raise SystemExit(f"{flag} (the handout's flag) takes {arity} value(s)")
        flags = ours(*values)
        notes.append(f"{' '.join([flag, *values])} -> {' '.join(flags) or 'nothing'}")
        out, i = [*out, *flags], i + 1 + (0 if inline else arity)
    return out, notes


def one_folder(out: list[str], notes: list[str]) -> None:
    """The handout's data (or output) flags name files in one folder: this project reads
    (writes) the handout's file names there."""
    for folder in FOLDERS:
        named = {out[i + 1] for i, a in enumerate(out[:-1]) if a == folder}
        refuse(
            len(named) > 1 and any(folder in n for n in notes),
            f"{', '.join(n for n in notes if folder in n)}: the handout's files are read and "
            f"written in one folder ({folder}); expected the same folder in each",
        )


FLOAT32 = "the handout trains in float32, this run in --precision: its device line says which"
# The presets the handout's flags run with its defaults, and the first line each prints.
HANDOUT_PRESETS = {
    "handout": "this project's completion of the handout's starter (--preset handout: SST, QQP, "
    "STS every epoch, the best overall kept; --preset handout-starter is the starter: SST alone; "
    f"{FLOAT32})",
    "handout-starter": f"the handout's starter run (--preset handout-starter: SST alone, the best "
    f"SST accuracy kept; {FLOAT32})",
}


def handout_argv(argv: list[str], table: dict, defaults: dict | None = None) -> list[str]:
    """argv with the handout's flags rewritten (`--use_gpu` becomes `--device cuda`). With
    `defaults` (multitask_classifier.py), a command line that uses one and types no
    --preset (nor --resume, --predict), or one that types --preset handout, is the
    handout's run: `defaults` go first, so the flags typed after them win. Prints one line
    saying which run it is."""
    typed = typed_flags(argv)
    out, notes = rewrite(argv, table)
    one_folder(out, notes)
    words = " ".join(argv).replace("=", " ").split()
    preset = words[words.index("--preset") + 1] if "--preset" in words[:-1] else None
    named = preset in HANDOUT_PRESETS  # one of the handout's presets, by its name
    other = {"--resume", "--predict", "-h", "--help"} | (set() if named else {"--preset"})
    if defaults is not None and (named or notes) and not typed & other:
        untyped = [[flag, value] for flag, value in defaults.items() if flag not in typed]
        extra, _ = rewrite(sum(untyped, []), table)
        print(f"{HANDOUT_PRESETS[preset or 'handout']}: {grouped(notes) or 'its defaults'}")
        return [*([] if named else ["--preset", "handout"]), *extra, *out]
    if notes:
        print(f"the handout's flags, as this project's: {grouped(notes)}")
    return out


def typed_flags(argv: list[str]) -> set[str]:
    """The flags typed, a 2024 name (--fine-tune-mode) counted as its 2023 one (--option);
    both names of one flag typed is refused in one line."""
    typed = {a.partition("=")[0] for a in argv}
    for new, old in RENAMED.items():
        refuse(
            {new, old} <= typed,
            f"{new} and {old}: one flag by its 2024 and 2023 names; give one of them",
        )
    return typed | {old for new, old in RENAMED.items() if new in typed}


def grouped(notes: list[str]) -> str:
    """The notes joined, those with the same result in one ('--sst_dev A, --sts_dev B ->
    --data_dir D'), the handout's nine data paths being one folder."""
    by_result = {}
    for note in notes:
        typed, _, ours = note.partition(" -> ")
        by_result.setdefault(ours, []).append(typed)
    return "; ".join(f"{', '.join(typed)} -> {ours}" for ours, typed in by_result.items())


def handout_help(table: dict, run: bool = False) -> str:
    """--help's lines on the handout's flags this command takes; run: they pick the handout
    preset (multitask_classifier.py)."""
    lines = [f"  {flag:22s} {help}" for flag, (_, _, help) in table.items()]
    head = "the CS224n handout's flags, taken as this project's"
    if run:
        head += " (with no --preset, any of them runs the handout's: --preset handout)"
    return head + ":\n" + "\n".join(lines)


def no_flags(_):
    return []


def in_folder(flag: str, name: str, ours: str):
    """A handout flag naming one of its files: that file's folder becomes `ours`
    (--data_dir, --predictions_dir); another file name is refused in one line."""

    def rewrite(path: str) -> list[str]:
        refuse(
            Path(path).name != name,
            f"{flag} {path}: the handout's file name is {name}; this project reads and writes "
            f"the handout's names in one folder ({ours})",
        )
        return [ours, str(Path(path).parent)]

    return 1, rewrite, f"{ours} (its folder; the file name must be {name})"


def multitask_option(option: str, flag: str = "--option") -> list[str]:
    """The handout's option as this project's flags: pretrain (last-linear-layer) freezes
    BERT, and with a project's preset gives SentenceBERT a head on [u, v] for STS (the
    handout's MultitaskBERT has its own heads); finetune (full-model) adds none."""
    frozen = MODES[checked_mode(flag, option)]
    return ["--freeze_encoder", "--pair_head", "concat"] if frozen else []


def epochs_flags(n: str) -> list[str]:
    return ["--loops", n, "--individual_epochs", n, "--multitask_epochs", n]


SPLITS = ("train", "dev", "test")
MULTITASK_HANDOUT = HANDOUT_FLAGS | {  # multitask_classifier.py's
    "--option": (
        1,
        multitask_option,
        "pretrain (the handout's default; or last-linear-layer): --freeze_encoder --pair_head "
        "concat, heads at --head_lr; finetune (or full-model): the whole model at --lr",
    ),
    "--fine-tune-mode": (
        1,
        lambda mode: multitask_option(mode, "--fine-tune-mode"),
        "--option (2024's name): last-linear-layer is pretrain, full-model is finetune",
    ),
    "--epochs": (1, epochs_flags, "--multitask_epochs (the handout preset), --loops, ..."),
    **{
        f"--{t}_{s}": in_folder(f"--{t}_{s}", task_file(".", t, s).name, "--data_dir")
        for t in MULTITASK
        for s in SPLITS
    },
    **{
        f"--{t}_{s}_out": in_folder(
            f"--{t}_{s}_out", prediction_path("", t, s).name, "--predictions_dir"
        )
        for t in MULTITASK
        for s in ("dev", "test")
    },
}
# The handout's argparse defaults that are its flags' (the rest are the handout preset's).
MULTITASK_DEFAULTS = {"--option": "pretrain", "--epochs": "10", "--predictions_dir": "predictions"}
