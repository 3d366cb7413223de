"""The CS224n reports' mechanisms against naive references, their presets, and reports.py."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import datasets as data
import evaluation
import multitask_classifier as mt
import reports
import simcse
import trainer
from base_bert import BertConfig
from bert import BertModel
from config import SimCSEConfig
from helpers import pair_batch, run, sentence_batch


def two_sets(seed=0, B=5, H=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)


# ---------------------------------------------------------------------------------------
# Losses, each against a loop over the batch


def test_auslins_distance_margin_matches_a_loop():
    u, v = two_sets()
    labels = torch.tensor([1, 0, 1, 0, 0])
    d = simcse.euclidean_distance(u, v)
    expected = [math.dist(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)]
    assert d.tolist() == pytest.approx(expected, rel=1e-5)
    report = 0.0  # Auslin et al.'s formula as printed, on d: y = 1 pays the margin term
    for dist, y in zip(expected, labels.tolist(), strict=True):
        report += 0.5 * (max(0.0, 0.5 - dist) ** 2 if y == 1 else dist * dist)
    got = simcse.PAIR_LOSSES["distance_margin"](u, v, labels, "binary")
    assert got.item() == pytest.approx(report / 5, rel=1e-5)
    near = simcse.PAIR_LOSSES["distance_margin"](u, u + 0.01, torch.ones(5), "binary")
    assert near.item() > 0  # close paraphrases are pushed past the margin
    same = u.clone().requires_grad_()
    simcse.PAIR_LOSSES["distance_margin"](same, u, torch.ones(5), "binary").backward()
    assert torch.isfinite(same.grad).all()  # d = 0 has a finite gradient


def test_sigmoid_losses_match_loops():
    out = torch.tensor([-2.0, -0.1, 0.3, 3.0])
    y = torch.tensor([0, 1, 1, 0])
    p = [1 / (1 + math.exp(-x)) for x in out.tolist()]
    mse = sum((a - b) ** 2 for a, b in zip(p, y.tolist(), strict=True)) / 4
    l1 = sum(abs(a - b) for a, b in zip(p, y.tolist(), strict=True)) / 4
    margin = sum(
        0.5 * (a * a if b == 0 else max(0.0, 0.5 - a) ** 2)
        for a, b in zip(p, y.tolist(), strict=True)
    ) / 4  # fmt: skip
    losses = simcse.OUTPUT_LOSSES
    assert losses["sigmoid_mse"](out, y).item() == pytest.approx(mse, rel=1e-6)
    assert losses["sigmoid_l1"](out, y).item() == pytest.approx(l1, rel=1e-6)
    assert losses["sigmoid_margin"](out, y).item() == pytest.approx(margin, rel=1e-6)
    # a paraphrase past the margin and a non-paraphrase far below pay (almost) nothing
    assert losses["sigmoid_margin"](torch.tensor([4.0, -9.0]), torch.tensor([1, 0])) < 1e-4


def test_cosine_mse_targets_follow_the_task():
    u, v = two_sets(1)
    cos = F.cosine_similarity(u, v, dim=-1).tolist()
    y = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    loss = simcse.PAIR_LOSSES["cosine_mse"]
    binary = sum((c - t) ** 2 for c, t in zip(cos, y.tolist(), strict=True)) / 5
    assert loss(u, v, y, "binary").item() == pytest.approx(binary, rel=1e-5)
    scores = torch.tensor([0.0, 2.5, 5.0, 1.0, 4.0])
    target = [s / 2.5 - 1 for s in scores.tolist()]  # 0-5 to [-1, 1]
    regression = sum((c - t) ** 2 for c, t in zip(cos, target, strict=True)) / 5
    assert loss(u, v, scores, "regression").item() == pytest.approx(regression, rel=1e-5)


def test_dropout_views_objectives_are_alignment_plus_uniformity():
    z1, z2 = two_sets(2, B=6)
    n1, n2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
    align = sum(((a - b) ** 2).sum().item() for a, b in zip(n1, n2, strict=True)) / 6

    def unif(n):
        terms = [
            math.exp(-2 * ((n[i] - n[j]) ** 2).sum().item())
            for i in range(6) for j in range(i + 1, 6)
        ]  # fmt: skip
        return math.log(sum(terms) / len(terms))

    expected = align + (unif(n1) + unif(n2)) / 2
    k, objective = simcse.OBJECTIVES["dropout_align_uniform"]
    assert k == 1  # one sentence per example: two dropout views
    assert objective(torch.stack([z1, z2]), 0.05).item() == pytest.approx(expected, rel=1e-5)
    k, canon = simcse.OBJECTIVES["dropout_align_uniform_simcse"]
    term = simcse.unsup_simcse_loss(z1, z2, 0.05).item()
    assert canon(torch.stack([z1, z2]), 0.05).item() == pytest.approx(expected + term, rel=1e-5)


# ---------------------------------------------------------------------------------------
# The model's new heads and read-outs, against hand-computed embeddings


def embeddings(model, batch):
    z = model.sentences(batch)  # (2B, H); dropout is 0
    return z.view(2, -1, z.size(-1)).unbind(0)


def test_concatenation_heads_are_a_linear_on_u_and_v(tiny_config):
    torch.manual_seed(0)
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0, concat=("para", "sts")).eval()
    H = tiny_config.hidden_size
    assert model.heads["para"].in_features == model.heads["sts"].in_features == 2 * H
    batch = pair_batch()
    with torch.no_grad():
        u, v = embeddings(model, batch)
        for task in ("para", "sts"):
            head = model.heads[task]
            expected = torch.cat([u, v], -1) @ head.weight.T + head.bias  # (B, 1)
            assert torch.allclose(model(task, batch), expected.squeeze(-1), atol=1e-6)


def test_euclidean_siamese_outputs_the_distance_and_cuts_on_it(tiny_config):
    torch.manual_seed(0)
    bert = BertModel(tiny_config)
    model = mt.MultitaskBERT(bert, dropout=0.0, cosine=("para",), siamese="euclidean").eval()
    model.para_threshold.fill_(0.7)
    batch = pair_batch()
    with torch.no_grad():
        u, v = embeddings(model, batch)
        d = torch.tensor([math.dist(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)])
        assert torch.allclose(model("sts", batch), d, atol=1e-5)
        assert torch.allclose(model("para", batch), d - 0.7, atol=1e-5)  # d > 0.7: paraphrase
    assert model.config()["siamese"] == "euclidean"


def test_the_euclidean_output_is_the_distance_of_the_embeddings_not_of_dropped_ones(
    tiny_config,
):
    torch.manual_seed(0)
    quiet = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    bert = BertModel(BertConfig(**tiny_config.to_dict() | quiet))
    model = mt.MultitaskBERT(bert, dropout=0.5, siamese="euclidean").train()  # head dropout on
    batch = pair_batch()
    u, v = embeddings(model, batch)
    assert torch.allclose(model("sts", batch), (u - v).norm(dim=-1), atol=1e-5)


def test_a_euclidean_threshold_is_fit_on_distances(tiny_env, tiny_config):
    bert_dir, data_dir = tiny_env
    from config import DataConfig
    from tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(bert_dir))
    task_data = data.load_task_data(DataConfig(data_dir=str(data_dir)), tokenizer, ("para",), 0)
    bert = BertModel.from_pretrained(str(bert_dir))
    model = mt.MultitaskBERT(bert, ("para",), dropout=0.0, cosine=("para",), siamese="euclidean")
    rt = trainer.make_runtime("cpu", amp=False)
    trainer.fit_thresholds(model, task_data, rt, 16)
    pairs = task_data["para"].train
    with torch.no_grad():
        batch = pairs.collate(list(range(len(pairs))))
        u, v = embeddings(model.eval(), batch)
    d = (u - v).norm(dim=-1).numpy()
    best = evaluation.best_threshold(d, batch["labels"].numpy())
    assert model.para_threshold.item() == pytest.approx(best, abs=1e-5)


def test_a_simcse_term_adds_the_weighted_loss_of_two_dropout_views(tiny_config):
    torch.manual_seed(0)
    quiet = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    bert = BertModel(BertConfig(**tiny_config.to_dict() | quiet))  # two equal views
    model = mt.MultitaskBERT(bert, dropout=0.0).train()
    rt = trainer.make_runtime("cpu", amp=False)
    term = SimCSEConfig(simcse_weight=0.3)
    plain = trainer.Stage(("sst",), 1e-3, 3)
    with_term = trainer.Stage(("sst",), 1e-3, 3, contrastive=term)
    batch = sentence_batch() | {"labels": torch.tensor([0, 3, 4])}
    base = trainer.task_loss(model, plain, "sst", batch, rt, None)
    z = model.sentences(batch)
    expected = base + 0.3 * simcse.unsup_simcse_loss(z, z, term.temperature)
    got = trainer.task_loss(model, with_term, "sst", batch, rt, None)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert got.item() > base.item()


def test_a_random_order_shuffles_the_batches_of_a_simultaneous_step():
    loaders = {t: [f"{t}{i}" for i in range(4)] for t in ("sst", "para", "sts")}
    g = torch.Generator().manual_seed(0)
    fixed = list(data.MultiTaskBatches(loaders, "simultaneous", "fixed", g))
    assert all([t for t, _ in step] == ["sst", "para", "sts"] for step in fixed)
    shuffled = list(data.MultiTaskBatches(loaders, "simultaneous", "random", g))
    orders = {tuple(t for t, _ in step) for step in shuffled}
    assert all(sorted(o) == ["para", "sst", "sts"] for o in orders) and len(orders) > 1
    for i, step in enumerate(shuffled):  # each task's batches still come in their order
        assert sorted(b for _, b in step) == sorted(f"{t}{i}" for t in loaders)


def test_a_training_share_is_a_fixed_random_subset():
    examples = list(range(100))
    kept = data.subset(examples, 0, 0.25, seed=3)
    assert len(kept) == 25 and set(kept) <= set(examples)
    assert kept == data.subset(examples, 0, 0.25, seed=3) != data.subset(examples, 0, 0.25, 4)
    assert len(data.subset(examples, 0, 0.001, seed=3)) == 1  # at least one
    first = data.random_subset(examples, 40, seed=3)  # --train_size 40, then the share
    halved = data.subset(examples, 40, 0.5, seed=3)
    assert len(halved) == 20 and set(halved) <= set(first)


# ---------------------------------------------------------------------------------------
# Presets


def test_every_report_row_is_a_preset_listed_by_help(capsys):
    rows = [r.preset for t in reports.TABLES.values() for r in t.rows]
    assert set(rows) == set(mt.REPORT_PRESETS) and len(rows) == len(set(rows)) == 24
    with pytest.raises(SystemExit):
        mt.parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in rows)


def test_scale_shrinks_a_reports_data_and_epochs_only():
    full, _ = mt.parse_args(["--preset", "broadhurst-6"])
    assert (full.multitask.examples_per_task, full.multitask.multitask_epochs) == (50000, 10)
    assert full.data.train_share == 1 and full.optim.lr == 1e-5 and full.optim.batch_size == 8
    small, _ = mt.parse_args(["--preset", "broadhurst-6", "--scale", "0.1"])
    assert (small.multitask.examples_per_task, small.multitask.multitask_epochs) == (5000, 1)
    assert small.data.train_share == 0.1 and small.model.dropout == full.model.dropout == 0.3
    typed, _ = mt.parse_args(["--preset", "broadhurst-6", "--scale", "0.1", "--train_share", "1"])
    assert typed.data.train_share == 1  # a typed flag beats the scale
    with pytest.raises(SystemExit, match="--scale shrinks the reports' presets"):
        mt.parse_args(["--preset", "thesis", "--scale", "0.5"])


@pytest.mark.parametrize(
    ("preset", "cosine", "concat", "cross"),
    [
        ("broadhurst-2", (), ("para", "sts"), ()),
        ("broadhurst-3", ("para",), (), ()),
        ("broadhurst-5", (), ("para",), ()),
        ("auslin-siamese", ("para",), (), ()),
        ("auslin-segments-gs-l1", (), (), ("para", "sts")),
        ("auslin-siamese-cosine-mse", ("para",), (), ()),
    ],
)
def test_each_task_is_read_out_by_what_its_loss_trains(preset, cosine, concat, cross):
    cfg, _ = mt.parse_args(["--preset", preset])
    assert mt.cosine_tasks(cfg) == cosine and mt.concat_tasks(cfg) == concat
    assert tuple(cfg.multitask.cross_encode) == cross


def test_the_sentence_bert_sts_target_keeps_the_cosine_under_concat_heads():
    cfg, _ = mt.parse_args(["--preset", "broadhurst-2", "--sts_loss", "cosine_sbert"])
    assert mt.concat_tasks(cfg) == ("para",)


def test_a_loss_is_refused_where_the_read_out_is_not_what_it_trains():
    with pytest.raises(SystemExit, match="--sts_loss cosine_mse trains a cosine"):
        mt.parse_args(["--preset", "auslin-siamese", "--sts_loss", "cosine_mse"])
    with pytest.raises(SystemExit, match="only --siamese euclidean reads out"):
        mt.parse_args(["--preset", "multitask", "--para_loss", "distance_margin"])


def test_a_simcse_term_no_stage_carries_and_one_cut_by_accumulation_are_refused(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="no stage of --preset simcse has one"):
        run(tiny_env, tmp_path / "a", "--preset", "simcse", "--simcse_weight", "1")
    with pytest.raises(SystemExit, match="--accumulate 2"):
        run(tiny_env, tmp_path / "b", "--preset", "sicurello-simcse", "--accumulate", "2")


def test_a_batch_of_one_has_alignment_only():
    z1, z2 = two_sets(4, B=1)
    _, objective = simcse.OBJECTIVES["dropout_align_uniform"]
    loss = objective(torch.stack([z1, z2]), 0.05)
    assert loss.item() == pytest.approx(simcse.alignment(z1, z2).item())


def test_a_one_sentence_source_cannot_feed_a_triplet_objective(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="needs 3 sentences per example"):
        run(tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_data", "sst")


@pytest.mark.parametrize(
    "preset",
    ["broadhurst-1", "broadhurst-2", "auslin-siamese-gs", "auslin-segments-gs-rand",
     "sicurello-simcse", "sicurello-simcsecanon", "sicurello-unif-sst"],
)  # fmt: skip
def test_report_presets_train_and_score(tiny_env, tmp_path, preset):
    # a quarter of the tiny data and of the epochs; Broadhurst's 12,080 examples become 16
    rows = run(tiny_env, tmp_path / "run", "--preset", preset, "--scale", "0.25",
               "--examples_per_task", "16")  # fmt: skip
    assert rows and all(math.isfinite(r["overall"]) for r in rows)
    assert all(math.isfinite(r["train_loss"]) for r in rows)


# ---------------------------------------------------------------------------------------
# reports.py


def fake_rows(sst, para, sts):
    start = {"stage": "start (no training)", "index": -1}
    scored = {"sst": {"accuracy": sst}, "para": {"accuracy": para}, "sts": {"pearson": sts}}
    best = {"stage": "epoch 1", "index": 0, **scored}
    best["overall"] = evaluation.overall_score(sst, para, sts)
    worse = {**best, "stage": "epoch 2", "index": 1, "overall": best["overall"] - 0.1}
    return [start | {k: best[k] for k in ("sst", "para", "sts", "overall")}, best, worse]


def test_a_table_sets_their_scores_beside_the_kept_models():
    table = reports.TABLES["auslin-siamese"]
    done = {"seconds": 90.0, "rows": fake_rows(0.5, 0.75, 0.8)}
    text = reports.format_table(table, {"auslin-siamese-cosine-mse": done})
    mse, contrastive = text.strip().splitlines()[-2:]
    overall = (0.470 + 0.471 + (0.042 + 1) / 2) / 3  # theirs, computed from their three
    assert f"| {overall:.3f} | 0.500 | 0.750 | 0.800 | {(0.5 + 0.75 + 0.9) / 3:.3f} | 1.5 |" in mse
    assert "| not run |" in contrastive and "0.375" in contrastive


def test_a_table_runs_each_row_once_and_resumes(tiny_env, tmp_path, monkeypatch):
    bert_dir, data_dir = tiny_env
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))
    row = reports.Row("sicurello-vanilla-sst", "SST only", None)
    monkeypatch.setitem(reports.TABLES, "tiny", reports.Table("tiny", "none", 0.5, (row,)))
    argv = ["tiny", "--out", str(tmp_path), "--bert", str(bert_dir), "--max_length", "32"]
    text = reports.make_table("tiny", reports.parse_args(argv))
    record = json.loads((tmp_path / "tiny" / row.preset / reports.DONE).read_text())
    assert record["scale"] == 0.5 and len(record["rows"]) == 1 + 2  # start + 2 epochs of 3 x 0.5
    assert (tmp_path / "tiny" / "tiny.md").read_text() == text and "| SST only |" in text
    calls = []
    monkeypatch.setattr(reports, "run_row", lambda *a: calls.append(a))
    assert reports.make_table("tiny", reports.parse_args(argv)) == text and not calls
    with pytest.raises(SystemExit, match="was run at --scale 0.5, not 0.25"):
        reports.make_table("tiny", reports.parse_args([*argv, "--scale", "0.25"]))
