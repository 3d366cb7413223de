"""Multitask SBERT heads, the plan runner, resume and bad input, on a tiny random BERT."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import multitask_classifier as mt
from bert import BertModel


def tiny_model(tiny_config, dropout=0.0):
    torch.manual_seed(0)
    return mt.MultitaskBERT(BertModel(tiny_config), dropout=dropout).eval()


def sentence_batch(B=3, T=5, vocab=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def pair_batch(B=3, T=5, vocab=100, seed=0):
    a, b = sentence_batch(B, T, vocab, seed), sentence_batch(B, T, vocab, seed + 1)
    return {k: torch.stack([a[k], b[k]]) for k in a}  # (2, B, T)


def swapped(batch):
    return {k: v.flip(0) for k, v in batch.items()}


def test_head_shapes(tiny_config):
    model = tiny_model(tiny_config)
    assert model("sst", sentence_batch()).shape == (3, 5)
    assert model("para", pair_batch()).shape == (3,)
    score = model("sts", pair_batch())
    assert score.shape == (3,) and (score >= 0).all() and (score <= 5).all()


def test_pair_outputs_are_symmetric(tiny_config):
    model = tiny_model(tiny_config)
    with torch.no_grad():
        for task in ("para", "sts"):
            batch = pair_batch()
            assert torch.allclose(model(task, batch), model(task, swapped(batch)), atol=1e-6)


def test_similarity_of_a_sentence_with_itself_is_five(tiny_config):
    model = tiny_model(tiny_config)
    a = sentence_batch()
    batch = {k: torch.stack([v, v]) for k, v in a.items()}
    assert torch.allclose(model("sts", batch), torch.full((3,), 5.0), atol=1e-5)


def test_siamese_pair_equals_two_separate_forwards(tiny_config):
    model = tiny_model(tiny_config)
    batch = pair_batch()
    with torch.no_grad():
        u, v = (
            model.dropout(
                mt.mean_pool(
                    model.bert(batch["input_ids"][i], batch["attention_mask"][i])[
                        "last_hidden_state"
                    ],
                    batch["attention_mask"][i],
                )
            )
            for i in (0, 1)
        )
        ref = F.cosine_similarity(u, v, dim=-1) * 2.5 + 2.5
        assert torch.allclose(model("sts", batch), ref, atol=1e-6)
        w = model.heads["para"]
        d = (u - v).abs()
        logit = (w(torch.cat([u, v, d], -1)) + w(torch.cat([v, u, d], -1))).squeeze(-1) / 2
        assert torch.allclose(model("para", batch), logit, atol=1e-6)


def test_task_losses_on_hand_made_inputs():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2])
    p0 = math.exp(2) / (math.exp(2) + 1 + math.exp(-1))
    expected = (-math.log(p0) - math.log(1 / 3)) / 2
    assert mt.OUTPUT_LOSSES["ce"](logits, labels).item() == pytest.approx(expected, 1e-6)
    logit, y = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 0.0, 0.0])
    sig = [0.5, 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(1))]
    bce = -(math.log(sig[0]) + math.log(1 - sig[1]) + math.log(1 - sig[2])) / 3
    assert mt.OUTPUT_LOSSES["bce"](logit, y).item() == pytest.approx(bce, 1e-6)
    score, target = torch.tensor([1.0, 4.0, 2.5]), torch.tensor([0.0, 5.0, 2.5])
    assert mt.OUTPUT_LOSSES["mse"](score, target).item() == pytest.approx(2 / 3, 1e-6)


def run(tiny_env, run_dir, *extra):
    bert_dir, data_dir = tiny_env
    argv = [
        "--bert", str(bert_dir), "--data_dir", str(data_dir), "--run_dir", str(run_dir),
        "--batch_size", "8", "--lr", "1e-3", "--seed", "0", "--loops", "1", *extra,
    ]  # fmt: skip
    mt.main(argv)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["stage"] == "start (no training)"  # scored before any training
    return rows[1:]


def test_plan_runner_writes_table_checkpoint_and_predictions(tiny_env, tmp_path, capsys):
    rows = run(tiny_env, tmp_path / "run", "--loops", "2")
    names = [r["stage"] for r in rows]
    assert names == ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"] + [
        "loop 2: STS", "loop 2: SST", "loop 2: QQP 3%",
    ]  # fmt: skip
    for r in rows:
        overall = (r["sst"]["accuracy"] + r["para"]["accuracy"] + (r["sts"]["pearson"] + 1) / 2) / 3
        assert r["overall"] == pytest.approx(overall)
    out = capsys.readouterr().out
    assert "SST acc" in out and "best stage:" in out
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=False)
    assert best["row"]["overall"] == max(r["overall"] for r in rows)
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            assert (tmp_path / "run" / "predictions" / f"{task}-{split}-output.csv").is_file()


def test_fraction_stage_draws_a_fresh_subset_each_loop(tiny_env):
    data = mt.data.PairDataset(
        [mt.data.PairExample(str(i), "a", "b", 0.0) for i in range(200)], FakeTok(), 16
    )
    stage = mt.Stage("para", fraction=0.03, batch_size=4)

    def subset(seed):
        loader = mt.stage_loader(data, stage, torch.Generator().manual_seed(seed))
        return sorted(i for b in loader for i in b["ids"])

    assert len(subset(1)) == 6
    assert subset(1) == subset(1)
    assert subset(1) != subset(2)


class FakeTok:
    pad_token_id = 0

    def __call__(self, texts, text_pair=None, **kw):
        return {"input_ids": [[2, 7, 3] for _ in texts], "token_type_ids": [[0] * 3 for _ in texts]}


def test_resume_after_a_stage_equals_the_uninterrupted_run(tiny_env, tmp_path, monkeypatch):
    straight = run(tiny_env, tmp_path / "straight")
    calls = {"n": 0}
    real = mt.train_stage

    def crash_on_third_stage(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(mt, "train_stage", crash_on_third_stage)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_env, tmp_path / "resumed")
    monkeypatch.setattr(mt, "train_stage", real)
    mt.main(["--resume", str(tmp_path / "resumed")])
    resumed = [
        json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    ][1:]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight
    ]
    a = torch.load(tmp_path / "straight" / "state.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "resumed" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_short_training_lowers_every_task_loss(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    args = mt.parse_args(["--bert", str(bert_dir), "--data_dir", str(data_dir), "--lr", "1e-3"])
    task_data = mt.load_task_data(
        args, mt.BertTokenizer.from_pretrained(str(bert_dir)), mt.MULTITASK
    )
    torch.manual_seed(0)
    model = mt.model_factory(args, mt.MULTITASK)()
    optimizer = mt.new_optimizer(model, args)
    rt = mt.make_runtime("cpu", amp=False)

    def loss_of(task):
        model.eval()
        loader = mt.data.make_loader(task_data[task].train, 64, shuffle=False)
        with torch.no_grad():
            return sum(
                mt.OUTPUT_LOSSES[mt.DEFAULT_LOSS[mt.TASKS[task].kind]](
                    model(task, b), b["labels"]
                ).item()
                for b in loader
            )

    for task in mt.MULTITASK:
        before = loss_of(task)
        stage = mt.Stage(task, epochs=5, lr=1e-3, batch_size=8)
        steps = mt.stage_steps(task_data, stage, torch.Generator().manual_seed(0))
        mt.train_stage(model, optimizer, stage, steps, rt, task)
        assert loss_of(task) < 0.9 * before, task


def test_unknown_preset_lists_the_allowed_ones(tiny_env):
    with pytest.raises(SystemExit, match="unknown preset 'thesys'; choose from thesis, "):
        mt.main(["--preset", "thesys"])


def test_bad_flag_values_stop_with_the_allowed_values(capsys):
    with pytest.raises(SystemExit):
        mt.parse_args(["--pooling", "max"])
    err = capsys.readouterr().err
    assert "invalid choice: 'max'" in err and "mean" in err and "cls" in err
    with pytest.raises(SystemExit, match="--batch_size must be at least 1, got 0"):
        mt.parse_args(["--batch_size", "0"])
    with pytest.raises(ValueError, match=r"unknown task 'qqp'; expected one of \['cfimdb'"):
        mt.Stage("qqp")


def test_checkpoint_from_another_config_says_what_differs(tiny_config, tmp_path):
    model = tiny_model(tiny_config)
    mt.atomic_save({"model": model.state_dict(), "config": model.config()}, tmp_path / "m.pt")
    other = mt.MultitaskBERT(BertModel(tiny_config), pooling="cls")
    with pytest.raises(SystemExit, match="pooling: 'mean' vs 'cls'"):
        mt.load_model_checkpoint(other, tmp_path / "m.pt")


def test_nan_loss_stops_with_step_and_task_and_keeps_best(tiny_env, tmp_path, monkeypatch):
    real = mt.OUTPUT_LOSSES["ce"]
    monkeypatch.setitem(mt.OUTPUT_LOSSES, "ce", lambda out, y: real(out, y) * float("nan"))
    with pytest.raises(
        SystemExit, match=r"loss is nan at step 1 of stage 'loop 1: SST' \(task sst\).*best.pt"
    ):
        run(tiny_env, tmp_path / "run")
    assert (tmp_path / "run" / "best.pt").is_file()


@pytest.mark.parametrize("objective", ["sup", "triplet", "unsup", "mnrl", "align_uniform"])
def test_contrastive_objectives_train_the_encoder(tiny_env, tmp_path, objective):
    rows = run(
        tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_loss", objective,
        "--simcse_epochs", "2", "--simcse_batch_size", "8",
    )  # fmt: skip
    assert [r["stage"] for r in rows] == [f"SimCSE ({objective})"]
    assert math.isfinite(rows[0]["train_loss"]) and "sts" in rows[0]


def test_simcse_stage_keeps_the_epoch_with_the_best_sts(tiny_env, tmp_path, monkeypatch, capsys):
    scores = iter([0.5, 0.9, 0.1])  # epoch 2 is best: its weights must be the ones kept
    kept = {}
    real_after = mt.best_epoch_by_sts

    def scripted(model, task_data, rt, args):
        after, restore = real_after(model, task_data, rt, args)

        def fake_after(epoch):
            kept[epoch] = {k: v.clone() for k, v in model.state_dict().items()}
            real = mt.evaluate_split
            mt.evaluate_split = lambda *a, **k: {
                "sts": mt.evaluation.TaskResult({"pearson": next(scores)})
            }
            try:
                after(epoch)
            finally:
                mt.evaluate_split = real

        return fake_after, restore

    monkeypatch.setattr(mt, "best_epoch_by_sts", scripted)
    run(tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_batch_size", "8")
    final = torch.load(tmp_path / "run" / "best.pt", weights_only=False)["model"]
    assert all(torch.equal(final[k], kept[1][k]) for k in final)
    assert not all(torch.equal(final[k], kept[2][k]) for k in final)


def test_frozen_encoder_presets_train_only_the_heads(tiny_env, tmp_path, monkeypatch):
    snapshots = []
    real = mt.train_stage

    def snapshot_after(model, *a, **k):
        loss = real(model, *a, **k)
        snapshots.append({n: v.clone() for n, v in model.state_dict().items()})
        return loss

    monkeypatch.setattr(mt, "train_stage", snapshot_after)
    rows = run(
        tiny_env, tmp_path / "run", "--preset", "equibert", "--simcse_epochs", "1",
        "--individual_epochs", "1", "--simcse_batch_size", "8",
    )  # fmt: skip
    assert [r["stage"] for r in rows] == ["SimCSE (align_uniform)", "SST", "QQP"]
    after_simcse, after_sst, after_qqp = snapshots
    for name, value in after_simcse.items():
        if name.startswith("bert."):  # the encoder never moves after the contrastive stage
            assert torch.equal(value, after_qqp[name]), name
    assert not torch.equal(after_simcse["heads.sst.weight"], after_sst["heads.sst.weight"])
    assert not torch.equal(after_sst["heads.para.weight"], after_qqp["heads.para.weight"])


def test_thesis_smart_preset_runs_with_smart_on(tiny_env, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = mt.smart_term

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(mt, "smart_term", counting)
    rows = run(tiny_env, tmp_path / "run", "--preset", "thesis-smart", "--smart_batch_size", "8")
    assert len(rows) == 4 and calls["n"] > 0
    assert all(math.isfinite(r["overall"]) for r in rows)


def test_round_robin_visits_the_largest_set_once_and_cycles_the_others():
    big = mt.DataLoader(list(range(10)), batch_size=2)  # 5 batches
    small = mt.DataLoader(list(range(100, 104)), batch_size=2)  # 2 batches
    for order in ("fixed", "random"):
        batches = mt.data.MultiTaskBatches(
            {"a": big, "b": small}, "round_robin", order, torch.Generator().manual_seed(0)
        )
        steps = list(batches)
        assert len(steps) == len(batches) == 10 and all(len(s) == 1 for s in steps)
        seen = {t: [x for s in steps for tt, b in s if tt == t for x in b.tolist()] for t in "ab"}
        assert sorted(seen["a"]) == list(range(10))  # every example of the largest, once
        assert sorted(seen["b"]) == sorted(list(range(100, 104)) * 2 + [100, 101])  # cycled
    simultaneous = list(mt.data.MultiTaskBatches({"a": big, "b": small}, "simultaneous"))
    assert len(simultaneous) == 5 and all([t for t, _ in s] == ["a", "b"] for s in simultaneous)


def test_standardized_indices_sample_or_repeat():
    g = torch.Generator().manual_seed(0)
    down = mt.data.standardized_indices(10, 4, g)
    assert len(set(down)) == 4 and all(0 <= i < 10 for i in down)
    up = mt.data.standardized_indices(3, 8, g)
    assert len(up) == 8 and sorted(up[:6]) == [0, 0, 1, 1, 2, 2]  # whole passes first


def test_pcgrad_step_applies_the_surgery_to_the_shared_encoder(tiny_config):
    model = tiny_model(tiny_config).train()
    for m in model.modules():  # deterministic forwards so both computations see one graph
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    for layer in model.bert.encoder["layer"]:
        layer.attention["self"].dropout_p = 0.0
    rt = mt.make_runtime("cpu", amp=False)
    smart = mt.SmartConfig(lambda_s=0.0, mu=0.0)
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared = list(model.bert.parameters())

    def losses():
        return [mt.batch_loss(model, t, b, smart, None, rt) for t, b in batches.items()]

    grads = []  # the reference: each task's encoder gradient alone, then PCGrad by hand
    for loss in losses():
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads.append(mt.flatten_grads(shared))
    expected = mt.pcgrad(grads, torch.Generator().manual_seed(7))
    conflicts = sum(float(grads[i] @ grads[j]) < 0 for i in range(3) for j in range(i))
    assert conflicts > 0  # otherwise the surgery would be a plain sum

    class Capture:  # an optimizer whose step records the gradients it would apply
        param_groups = []

        def zero_grad(self, set_to_none=True):
            model.zero_grad(set_to_none=set_to_none)

        def step(self):
            self.flat = mt.flatten_grads(shared)
            self.head = model.heads["sst"].weight.grad.clone()

    opt = Capture()
    mt.pcgrad_step(model, opt, losses(), torch.Generator().manual_seed(7))
    assert torch.allclose(opt.flat, expected, atol=1e-6)
    model.zero_grad(set_to_none=True)
    losses()[0].backward()
    assert torch.allclose(opt.head, model.heads["sst"].weight.grad, atol=1e-7)  # own task only


def test_cross_encoded_pairs_carry_token_types_and_use_a_linear_head(tiny_config):
    tok = FakePairTok()
    examples = [mt.data.PairExample("1", "a", "b", 1.0)]
    batch = mt.data.PairDataset(examples, tok, 16, cross_encode=True).collate([0])
    assert batch["input_ids"].tolist() == [[2, 10, 3, 20, 21, 3]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 1]]
    torch.manual_seed(0)
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0, cross=("para", "sts")).eval()
    with torch.no_grad():
        pooled = mt.mean_pool(
            model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[
                "last_hidden_state"
            ],
            batch["attention_mask"],
        )
        for task in ("para", "sts"):
            ref = model.heads[f"{task}_cross"](pooled).squeeze(-1)  # the head adds no order effect
            assert torch.allclose(model(task, batch), ref, atol=1e-6)


class FakePairTok:
    pad_token_id = 0

    def __call__(self, texts, text_pair=None, **kw):
        ids = [[2, 10, 3, 20, 21, 3] for _ in texts]
        return {"input_ids": ids, "token_type_ids": [[0, 0, 0, 1, 1, 1] for _ in texts]}


@pytest.mark.parametrize(
    "flags",
    [
        ["--weighting", "equal"],
        ["--weighting", "random", "--examples_per_task", "20"],
        ["--weighting", "pcgrad"],
        ["--mixing", "round_robin", "--order", "random"],
        ["--mixing", "round_robin", "--cross_encode", "para", "sts", "--sts_loss", "l1"],
        ["--para_loss", "contrastive", "--sts_loss", "cosine_mse"],
        ["--para_loss", "mnrl", "--sts_loss", "mnrl"],
    ],
)
def test_multitask_preset_runs(tiny_env, tmp_path, flags):
    rows = run(
        tiny_env, tmp_path / "run", "--preset", "multitask", "--multitask_epochs", "1", *flags
    )
    assert len(rows) == 1 and math.isfinite(rows[0]["train_loss"])


def test_pair_losses_need_siamese_pairs():
    with pytest.raises(SystemExit, match="--para_loss mnrl needs siamese"):
        mt.parse_args(["--cross_encode", "para", "--para_loss", "mnrl"])


def test_individual_preset_trains_one_model_per_task(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    mt.main([
        "--bert", str(bert_dir), "--data_dir", str(data_dir), "--run_dir", str(tmp_path / "run"),
        "--preset", "individual", "--individual_epochs", "1", "--batch_size", "16",
    ])  # fmt: skip
    for task in mt.MULTITASK:  # a sub-run per task, scored on its own task only
        rows = (tmp_path / "run" / task / "metrics.jsonl").read_text().splitlines()
        last = json.loads(rows[-1])
        assert last["task"] == task and set(mt.MULTITASK) & set(last) == {task}
        assert (tmp_path / "run" / task / "predictions" / f"{task}-test-output.csv").is_file()


@pytest.mark.parametrize(
    ("preset", "names"),
    [
        ("sequential", ["QQP", "STS", "SST"]),
        (
            "thesis-smart-simcse",
            ["SimCSE (sup)", "QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"],
        ),
        ("unsup-simcse", ["SimCSE (unsup)", "SST", "QQP"]),
    ],
)
def test_presets_run_their_stages(tiny_env, tmp_path, preset, names):
    rows = run(
        tiny_env, tmp_path / "run", "--preset", preset, "--sequential_epochs", "1", "1", "1",
        "--simcse_epochs", "1", "--individual_epochs", "1", "--smart_batch_size", "16",
    )  # fmt: skip
    assert [r["stage"] for r in rows] == names


def test_an_existing_run_folder_is_not_overwritten(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    with pytest.raises(SystemExit, match="already holds a run: continue it with --resume"):
        run(tiny_env, tmp_path / "run", "--loops", "0")


def test_resume_uses_the_runs_own_flags(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    with pytest.raises(SystemExit, match="drop: --eval_batch_size"):
        mt.parse_args(["--resume", str(tmp_path / "run"), "--eval_batch_size", "4"])
    args = mt.parse_args(["--resume", str(tmp_path / "run")])
    assert args.lr == 1e-3 and args.batch_size == 8  # from the run's args.json


def test_smart_with_an_embedding_loss_is_refused():
    with pytest.raises(SystemExit, match="--sts_loss cosine_mse works on sentence embeddings"):
        mt.parse_args(["--preset", "thesis-smart", "--sts_loss", "cosine_mse"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_says_so():
    with pytest.raises(SystemExit, match="no CUDA device is available"):
        mt.make_runtime("cuda", amp=True)


def test_classifier_frozen_option_trains_only_the_head(tiny_env, tmp_path):
    import classifier

    bert_dir, data_dir = tiny_env
    rows, best = classifier.main([
        "--task", "cfimdb", "--option", "last-linear-layer", "--bert", str(bert_dir),
        "--data_dir", str(data_dir), "--run_dir", str(tmp_path / "run"), "--epochs", "2",
        "--batch_size", "8",
    ])  # fmt: skip
    assert [r["stage"] for r in rows] == ["start (no training)", "epoch 1", "epoch 2"]
    assert "train" in rows[1] and "accuracy" in rows[1]["cfimdb"]
    trained = torch.load(tmp_path / "run" / "state.pt", weights_only=False)["model"]
    start = mt.model_factory(mt.parse_args(["--bert", str(bert_dir)]), ("cfimdb",))().state_dict()
    for name, value in start.items():
        if name.startswith("bert."):
            assert torch.equal(value, trained[name]), name
    assert not torch.equal(start["heads.cfimdb.weight"], trained["heads.cfimdb.weight"])


def test_only_trained_tasks_read_their_training_sets(tiny_env):
    bert_dir, data_dir = tiny_env
    args = mt.parse_args(["--bert", str(bert_dir), "--data_dir", str(data_dir)])
    tok = mt.BertTokenizer.from_pretrained(str(bert_dir))
    loaded = mt.load_task_data(args, tok, mt.MULTITASK, train_tasks={"sst"})
    assert len(loaded["sst"].train) == 48
    assert loaded["para"].train is None and loaded["sts"].train is None
    assert len(loaded["para"].dev) == 16  # every task is still scored
