"""From examples to batches (datasets.py, batches.py): tokenized datasets and their collate functions, the
length-bucket sampler, and a run's training sets, shares and round-robin order."""

import importlib.util

import pytest
import torch

import batches as B
import datasets as D
import datasets as data
from helpers import RecordedBar

CLS, SEP = 101, 102
HELLO, WORLD, A = 7592, 2088, 1037  # bert-base-uncased WordPiece ids


@pytest.fixture(scope="module")
def tokenizer():
    if importlib.util.find_spec("tokenizer") is not None:
        from tokenizer import BertTokenizer

        return BertTokenizer.from_pretrained("minilm")
    import transformers

    import base_bert

    return transformers.BertTokenizer.from_pretrained(str(base_bert.resolve_model_dir("minilm")))


def test_sentence_collate_by_hand(tokenizer):
    examples = [D.SentenceExample("i1", "Hello world", 1), D.SentenceExample("i2", "a", 0)]
    ds = D.SentenceDataset(examples, tokenizer)
    assert ds.lengths == [4, 3] and len(ds) == 2
    batch = ds.collate([0, 1])
    assert batch["input_ids"].tolist() == [[CLS, HELLO, WORLD, SEP], [CLS, A, SEP, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert batch["ids"] == ["i1", "i2"]
    # Each batch is padded to its own longest sequence.
    assert ds.collate([1])["input_ids"].tolist() == [[CLS, A, SEP]]
    assert all(batch[k].dtype == torch.long for k in ("input_ids", "attention_mask"))


def test_sentence_collate_matches_tokenizer_padding(tokenizer):
    sentences = ["The Rock is destined to be great.", "No.", "A sad, sad movie about nothing"]
    ds = D.SentenceDataset(
        [D.SentenceExample(str(i), s, None) for i, s in enumerate(sentences)], tokenizer
    )
    batch = ds.collate([0, 1, 2])
    ref = tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(batch[key], ref[key].long()), key
    assert "labels" not in batch


def test_siamese_pair_collate_by_hand(tokenizer):
    examples = [D.PairExample("p1", "Hello world", "a", 1), D.PairExample("p2", "a", "hello", 0)]
    ds = D.PairDataset(examples, tokenizer)
    assert ds.lengths == [4, 3]  # the longer side of each pair
    batch = ds.collate([0, 1])
    B, T = 2, 4
    assert batch["input_ids"].shape == (2, B, T)
    assert batch["input_ids"][0].tolist() == [[CLS, HELLO, WORLD, SEP], [CLS, A, SEP, 0]]
    assert batch["input_ids"][1].tolist() == [[CLS, A, SEP, 0], [CLS, HELLO, SEP, 0]]
    assert batch["attention_mask"].tolist() == [
        [[1, 1, 1, 1], [1, 1, 1, 0]],
        [[1, 1, 1, 0], [1, 1, 1, 0]],
    ]
    assert batch["token_type_ids"].shape == (2, B, T) and batch["token_type_ids"].sum() == 0
    assert batch["labels"].dtype == torch.float and batch["labels"].tolist() == [1.0, 0.0]
    assert batch["ids"] == ["p1", "p2"]
    # One forward over both sides: rows [:B] are the first sentences, [B:] the second.
    flat = batch["input_ids"].view(2 * B, T)
    assert flat[1].tolist() == [CLS, A, SEP, 0] and flat[B + 1].tolist() == [CLS, HELLO, SEP, 0]


def test_cross_encoded_pair_collate(tokenizer):
    examples = [D.PairExample("p1", "Hello world", "a", 2.5), D.PairExample("p2", "a", "a", 0.0)]
    ds = D.PairDataset(examples, tokenizer, cross_encode=True)
    batch = ds.collate([0, 1])
    assert batch["input_ids"].tolist() == [
        [CLS, HELLO, WORLD, SEP, A, SEP],
        [CLS, A, SEP, A, SEP, 0],
    ]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [2.5, 0.0]
    first, second = ["Why is the sky blue?", "ok"], ["Because of Rayleigh scattering.", "fine then"]
    ds = D.PairDataset(
        [
            D.PairExample(str(i), a, b, None)
            for i, (a, b) in enumerate(zip(first, second, strict=True))
        ],
        tokenizer,
        cross_encode=True,
    )
    ref = tokenizer(first, text_pair=second, padding=True, truncation=True, return_tensors="pt")
    batch = ds.collate([0, 1])
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(batch[key], ref[key].long()), key


def test_cross_encoding_truncates_longest_first(tokenizer):
    # 4 + 1 tokens plus 3 specials = 8 > 6: the two cut tokens come from the longer side.
    ex = [D.PairExample("p", "hello world hello world", "a", None)]
    ds = D.PairDataset(ex, tokenizer, max_length=6, cross_encode=True)
    assert ds.collate([0])["input_ids"].tolist() == [[CLS, HELLO, WORLD, SEP, A, SEP]]
    siamese = D.PairDataset(ex, tokenizer, max_length=4)
    assert siamese.collate([0])["input_ids"][0].tolist() == [[CLS, HELLO, WORLD, SEP]]


def test_mixed_labels_rejected(tokenizer):
    examples = [D.SentenceExample("a", "x", 1), D.SentenceExample("b", "y", None)]
    with pytest.raises(ValueError, match="some examples have labels"):
        D.SentenceDataset(examples, tokenizer)


def test_make_loader_yields_every_example_once(tokenizer):
    examples = [D.SentenceExample(f"s{i}", "word " * (i % 7 + 1), i % 5) for i in range(23)]
    ds = D.SentenceDataset(examples, tokenizer)
    loader = B.make_loader(
        ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    seen = []
    for batch in loader:
        seen += batch["ids"]
        # labels travel with their ids
        assert batch["labels"].tolist() == [int(i[1:]) % 5 for i in batch["ids"]]
        assert batch["input_ids"].shape[1] == batch["attention_mask"].sum(1).max()
    assert sorted(seen) == sorted(e.id for e in examples)


def padding(batches, lengths) -> int:
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)


@pytest.mark.parametrize(
    "n,batch_size,per_bucket", [(1037, 32, 5), (64, 8, 50), (1, 4, 2), (0, 4, 2)]
)
def test_bucket_sampler_covers_every_index_once(n, batch_size, per_bucket):
    lengths = torch.randint(1, 100, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    for shuffle in (True, False):
        sampler = B.LengthBucketSampler(
            lengths, batch_size, shuffle, torch.Generator().manual_seed(0), per_bucket
        )
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(n))
        assert sum(len(b) < batch_size for b in batches) <= 1  # only one short batch


def test_bucket_sampler_is_deterministic_and_reshuffles():
    lengths = torch.randint(1, 100, (500,), generator=torch.Generator().manual_seed(2)).tolist()

    def epochs(seed):
        sampler = B.LengthBucketSampler(lengths, 16, generator=torch.Generator().manual_seed(seed))
        return list(sampler), list(sampler)

    assert epochs(0) == epochs(0)
    first, second = epochs(0)
    assert first != second  # a new order every epoch
    assert epochs(1)[0] != first
    ordered = list(B.LengthBucketSampler(lengths, 16, shuffle=False))
    flat = [lengths[i] for b in ordered for i in b]
    assert flat == sorted(lengths, reverse=True)


def test_bucket_sampler_reduces_padding():
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(5, 128, (5000,), generator=g).tolist()
    bucketed = list(B.LengthBucketSampler(lengths, 32, generator=g))
    order = torch.randperm(len(lengths), generator=g).tolist()
    random_batches = [order[i : i + 32] for i in range(0, len(order), 32)]
    # Random batches of 32 waste about half their tokens; sorted chunks of 50 batches ~2%.
    assert padding(bucketed, lengths) < 0.1 * padding(random_batches, lengths)


class FakeTok:
    pad_token_id = 0

    def __call__(self, texts, text_pair=None, **kw):
        return {"input_ids": [[2, 7, 3] for _ in texts], "token_type_ids": [[0] * 3 for _ in texts]}


def test_fraction_stage_draws_a_fresh_subset_each_loop():
    pairs = D.PairDataset([D.PairExample(str(i), "a", "b", 0.0) for i in range(200)], FakeTok(), 16)

    def subset(seed):
        loader = B.fraction_loader(pairs, 0.03, 4, torch.Generator().manual_seed(seed))
        return sorted(i for b in loader for i in b["ids"])

    assert len(subset(1)) == 6
    assert subset(1) == subset(1)
    assert subset(1) != subset(2)


def test_round_robin_visits_the_largest_set_once_and_cycles_the_others():
    big = torch.utils.data.DataLoader(list(range(10)), batch_size=2)  # 5 batches
    small = torch.utils.data.DataLoader(list(range(100, 104)), batch_size=2)  # 2 batches
    for order in ("fixed", "random"):
        batches = B.MultiTaskBatches(
            {"a": big, "b": small}, "round_robin", order, torch.Generator().manual_seed(0)
        )
        steps = list(batches)
        assert len(steps) == len(batches) == 10 and all(len(s) == 1 for s in steps)
        seen = {t: [x for s in steps for tt, b in s if tt == t for x in b.tolist()] for t in "ab"}
        assert sorted(seen["a"]) == list(range(10))  # every example of the largest, once
        assert sorted(seen["b"]) == sorted(list(range(100, 104)) * 2 + [100, 101])  # cycled
    simultaneous = list(B.MultiTaskBatches({"a": big, "b": small}, "simultaneous"))
    assert len(simultaneous) == 5 and all([t for t, _ in s] == ["a", "b"] for s in simultaneous)


def test_standardized_indices_sample_or_repeat():
    g = torch.Generator().manual_seed(0)
    down = B.standardized_indices(10, 4, g)
    assert len(set(down)) == 4 and all(0 <= i < 10 for i in down)
    up = B.standardized_indices(3, 8, g)
    assert len(up) == 8 and sorted(up[:6]) == [0, 0, 1, 1, 2, 2]  # whole passes first


def test_only_trained_tasks_read_their_training_sets(tiny_env):
    from settings import DataConfig
    from tokenizer import BertTokenizer

    bert_dir, data_dir = tiny_env
    tok = BertTokenizer.from_pretrained(str(bert_dir))
    cfg = DataConfig(data_dir=str(data_dir))
    loaded = D.load_task_data(cfg, tok, ("sst", "para", "sts"), 0, train_tasks={"sst"})
    assert len(loaded["sst"].train) == 48
    assert loaded["para"].train is None and loaded["sts"].train is None
    assert len(loaded["para"].dev) == 16  # every task is still scored


def test_a_random_order_shuffles_the_batches_of_a_simultaneous_step():
    loaders = {t: [f"{t}{i}" for i in range(4)] for t in ("sst", "para", "sts")}
    g = torch.Generator().manual_seed(0)
    fixed = list(B.MultiTaskBatches(loaders, "simultaneous", "fixed", g))
    assert all([t for t, _ in step] == ["sst", "para", "sts"] for step in fixed)
    shuffled = list(B.MultiTaskBatches(loaders, "simultaneous", "random", g))
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


def test_tokenizing_in_chunks_equals_one_call_and_counts_every_text(tokenizer, monkeypatch):
    firsts = ["Hello world", "a", "hello a world", "world", "a a a"]
    seconds = ["a", "hello", "world", "a world", "hello"]
    whole = tokenizer(
        firsts, seconds, padding=False, truncation=True, max_length=6, return_tensors=None
    )
    monkeypatch.setattr(D, "TOKENIZE_CHUNK", 2)  # 3 calls: 2 + 2 + 1 texts
    monkeypatch.setattr(D, "tqdm", RecordedBar)
    RecordedBar.made = []
    ids, types = D._encode(tokenizer, firsts, seconds, 6)
    assert ids == whole["input_ids"] and types == whole["token_type_ids"]
    (bar,) = RecordedBar.made
    assert bar.kwargs["total"] == bar.done == 5 and bar.kwargs["delay"] > 0


def test_the_head_of_a_dataset_batches_as_its_first_examples(tokenizer):
    """datasets.head (--estimate's timing sample): the first n examples, batched exactly as
    the whole set batches them; the whole set when n covers it."""
    examples = [D.PairExample(f"p{i}", "Hello world", "a" * (i + 1), i % 2) for i in range(5)]
    ds = D.PairDataset(examples, tokenizer)
    head = D.head(ds, 3)
    assert len(head) == 3 and head.ids == ["p0", "p1", "p2"] and len(ds) == 5
    loader = B.make_loader(head, batch_size=8, shuffle=False)
    (batch,) = list(loader)
    assert sorted(batch["ids"]) == ["p0", "p1", "p2"]
    whole = ds.collate([int(i[1:]) for i in batch["ids"]])  # the same examples, from ds
    assert all(torch.equal(batch[k], whole[k]) for k in ("input_ids", "attention_mask", "labels"))
    assert D.head(ds, 5) is ds and D.head(ds, 9) is ds
