"""Presets (presets.py): what each resolves to, pinned by a golden file, and every
combination of flags they refuse."""

import re
import sys
from pathlib import Path

import pytest

import presets
from commands import checks, command, show
from helpers import run
from lab import reports
from settings import OptimConfig
from tokenizer import BertTokenizer

GOLDEN = Path(__file__).parent / "golden" / "presets.txt"


def resolved_presets() -> dict[str, str]:
    """What `--show` prints for every preset, and for a report's row at the scale
    `make reports` runs it at: the text the golden file pins, by preset."""
    out = {}
    for name, preset in presets.PRESETS.items():
        argv = ["--preset", name]
        if preset.report_scale not in (None, 1.0):
            argv += ["--scale", str(preset.report_scale)]
        cfg, _ = command.parse_args(argv)
        out[name] = f"$ python multitask_classifier.py {' '.join(argv)} --show\n"
        out[name] += show.show(cfg, presets.PRESETS[cfg.preset]) + "\n\n"
    return out


def test_every_pinned_preset_resolves_to_what_the_golden_file_says():
    """A change to what a preset trains shows up in the diff of tests/golden/presets.txt;
    rewrite it with `PYTHONPATH=. python tests/test_presets.py` and review that diff. A
    preset added since needs only to resolve; the rewrite pins it too."""
    blocks = re.split(r"(?m)^(?=\$ python)", GOLDEN.read_text())[1:]
    pinned = {re.match(r"\$ python \S+ --preset (\S+)", b)[1]: b for b in blocks}
    now = resolved_presets()
    assert set(pinned) <= set(now), "a pinned preset is gone"
    assert {name: now[name] for name in pinned} == pinned


def test_show_prints_the_plan_and_loads_nothing(monkeypatch, capsys):
    def no(*args, **kwargs):
        raise AssertionError("--show must not load a model or data")

    monkeypatch.setattr(BertTokenizer, "from_pretrained", no)
    monkeypatch.setattr(command.data, "load_task_data", no)
    monkeypatch.setattr(checks, "check_model", no)
    argv = ["--preset", "auslin-segments-gs-cls", "--scale", "0.25", "--bert", "no/such-model"]
    command.main([*argv, "--show"])
    out = capsys.readouterr().out
    assert "--pooling cls" in out and "--bert no/such-model" in out and "--scale 0.25" in out
    assert "--multitask_epochs 2" in out  # 6 epochs x 0.25, rounded
    stages = [line for line in out.splitlines() if "epoch" in line and "pcgrad" in line]
    assert len(stages) == 2 and all("para:sigmoid_margin sts:mse" in s for s in stages)


def test_show_counts_the_thesis_stages_and_marks_smart_and_distillation():
    cfg, _ = command.parse_args(["--preset", "thesis-smart", "--loops", "2"])
    lines = show.show(cfg, presets.PRESETS[cfg.preset]).splitlines()
    stage_lines = lines[lines.index("stages:") + 2 :]
    assert len(stage_lines) == 1 + 3 * 2  # one QQP epoch, then 2 x (STS, SST, 3% QQP)
    assert all("independent" in line for line in stage_lines)
    cfg, _ = command.parse_args(["--preset", "defended"])
    distilled = show.show(cfg, presets.PRESETS[cfg.preset]).splitlines()[-1]
    assert distilled.endswith(" 30") and "sts:cosine_sbert" not in distilled  # a QQP stage


def test_unknown_preset_lists_the_allowed_ones(tiny_env):
    with pytest.raises(SystemExit, match="unknown preset 'thesys'; choose from thesis, "):
        command.main(["--preset", "thesys"])


def test_thesis_smart_is_the_thesis_plan_with_smart_weights():
    cfg, _ = command.parse_args(["--preset", "thesis-smart"])
    plain, _ = command.parse_args(["--preset", "thesis"])
    smart_plan, thesis_plan = (
        presets.PRESETS["thesis-smart"].plans_of(cfg),
        presets.thesis_plan(plain),
    )
    assert [s.name for s in smart_plan[""]] == [s.name for s in thesis_plan]
    weights = {s.tasks[0]: (s.smart.lambda_s, s.smart.mu, s.batch_size) for s in smart_plan[""]}
    assert weights == {"sst": (10.0, 1.0, 8), "para": (5.0, 1.0, 8), "sts": (5.0, 1.0, 8)}
    assert all(not s.smart.active and s.batch_size == 32 for s in thesis_plan)


def test_loop_decay_lowers_each_loops_lr_linearly_and_none_keeps_the_thesis_lr():
    cfg, _ = command.parse_args(["--preset", "thesis", "--loops", "4", "--lr", "2e-5"])
    assert {s.lr for s in presets.thesis_plan(cfg)} == {2e-5}
    cfg, _ = command.parse_args(
        ["--preset", "thesis", "--loops", "4", "--lr", "2e-5", "--loop_decay", "linear"]
    )
    lrs = [s.lr for s in presets.thesis_plan(cfg)]
    assert lrs[0] == 2e-5  # the first QQP epoch
    expected = [2e-5 * (4 - i) / 4 for i in range(4) for _ in range(3)]  # STS, SST, QQP share
    assert lrs[1:] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(SystemExit):  # argparse names the choices
        command.parse_args(["--preset", "thesis", "--loop_decay", "cosine"])


def test_smart_with_an_embedding_loss_is_refused():
    with pytest.raises(SystemExit, match="--sts_loss cosine_mse works on sentence embeddings"):
        command.parse_args(["--preset", "thesis-smart", "--sts_loss", "cosine_mse"])


def test_pair_losses_need_siamese_pairs():
    with pytest.raises(SystemExit, match="--para_loss mnrl needs siamese"):
        command.parse_args(["--cross_encode", "para", "--para_loss", "mnrl"])


def test_help_lists_every_preset_with_one_line(capsys):
    with pytest.raises(SystemExit):
        command.parse_args(["--help"])
    out = capsys.readouterr().out
    for name, preset in presets.PRESETS.items():
        line = [name, *preset.help.split(), *f"[{preset.source}]".split()]
        assert any(x.split() == line for x in out.splitlines()), name


def test_weightings_that_a_round_robin_step_cannot_use_are_refused():
    for weighting in ("pcgrad", "random"):
        with pytest.raises(SystemExit, match=f"--weighting {weighting} combines the losses"):
            command.parse_args(["--mixing", "round_robin", "--weighting", weighting])


def test_smart_with_a_preset_it_does_not_change_is_refused():
    with pytest.raises(SystemExit, match="--smart changes no stage of --preset multitask"):
        command.main(["--preset", "multitask", "--smart", "--bert", "minilm"])


def test_tools_that_would_change_the_method_are_refused():
    simcse_stage = presets.simcse_stage(command.parse_args(["--preset", "simcse"])[0])
    with pytest.raises(SystemExit, match="--accumulate 2: stage 'SimCSE \\(sup\\)' compares"):
        checks.check_update([simcse_stage], OptimConfig(accumulate=2))
    mnrl = presets.Stage(("sts",), 1e-5, 8, losses={"sts": "mnrl"})
    with pytest.raises(SystemExit, match="micro-batches would change its loss"):
        checks.check_update([mnrl], OptimConfig(accumulate=2))
    pcgrad = presets.multitask_plan(
        command.parse_args(["--preset", "multitask", "--weighting", "pcgrad"])[0]
    )
    with pytest.raises(SystemExit, match="without --accumulate and --l2sp"):
        checks.check_update(pcgrad, OptimConfig(l2sp=0.1))
    checks.check_update(pcgrad, OptimConfig(max_grad_norm=1.0))  # clipping is fine
    sst = presets.Stage(("sst",), 1e-5, 8)
    with pytest.raises(SystemExit, match="stage 'SST' compares each example"):
        checks.check_update([sst], OptimConfig(accumulate=2, distill=1.0))


def test_distillation_without_a_stage_that_trains_the_encoder_is_refused(tiny_env, tmp_path):
    for preset in ("simcse", "unsup-simcse"):  # contrastive, then heads on a frozen encoder
        with pytest.raises(SystemExit, match=f"no stage of --preset {preset} has one"):
            run(tiny_env, tmp_path / preset, "--preset", preset, "--distill", "1")


def test_every_report_row_is_a_preset_listed_by_help(capsys):
    rows = [name for t in reports.TABLES.values() for name in t.rows]
    scaled = {name for name, p in presets.PRESETS.items() if p.report_scale}
    assert set(rows) == scaled and len(rows) == len(set(rows)) == 24
    with pytest.raises(SystemExit):
        command.parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in rows)


def test_scale_shrinks_a_reports_data_and_epochs_only():
    full, _ = command.parse_args(["--preset", "broadhurst-6"])
    assert (full.multitask.examples_per_task, full.multitask.multitask_epochs) == (50000, 10)
    assert full.data.train_share == 1 and full.optim.lr == 1e-5 and full.optim.batch_size == 8
    small, _ = command.parse_args(["--preset", "broadhurst-6", "--scale", "0.1"])
    assert (small.multitask.examples_per_task, small.multitask.multitask_epochs) == (5000, 1)
    assert small.data.train_share == 0.1 and small.model.dropout == full.model.dropout == 0.3
    typed, _ = command.parse_args(
        ["--preset", "broadhurst-6", "--scale", "0.1", "--train_share", "1"]
    )
    assert typed.data.train_share == 1  # a typed flag beats the scale
    with pytest.raises(
        SystemExit, match="^--scale shrinks the reports' presets; thesis is not one$"
    ):
        command.parse_args(["--preset", "thesis", "--scale", "0.5"])


def test_a_loss_is_refused_where_the_read_out_is_not_what_it_trains():
    with pytest.raises(SystemExit, match="--sts_loss cosine_mse trains a cosine"):
        command.parse_args(["--preset", "auslin-siamese", "--sts_loss", "cosine_mse"])
    with pytest.raises(SystemExit, match="only --siamese euclidean reads out"):
        command.parse_args(["--preset", "multitask", "--para_loss", "distance_margin"])


def test_a_simcse_term_no_stage_carries_and_one_cut_by_accumulation_are_refused(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="no stage of --preset simcse has one"):
        run(tiny_env, tmp_path / "a", "--preset", "simcse", "--simcse_weight", "1")
    with pytest.raises(SystemExit, match="--accumulate 2"):
        run(tiny_env, tmp_path / "b", "--preset", "sicurello-simcse", "--accumulate", "2")


def test_a_one_sentence_source_cannot_feed_a_triplet_objective(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="needs 3 sentences per example"):
        run(tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_data", "sst")


@pytest.mark.parametrize(
    "flags, heldout",
    [
        ("", 2_000),  # the demo's own
        ("--dev_size 32", 32),  # a small run is scored small
        ("--dev_size 5000", 2_000),  # never more than the preset's
        ("--dev_size 0", 2_000),  # 0: every dev example; the held-out pairs stay
        ("--dev_size 32 --heldout_size 100", 100),  # typed: as typed
        ("--dev_size 32 --heldout_size 0", 0),
    ],
)
def test_a_small_dev_sample_shrinks_the_held_out_pairs_with_it(flags, heldout):
    cfg, _ = command.parse_args(["--preset", "demo", *flags.split()])
    assert cfg.data.heldout_size == heldout
    cfg, _ = command.parse_args(["--preset", "thesis", *flags.split()])  # a preset with none
    assert cfg.data.heldout_size == (heldout if "--heldout_size" in flags else 0)


if __name__ == "__main__":  # rewrite the golden file after a deliberate change
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text("".join(resolved_presets().values()))
    sys.exit(f"wrote {GOLDEN}; review its diff")


@pytest.mark.parametrize(
    ("argv", "batch"),
    [
        (["--preset", "thesis-smart"], 8),  # the thesis's SMART batch
        (["--preset", "thesis-smart", "--batch_size", "16"], 16),  # typed: as typed
        (["--smart", "--batch_size", "16", "--smart_batch_size", "4"], 4),  # both typed
        (["--batch_size", "16"], 16),  # no SMART: the batch itself
    ],
)
def test_a_typed_batch_size_is_never_replaced_by_smarts(argv, batch):
    """--smart --batch_size 16 trains its SMART stages at 16, not at --smart_batch_size's
    default 8; a typed --smart_batch_size wins for them."""
    cfg, _ = command.parse_args(argv)
    stages = presets.PRESETS[cfg.preset].plans_of(cfg)[""]
    assert {s.batch_size for s in stages if s.kind == "task"} == {batch}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--para_loss", "contrastive"],
        ["--pair_head", "concat"],
        ["--cross_encode", "para"],
        ["--siamese", "euclidean", "--para_loss", "distance_margin"],
    ],
)
def test_the_head_show_names_is_the_head_the_model_builds(tiny_env, argv):
    """show.head_of (the head --show prints for each task) against the SentenceBERT the
    run builds: a Linear of the named width, a cross-encoder's, or no weights at all."""
    cfg, _ = command.parse_args(["--bert", str(tiny_env[0]), *argv])
    model, H = command.run_model(cfg)(), 32
    widths = {"the pooled sentence": H, "[u, v]": 2 * H, "[u, v, |u - v|]": 3 * H}
    for task in ("sst", "para", "sts"):
        head = show.head_of(cfg, task)
        if "one sequence" in head:
            assert model.heads[f"{task}_cross"].in_features == H
        elif "no weights" in head or head.startswith("d = "):
            assert task not in model.heads
        else:
            on = re.search(r" on (\[.*\]|the pooled sentence)", head)[1]
            assert model.heads[task].in_features == widths[on], (task, head)
    assert ("threshold" in show.head_of(cfg, "para")) == ("para" in model.cosine)


def test_a_typed_smart_dropout_the_reference_variant_would_replace_is_refused():
    """--smart_variant reference draws each pass's own masks: a typed --smart_dropout shared
    would be replaced without a word, so it stops in one line; untyped, or independent, runs."""
    with pytest.raises(SystemExit, match="--smart_dropout shared: --smart_variant reference"):
        command.parse_args(["--smart", "--smart_variant", "reference", "--smart_dropout", "shared"])
    for argv in ([], ["--smart_dropout", "independent"]):
        cfg, _ = command.parse_args(["--smart", "--smart_variant", "reference", *argv])
        stages = presets.PRESETS[cfg.preset].plans_of(cfg).stages()
        assert {s.smart.dropout for s in stages if s.smart.active} == {"independent"}


def test_the_handouts_starter_trains_sst_alone_and_keeps_the_best_sst_accuracy():
    """--preset handout-starter is the handout's train_multitask: SST alone, --epochs
    passes, the model of the best SST dev accuracy kept (the handout preset, this project's
    completion, keeps the best overall)."""
    cfg, _ = command.parse_args(["--preset", "handout-starter", "--epochs", "3"])
    (stages,) = presets.PRESETS["handout-starter"].plans_of(cfg).values()
    assert [s.tasks for s in stages] == [("sst",)] * 3
    rt = type("Rt", (), {"main": True})()
    row = {"sst": {"accuracy": 0.4}, "para": {"accuracy": 0.9}, "sts": {"pearson": 0.8}}
    row["overall"] = 0.7
    assert command.sub_run(cfg, Path("r"), "", rt).select(row) == 0.4
    thesis, _ = command.parse_args(["--preset", "thesis"])
    assert command.sub_run(thesis, Path("r"), "", rt).select(row) == 0.7


def test_show_lists_no_sentence_bert_head_for_the_handouts_frozen_option():
    """--option pretrain sets --pair_head concat for SentenceBERT; the handout's
    MultitaskBERT reads its own heads, so --show leaves it out there, and keeps it for a
    project's preset."""
    cfg, _ = command.parse_args(["--option", "pretrain"])
    settings = show.changed_settings(cfg)
    assert "--freeze_encoder" in settings and "--pair_head concat" not in settings
    cfg, _ = command.parse_args(["--preset", "thesis", "--option", "pretrain"])
    assert "--pair_head concat" in show.changed_settings(cfg)
