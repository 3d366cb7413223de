"""classifier.py, the single-task Phase 1 driver, on a tiny random BERT."""

import torch

import classifier
from commands import classify, cli
from commands.handout import model_config
from helpers import tiny_flags, weights
from settings import ModelConfig


def test_classifier_frozen_option_trains_only_the_head(tiny_env, tmp_path):
    flags = "--task cfimdb --option last-linear-layer --epochs 2 --batch_size 8 --max_length 64"
    rows, best = classify.main(tiny_flags(tiny_env, tmp_path / "run", flags))["cfimdb"]
    assert [r["stage"] for r in rows] == ["start (no training)", "epoch 1", "epoch 2"]
    assert "train" in rows[1] and "accuracy" in rows[1]["cfimdb"]
    trained = weights(tmp_path / "run" / "state.safetensors")
    cfg = classify.ClassifierConfig(model=ModelConfig(bert=str(tiny_env[0])))
    start = classify.model_factory(cfg, "cfimdb")().state_dict()
    for name, value in start.items():
        if name.startswith("bert."):
            assert torch.equal(value, trained[name]), name
    assert not torch.equal(start["classifier.weight"], trained["classifier.weight"])


def test_the_frozen_option_has_its_own_learning_rate_unless_one_is_given():
    parse = cli.parse
    frozen = ["--option", "last-linear-layer"]
    assert (
        parse(classify.ClassifierConfig(), frozen, overrides=classify.frozen_lr)[0].optim.lr == 1e-3
    )
    typed = parse(
        classify.ClassifierConfig(), [*frozen, "--lr", "0.1"], overrides=classify.frozen_lr
    )
    assert typed[0].optim.lr == 0.1
    default = parse(classify.ClassifierConfig(), [], overrides=classify.frozen_lr)[0]
    assert default.option == "pretrain" and default.optim.lr == 1e-3  # the handout's default
    tuned = parse(
        classify.ClassifierConfig(), ["--option", "finetune"], overrides=classify.frozen_lr
    )
    assert tuned[0].optim.lr == 1e-5


def test_the_2024_full_model_lr_is_named_where_it_differs_from_the_handouts():
    """The 2024 handout's classifier.py trains at 1e-3 in both modes; full-model here trains
    at 1e-5 and says so, unless --lr is typed (then nothing differs)."""
    said = classify.typed_2024_full_model_lr
    assert said(["--fine-tune-mode", "full-model"]) and said(["--fine-tune-mode=full-model"])
    assert not said(["--fine-tune-mode", "full-model", "--lr", "1e-3"])
    assert not said(["--fine-tune-mode=full-model", "--lr=1e-3"])
    assert not said(["--fine-tune-mode", "last-linear-layer"]) and not said(
        ["--option", "finetune"]
    )
    assert "1e-5" in classify.LR_2024 and "--lr 1e-3" in classify.LR_2024


def test_negative_sizes_are_refused():
    import pytest

    with pytest.raises(SystemExit, match="--train_size must be at least 0, got -3"):
        classify.main(["--train_size", "-3"])


def test_the_handouts_sentiment_classifier_is_a_model_of_its_own(tiny_config, tiny_env):
    """BertSentimentClassifier(ids, mask) is the handout's forward: the linear layer on BERT's
    pooled [CLS] in eval, (B, C) for each task; what the loop and the evaluation read of it
    (sentences -> readout, predict) is that forward; a classifier.py run trains this class."""
    torch.manual_seed(0)
    for task, classes in (("sst", 5), ("cfimdb", 2)):
        config = model_config(ModelConfig(bert=str(tiny_env[0])), classes, frozen=False)
        model = classifier.BertSentimentClassifier(config).eval()
        assert (config.option, config.fine_tune_mode) == ("finetune", "full-model")
        bert = model.bert
        ids = torch.randint(1, bert.config.vocab_size, (3, 6))
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids}
        logits = model(ids, mask)
        pooled = bert(ids, mask)["pooler_output"]
        assert logits.shape == (3, classes)
        assert torch.allclose(logits, pooled @ model.classifier.weight.T + model.classifier.bias)
        assert torch.equal(logits, model.readout(task, batch, model.sentences(batch)))
        assert torch.equal(logits, model.predict(task, batch))
    cfg = classify.ClassifierConfig(model=ModelConfig(bert=str(tiny_env[0])))
    assert type(classify.model_factory(cfg, "sst")()) is classifier.BertSentimentClassifier


def test_mean_pooling_is_refused_on_part_1(tiny_env, tmp_path):
    import pytest

    flags = tiny_flags(tiny_env, tmp_path / "run", "--task sst --pooling mean")
    with pytest.raises(SystemExit, match="--pooling mean: Part 1's model reads BERT's pooled"):
        classify.main(flags)
    assert not (tmp_path / "run").exists()
