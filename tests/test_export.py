"""lab/export.py: a trained run as a Hugging Face folder that transformers and
sentence-transformers load, giving our embeddings."""

import pytest
import torch

import datasets as data
from bert import BertModel
from commands import command
from engine import checkpoint, runtime
from helpers import (
    run,
    sentence_batch,
    weights,
)
from lab import export
from tokenizer import BertTokenizer


def test_export_writes_a_folder_that_both_loaders_read(tiny_env, tmp_path, capsys):
    import transformers

    run(tiny_env, tmp_path / "run", "--loops", "0")
    export.main([str(tmp_path / "run")])
    out = tmp_path / "run" / "export"
    assert {p.name for p in out.iterdir()} >= {"config.json", "vocab.txt", "model.safetensors"}
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert "Kept stage: QQP" in card and "SentenceTransformer(" in card and '"preset"' in card
    ours = BertModel.from_pretrained(str(out)).eval()  # also: --bert RUN/export
    best = weights(tmp_path / "run" / "best.safetensors")
    for name, value in ours.state_dict().items():
        assert torch.equal(value, best[f"bert.{name}"]), name
    hf = transformers.BertModel.from_pretrained(str(out)).eval()
    batch = sentence_batch(vocab=ours.config.vocab_size)
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
        b = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.allclose(a, b.last_hidden_state, atol=1e-5)
    heads, _ = checkpoint.read_tensors(out / "heads.safetensors")
    assert torch.equal(heads["sst.weight"], best["heads.sst.weight"])


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_sentence_transformers_loads_the_export_and_gives_our_embeddings(
    tiny_env, tmp_path, pooling
):
    """sentence-transformers is an independent reader of the folder: its own tokenizer
    (transformers' BertTokenizer from vocab.txt and tokenizer_config.json), encoder and
    mean pooling must give our model's sentence embeddings. CLS pooling reads BERT's pooler,
    which sentence-transformers has no module for: no such layout is written."""
    import warnings

    from sentence_transformers import SentenceTransformer

    run(tiny_env, tmp_path / "run", "--loops", "0", "--pooling", pooling)
    export.main([str(tmp_path / "run")])
    out = tmp_path / "run" / "export"
    if pooling == "cls":
        assert not (out / "modules.json").exists()
        return
    cfg, _ = command.parse_args(["--predict", str(tmp_path / "run")])
    model, _ = command.best_model(cfg, tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    sentences = ["a good film", "the dull one , awful !", "great"]
    batch = data.SentenceDataset(
        [data.SentenceExample(str(i), s, None) for i, s in enumerate(sentences)],
        tokenizer,
        cfg.data.max_length,
    ).collate([0, 1, 2])
    with torch.no_grad():
        ours = model.sentences(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loads silently: no guessed pooling
        st = SentenceTransformer(str(out), device="cpu")
    theirs = st.encode(sentences, convert_to_tensor=True)
    assert st.max_seq_length == cfg.data.max_length
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
