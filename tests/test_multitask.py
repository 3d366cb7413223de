"""SentenceBERT's heads on a tiny random BERT: shapes, symmetric and siamese pairs,
cross-encoding, concatenation and Euclidean heads, each task's read-out, compiled layers."""

import math

import pytest
import torch
import torch.nn.functional as F

import datasets as data
import sbert
from base_bert import BertConfig
from bert import BertModel, mean_pool
from commands import command
from engine import runtime
from evaluation import MULTITASK
from helpers import (
    batch_loss,
    embeddings,
    pair_batch,
    sentence_batch,
)
from presets import Stage
from sbert import concat_tasks, cosine_tasks
from settings import ModelConfig
from smart import SmartConfig
from trainer import StepContext

CROSS, CONCAT = ({"para": how, "sts": how} for how in ("cross", "concat"))  # both pairs


def tiny_model(tiny_config, dropout=0.0):
    torch.manual_seed(0)
    return sbert.SentenceBERT(BertModel(tiny_config), dropout=dropout).eval()


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
                mean_pool(
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


def test_cross_encoded_pairs_carry_token_types_and_use_a_linear_head(tiny_config):
    tok = FakePairTok()
    examples = [data.PairExample("1", "a", "b", 1.0)]
    batch = data.PairDataset(examples, tok, 16, cross_encode=True).collate([0])
    assert batch["input_ids"].tolist() == [[2, 10, 3, 20, 21, 3]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 1]]
    torch.manual_seed(0)
    model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.0, readouts=CROSS).eval()
    with torch.no_grad():
        pooled = mean_pool(
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


def test_concatenation_heads_are_a_linear_on_u_and_v(tiny_config):
    torch.manual_seed(0)
    model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.0, readouts=CONCAT).eval()
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
    model = sbert.SentenceBERT(
        bert, dropout=0.0, readouts={"para": "cosine"}, siamese="euclidean"
    ).eval()
    model.para_threshold.fill_(0.7)
    batch = pair_batch()
    with torch.no_grad():
        u, v = embeddings(model, batch)
        d = torch.tensor([math.dist(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)])
        assert torch.allclose(model("sts", batch), d, atol=1e-5)
        assert torch.allclose(model("para", batch), d - 0.7, atol=1e-5)  # d > 0.7: paraphrase
    assert model.checkpoint_config()["siamese"] == "euclidean"


def test_the_euclidean_output_is_the_distance_of_the_embeddings_not_of_dropped_ones(
    tiny_config,
):
    torch.manual_seed(0)
    quiet = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    bert = BertModel(BertConfig(**tiny_config.to_dict() | quiet))
    model = sbert.SentenceBERT(bert, dropout=0.5, siamese="euclidean").train()  # head dropout on
    batch = pair_batch()
    u, v = embeddings(model, batch)
    assert torch.allclose(model("sts", batch), (u - v).norm(dim=-1), atol=1e-5)


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
    cfg, _ = command.parse_args(["--preset", preset])
    assert cosine_tasks(cfg) == cosine and concat_tasks(cfg) == concat
    assert tuple(cfg.multitask.cross_encode) == cross


def test_the_sentence_bert_sts_target_keeps_the_cosine_under_concat_heads():
    cfg, _ = command.parse_args(["--preset", "broadhurst-2", "--sts_loss", "cosine_sbert"])
    assert concat_tasks(cfg) == ("para",)


@pytest.mark.slow
def test_compiled_layers_train_as_the_eager_ones(tiny_env):
    """--compile on the CPU (inductor, a C compiler): the same outputs and gradients as
    eager, dropout on, and SMART's replayed dropout masks still replayed."""
    bert_dir, _ = tiny_env
    batch = sentence_batch(vocab=40) | {"labels": torch.tensor([0, 4, 2])}
    models = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        models[compiled] = command.model_factory(
            ModelConfig(bert=str(bert_dir)), MULTITASK, None, compiled
        )()
    grads, outs = {}, {}
    for compiled, model in models.items():
        torch.manual_seed(1)
        outs[compiled] = model.train()("sst", batch)
        outs[compiled].square().sum().backward()
        grads[compiled] = torch.cat(
            [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        )
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-5, atol=1e-6)
    scale = grads[False].abs().max().item()
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-4, atol=1e-5 * scale)
    smart = SmartConfig(lambda_s=1, mu=0, sigma=1e-9, eta=1e-7, epsilon=1e-9, dropout="shared")
    stage = Stage(("sst",), 1e-3, 3, smart=smart)
    ctx = StepContext(runtime.make_runtime("cpu", "fp32"))
    plain = Stage(("sst",), 1e-3, 3)
    torch.manual_seed(2)
    with_r_s = batch_loss(models[True], "sst", batch, stage, ctx)
    torch.manual_seed(2)
    without = batch_loss(models[True], "sst", batch, plain, ctx)
    assert 0 <= (with_r_s - without).item() < 1e-9  # the perturbed pass saw the same masks


def test_the_handout_preset_builds_the_handouts_model_and_reads_it_through_predict(
    tiny_env, monkeypatch
):
    """--preset handout builds multitask_classifier.py's MultitaskBERT (its BERT_HIDDEN_SIZE
    the checkpoint's width, so the given heads fit the tiny BERT); a training step and the
    evaluation read a pair task through predict_*, each side cut to its own length: the
    same as predict_* on the unpadded sides."""
    import multitask_classifier

    bert_dir, _ = tiny_env
    hidden = multitask_classifier.BERT_HIDDEN_SIZE
    monkeypatch.setattr(multitask_classifier, "BERT_HIDDEN_SIZE", hidden)  # back after the test
    cfg, _ = command.parse_args(["--preset", "handout", "--bert", str(bert_dir)])
    model = command.run_model(cfg)().eval()
    assert type(model) is multitask_classifier.MultitaskBERT
    assert multitask_classifier.BERT_HIDDEN_SIZE == model.bert.config.hidden_size
    batch = pair_batch(vocab=40)  # (2, B, T): the sides padded to one T
    batch["attention_mask"][1, :, -2:] = 0  # the second side two tokens shorter
    out = model.predict("sts", batch)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    T = ids.size(-1)
    alone = model.predict_similarity(ids[0], mask[0], ids[1, :, : T - 2], mask[1, :, : T - 2])
    assert out.shape == (ids.size(1),)
    torch.testing.assert_close(out, alone, rtol=0, atol=0)
    assert model.readout("sst", sentence_batch(vocab=40), None).shape == (3, 5)
