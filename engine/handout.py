"""The CS224n handout's own command-line flags (`--use_gpu`, `--option pretrain`, ...),
rewritten into this project's before the parser reads them."""

from engine.flags import refuse

# The CS224n handout's own flags, as its commands take them: flag -> (how many values, the
# flags of this project it stands for, what --help says). Each command adds its own.
HANDOUT_FLAGS = {
    "--use_gpu": (0, lambda: ["--device", "cuda"], "--device cuda"),
    "--hidden_dropout_prob": (1, lambda p: ["--dropout", p], "--dropout"),
}


def handout_argv(argv: list[str], table: dict) -> list[str]:
    """argv with each of the handout's flags in `table` rewritten into this project's:
    `--use_gpu` becomes `--device cuda`."""
    out, i = [], 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        if flag not in table:
            out, i = [*out, argv[i]], i + 1
            continue
        arity, ours, _ = table[flag]
        values = [inline] if inline else argv[i + 1 : i + 1 + arity]
        if len(values) != arity or any(v.startswith("--") for v in values):
            raise SystemExit(f"{flag} (the handout's flag) takes {arity} value(s)")
        out, i = [*out, *ours(*values)], i + 1 + (0 if inline else arity)
    return out


def handout_help(table: dict) -> str:
    """--help's lines on the handout's flags this command takes."""
    lines = [f"  {flag:22s} {help}" for flag, (_, _, help) in table.items()]
    return "the CS224n handout's flags, taken as this project's:\n" + "\n".join(lines)


OUTPUTS = "accepted: the run writes the handout's files to RUN_DIR/predictions/; prepare_submit.py copies them to ./predictions/"


def no_flags(_):
    return []


def multitask_option(option: str) -> list[str]:
    refuse(option not in ("pretrain", "finetune"), f"--option {option}: pretrain or finetune")
    return ["--freeze_encoder", "--pair_head", "concat"] if option == "pretrain" else []


def epochs_flags(n: str) -> list[str]:
    return ["--loops", n, "--individual_epochs", n, "--multitask_epochs", n]


MULTITASK_HANDOUT = HANDOUT_FLAGS | {  # multitask_classifier.py's
    "--option": (
        1,
        multitask_option,
        "pretrain: --freeze_encoder --pair_head concat; finetune: the default",
    ),
    "--epochs": (1, epochs_flags, "--loops (thesis presets), --individual/multitask_epochs"),
    **{
        f"--{t}_{s}_out": (1, no_flags, OUTPUTS)
        for t in ("sst", "para", "sts")
        for s in ("dev", "test")
    },
}
