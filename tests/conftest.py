"""Shared fixtures: the real data folder (skipped when absent) and a tiny BERT config."""

import os
from pathlib import Path

import pytest
import torch

from base_bert import BertConfig

# The tests' models are tiny: one thread is faster than two fighting over a loaded CPU, and
# results compared within a test do not depend on the thread count.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # and the processes the tests start

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The CS224n data folder from MINBERT_DATA (CI: ../shared/data), else data/."""
    path = Path(os.environ.get("MINBERT_DATA", REPO / "data"))
    if not path.is_absolute():
        path = REPO / path
    if not (path / "ids-sst-train.csv").is_file():
        pytest.skip(f"no CS224n data in {path}; set MINBERT_DATA")
    return path


@pytest.fixture
def tiny_config() -> BertConfig:
    return tiny_bert_config()


def tiny_bert_config() -> BertConfig:
    """A 2-layer BERT small enough for tests that run in milliseconds."""
    return BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )


WORDS = (
    "good great fine bad awful dull movie film plot actor scene story how what why is are "
    "do can the a to of learn python code run fast slow cat dog man woman plays guitar eats"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _sentence(rng, n=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, n)))


def write_tiny_data(folder: Path, n_train=48, n_dev=16, seed=0):
    """Small CS224n-format files: sentiment labels follow the words, so tasks are learnable."""
    import random

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    scores = {"good": 4, "great": 4, "fine": 3, "bad": 1, "awful": 0, "dull": 1}
    for split, n in (("train", n_train), ("dev", n_dev), ("test-student", n_dev)):
        labeled = split != "test-student"
        for stem in ("ids-sst", "ids-cfimdb"):
            rows = ["\tid\tsentence" + ("\tsentiment" if labeled else "")]
            for i in range(n):
                s = _sentence(rng)
                label = next((scores[w] for w in s.split() if w in scores), 2)
                label = label if stem == "ids-sst" else int(label >= 3)
                rows.append(f"{i}\t{stem}{split}{i}\t{s}" + (f"\t{label}" if labeled else ""))
            (folder / f"{stem}-{split}.csv").write_text("\n".join(rows) + "\n")
        for stem, col in (("quora", "is_duplicate"), ("sts", "similarity")):
            rows = ["\tid\tsentence1\tsentence2" + (f"\t{col}" if labeled else "")]
            for i in range(n):
                a = _sentence(rng)
                same = rng.random() < 0.5
                b = a if same else _sentence(rng)
                label = float(same) if stem == "quora" else (5.0 if same else rng.uniform(0, 2))
                rows.append(
                    f"{i}\t{stem}{split}{i}\t{a}\t{b}" + (f"\t{label:.1f}" if labeled else "")
                )
            (folder / f"{stem}-{split}.csv").write_text("\n".join(rows) + "\n")
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["premise\thypothesis\tlabel"]
        for _ in range(n):
            premise = _sentence(rng)
            rows += [f"{premise}\t{premise} .\t0", f"{premise}\t{_sentence(rng)}\t2"]
            rows.append(f"{premise}\t{_sentence(rng)}\t1")
        (folder / f"snli-{split}.csv").write_text("\n".join(rows) + "\n")
    return folder


def add_real_bad_rows(folder: Path) -> Path:
    """The kinds of bad rows the handout's real files hold, added to tiny data: a Quora dev
    pair whose is_duplicate is empty after a quoted sentence (the real quora-dev.csv has two,
    at lines 2577 and 14222), and in the test files a pair with an empty sentence, an SST
    sentence that is empty and a repeated id (every test row gets a prediction)."""
    quoted = '"""Where can I find it"" asked the man?"'
    with (folder / "quora-dev.csv").open("a") as f:
        f.write(f"90\tquoradev-nolabel\tgood day\t{quoted}\t\n")
    with (folder / "quora-test-student.csv").open("a") as f:
        f.write("90\tquoratest-empty\t \tgood day\n91\tquoratest-student0\tbad day\tok\n")
    with (folder / "ids-sst-test-student.csv").open("a") as f:
        f.write("90\tids-ssttest-empty\t\n")
    return folder


def write_tiny_checkpoint(folder: Path, config: BertConfig, seed=0):
    """A random tiny BERT in Hugging Face format (config.json, model.safetensors, vocab.txt)."""
    import json

    import torch
    from safetensors.torch import save_file

    from base_bert import ours_to_hf
    from bert import BertModel

    folder.mkdir(parents=True, exist_ok=True)
    vocab = SPECIALS + sorted(set(WORDS)) + ["?", ".", ","]
    config = BertConfig(**{**config.to_dict(), "vocab_size": len(vocab)})
    torch.manual_seed(seed)
    state = {ours_to_hf(k): v.contiguous() for k, v in BertModel(config).state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


@pytest.fixture
def tiny_env(tmp_path, tiny_config):
    """(checkpoint folder, data folder) for end-to-end runs in a second or two."""
    return (
        write_tiny_checkpoint(tmp_path / "tiny-bert", tiny_config),
        write_tiny_data(tmp_path / "data"),
    )


def pytest_collection_modifyitems(items):
    """The slow end-to-end tests queued first: on several workers (`make test` runs pytest
    -n auto --dist worksteal) a long test does not start last while the others wait, and
    an idle worker takes queued tests from a busy one."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
