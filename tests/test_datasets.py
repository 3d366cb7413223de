"""datasets.py: readers on hand-written fixture files, collate checked by hand and against the
tokenizer's own padding, the length-bucket sampler, and the real data folder's row counts."""

import csv
import importlib.util
import re
import warnings

import pytest
import torch

import datasets as D
import datasets as data
from lab import fetch

# ---------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def tokenizer():
    if importlib.util.find_spec("tokenizer") is not None:
        from tokenizer import BertTokenizer

        return BertTokenizer.from_pretrained("minilm")
    import transformers

    import base_bert

    return transformers.BertTokenizer.from_pretrained(str(base_bert.resolve_model_dir("minilm")))


def write(tmp_path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_quietly(fn, *args, **kwargs):
    """Call a reader; return (result, list of DataWarning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, D.DataWarning)]


SST_HEADER = "\tid\tsentence\tsentiment"
PAIR_HEADER = "\tid\tsentence1\tsentence2\t{}"

# ---------------------------------------------------------------------------------------
# Files and folders


def test_data_dir_precedence(monkeypatch):
    monkeypatch.delenv("MINBERT_DATA", raising=False)
    assert D.data_dir(None) == D.data_dir() and str(D.data_dir(None)) == "data"
    monkeypatch.setenv("MINBERT_DATA", "/some/where")
    assert str(D.data_dir(None)) == "/some/where"
    assert str(D.data_dir("mine")) == "mine"


def test_task_file_names():
    assert D.task_file("d", "sst", "train").as_posix() == "d/ids-sst-train.csv"
    assert D.task_file("d", "cfimdb", "test").name == "ids-cfimdb-test-student.csv"
    assert D.task_file("d", "para", "dev").name == "quora-dev.csv"
    assert D.task_file("d", "sts", "test").name == "sts-test-student.csv"
    assert D.task_file("d", "snli", "train").name == "snli-train.csv"
    assert len(D.expected_files()) == 14
    with pytest.raises(ValueError, match="unknown task 'quora'"):
        D.task_file("d", "quora", "dev")
    with pytest.raises(ValueError, match="unknown split 'test' for 'snli'"):
        D.task_file("d", "snli", "test")


def test_missing_file_says_how_to_get_it(tmp_path):
    path = tmp_path / "ids-sst-dev.csv"
    with pytest.raises(FileNotFoundError) as err:
        D.read_sentiment(path, 5)
    assert str(path) in str(err.value)
    assert "MINBERT_DATA" in str(err.value) and "make data" in str(err.value)


def test_header_without_needed_column_is_an_error(tmp_path):
    path = write(tmp_path, "x.csv", ["\tid\ttext\tsentiment", "0\ta\thello\t1"])
    with pytest.raises(D.DataError, match=rf"{re.escape(str(path))}:1: .*\['sentence'\]"):
        D.read_sentiment(path, 5)


# ---------------------------------------------------------------------------------------
# Readers: good rows


def test_read_sentiment_good_rows(tmp_path):
    path = write(
        tmp_path,
        "sst.csv",
        [SST_HEADER, "0\tA1\t It 's a lovely film .\t3", "1\tb2\t No one  goes .  \t0"],
    )
    got, warned = read_quietly(D.read_sentiment, path, 5)
    assert warned == []
    # Stripped as the handout does (sentence.strip()); inner spacing and case are kept.
    assert got == [
        D.SentenceExample("A1", "It 's a lovely film .", 3),
        D.SentenceExample("b2", "No one  goes .", 0),
    ]


def test_read_test_student_with_extra_leading_column(tmp_path):
    path = write(
        tmp_path, "t.csv", ["0\t\tid\tsentence", "1\t0.0\tb75\t Effective", "2\t1.0\td17\t x"]
    )
    got = D.read_sentiment(path, 5)
    assert got == [D.SentenceExample("b75", "Effective", None), D.SentenceExample("d17", "x", None)]


def test_read_pairs_binary_and_score(tmp_path):
    quora = write(
        tmp_path,
        "q.csv",
        [
            PAIR_HEADER.format("is_duplicate"),
            "7\tq1\tWhy?It's ok,fine.\tHow  so\t1.0",
            "8\tq2\ta\tb\t0",
        ],
    )
    got = D.read_pairs(quora, "binary")
    # The handout's preprocess_string spacing (without lowercasing).
    assert got == [
        D.PairExample("q1", "Why ?It 's ok ,fine .", "How so", 1),
        D.PairExample("q2", "a", "b", 0),
    ]
    assert all(isinstance(e.label, int) for e in got)
    sts = write(tmp_path, "s.csv", [PAIR_HEADER.format("similarity"), "1\ts1\ta\tb\t4.6"])
    assert D.read_pairs(sts, "score") == [D.PairExample("s1", "a", "b", 4.6)]
    unlabeled = write(tmp_path, "u.csv", ["\tid\tsentence1\tsentence2", "1\tu1\ta\tb"])
    assert D.read_pairs(unlabeled, "score") == [D.PairExample("u1", "a", "b", None)]
    with pytest.raises(ValueError, match="unknown pair kind"):
        D.read_pairs(sts, "regression")


def test_read_snli(tmp_path):
    path = write(
        tmp_path, "snli.csv", ["premise\thypothesis\tlabel", "A dog runs.\tAn animal moves.\t0"]
    )
    assert D.read_snli(path) == [D.NLIExample("A dog runs.", "An animal moves.", 0)]


# ---------------------------------------------------------------------------------------
# Readers: bad rows, one kind at a time (line 3 is bad, lines 2 and 4 are good)

SST_BAD = [
    ("2\tx2\t bad\t", "empty label"),
    ("2\tx2\t bad\tgood", "label 'good' is not a number"),
    ("2\tx2\t bad\t5", "label '5' is out of range; expected an integer 0-4"),
    ("2\tx2\t bad\t2.5", "label '2.5' is out of range"),
    ("2\tx2\t   \t2", "empty sentence"),
    ("2\t\t bad\t2", "empty id"),
    ("2\tx2\t bad\textra\t2", "5 columns; expected 4"),
    ("2\tx2\t bad", "3 columns; expected 4"),
]


@pytest.mark.parametrize("bad_row,reason", SST_BAD)
def test_sentiment_bad_row(tmp_path, bad_row, reason):
    path = write(tmp_path, "sst.csv", [SST_HEADER, "0\tg1\t first\t1", bad_row, "3\tg3\t last\t4"])
    got, warned = read_quietly(D.read_sentiment, path, 5)
    # Skipped, and the ids and labels around it stay paired.
    assert [(e.id, e.sentence, e.label) for e in got] == [("g1", "first", 1), ("g3", "last", 4)]
    assert len(warned) == 1
    assert f"{path}: skipped 1 bad row(s) at line(s) 3;" in warned[0] and reason in warned[0]
    with pytest.raises(D.DataError, match=rf"^{re.escape(str(path))}:3: {re.escape(reason)}"):
        D.read_sentiment(path, 5, strict=True)


PAIR_BAD = [
    ("binary", "is_duplicate", "", "empty label; expected an integer 0-1"),  # the Quora case
    ("binary", "is_duplicate", "0.5", "label '0.5' is out of range"),
    ("binary", "is_duplicate", "2.0", "label '2.0' is out of range"),
    ("score", "similarity", "5.2", "label '5.2' is out of range; expected a number in [0, 5]"),
    ("score", "similarity", "-0.1", "label '-0.1' is out of range"),
    ("score", "similarity", "nan", "label 'nan' is out of range"),
    ("score", "similarity", "high", "label 'high' is not a number"),
]


@pytest.mark.parametrize("kind,column,label,reason", PAIR_BAD)
def test_pair_bad_label(tmp_path, kind, column, label, reason):
    lines = [PAIR_HEADER.format(column), "0\tg1\ta\tb\t1", f"1\tx\tc\td\t{label}", "2\tg3\te\tf\t0"]
    path = write(tmp_path, "p.csv", lines)
    got, warned = read_quietly(D.read_pairs, path, kind)
    assert [(e.id, e.label) for e in got] == [("g1", 1), ("g3", 0)]
    assert len(warned) == 1 and reason in warned[0] and "line(s) 3;" in warned[0]
    with pytest.raises(D.DataError, match=rf"{re.escape(str(path))}:3: {re.escape(reason)}"):
        D.read_pairs(path, kind, strict=True)


def test_pair_empty_second_sentence(tmp_path):
    path = write(tmp_path, "p.csv", [PAIR_HEADER.format("similarity"), "0\tx\ta\t \t1.0"])
    with pytest.raises(D.DataError, match=r":2: empty sentence2; expected text"):
        D.read_pairs(path, "score", strict=True)


def test_cfimdb_and_snli_label_ranges(tmp_path):
    cfimdb = write(tmp_path, "c.csv", [SST_HEADER, "0\ta\tgood\t1", "1\tb\tbad\t2"])
    with pytest.raises(
        D.DataError, match=r":3: label '2' is out of range; expected an integer 0-1"
    ):
        D.read_sentiment(cfimdb, 2, strict=True)
    snli = write(tmp_path, "s.csv", ["premise\thypothesis\tlabel", "p\th\t3", "p\th\t2", "\th\t1"])
    got, warned = read_quietly(D.read_snli, snli)
    assert got == [D.NLIExample("p", "h", 2)]
    assert len(warned) == 1 and "skipped 2 bad row(s) at line(s) 2, 4;" in warned[0]
    with pytest.raises(
        D.DataError, match=r":2: label '3' is out of range; expected an integer 0-2"
    ):
        D.read_snli(snli, strict=True)


def test_many_bad_rows_one_warning_with_count_and_lines(tmp_path):
    rows = [SST_HEADER]
    for i in range(10):
        rows += [f"{i}\tgood{i}\t ok\t{i % 5}", f"{i}\tbad{i}\t no label\t"]
    path = write(tmp_path, "sst.csv", rows)
    got, warned = read_quietly(D.read_sentiment, path, 5)
    assert [e.id for e in got] == [f"good{i}" for i in range(10)]
    assert [e.label for e in got] == [i % 5 for i in range(10)]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert "skipped 10 bad row(s) at line(s) 3, 5, 7, 9, 11, ...;" in warned[0]


def test_a_file_that_cannot_be_read_is_one_data_error(tmp_path, monkeypatch):
    path = tmp_path / "sst.csv"
    path.write_bytes(SST_HEADER.encode() + b"\n0\tg1\t caf\xe9\t1\n")  # Latin-1, not UTF-8
    with pytest.raises(D.DataError, match=r"sst.csv: cannot read .*; expected UTF-8 text$"):
        D.read_sentiment(path, 5)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(D.Path, "read_text", denied)  # root reads even a chmod 000 file
    match = r"sst.csv: cannot read \(Permission denied\); expected a readable file$"
    with pytest.raises(D.DataError, match=match):
        D.read_sentiment(path, 5)


def test_a_stray_quote_spoils_its_own_row_only(tmp_path):
    # No field of the CS224n files spans lines or tabs: a quote that does not close on its
    # line is a bad row, and the lines after it are rows of their own (not swallowed).
    rows = [f'{i}\ts{i}\t"say ""hi"" {i}"\t1' for i in range(60)]
    rows[3] = '3\ts3\t"an opening quote that never closes\t2'
    rows[4] = '4\ts4\t"Harry Potter" is great\t\x0c3'  # read as the handout reads it
    path = tmp_path / "sst.csv"
    path.write_text(SST_HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(D.DataError, match=r":5: stray quote"):
        D.read_sentiment(path, 5, strict=True)
    got, warned = read_quietly(D.read_sentiment, path, 5)
    assert len(got) == 59 and got[0] == D.SentenceExample("s0", 'say "hi" 0', 1)
    assert got[3] == D.SentenceExample("s4", "Harry Potter is great", 3)  # \f: not a newline
    assert "skipped 1 bad row(s) at line(s) 5;" in warned[0]


def test_ids_are_unique_single_words_and_a_bom_is_not_a_column(tmp_path):
    # An id with a tab or newline would forge a row of a prediction file; a repeated id
    # would be predicted twice. The byte-order mark of an Excel export is not text.
    lines = [SST_HEADER, "0\ta\tone\t1", '1\t"b x"\ttwo\t1', "2\ta\tthree\t2", "3\tc\tfour\t3"]
    path = tmp_path / "sst.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8-sig")
    got, warned = read_quietly(D.read_sentiment, path, 5)
    assert [e.id for e in got] == ["a", "c"]
    assert "skipped 2 bad row(s) at line(s) 3, 4;" in warned[0]
    assert "line 3: id 'b x' has a space or a comma" in warned[0]
    del lines[2]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8-sig")
    with pytest.raises(D.DataError, match=r":3: id 'a' repeats line 2"):
        D.read_sentiment(path, 5, strict=True)
    snli = tmp_path / "snli.csv"
    snli.write_text("premise\thypothesis\tlabel\nA man.\tA person.\t0\n", encoding="utf-8-sig")
    assert D.read_snli(snli, strict=True) == [D.NLIExample("A man.", "A person.", 0)]


# ---------------------------------------------------------------------------------------
# Tokenized datasets and collate

HELLO, WORLD, A = 7592, 2088, 1037  # bert-base-uncased WordPiece ids
CLS, SEP = 101, 102


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
    loader = D.make_loader(
        ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    seen = []
    for batch in loader:
        seen += batch["ids"]
        # labels travel with their ids
        assert batch["labels"].tolist() == [int(i[1:]) % 5 for i in batch["ids"]]
        assert batch["input_ids"].shape[1] == batch["attention_mask"].sum(1).max()
    assert sorted(seen) == sorted(e.id for e in examples)


# ---------------------------------------------------------------------------------------
# LengthBucketSampler


def padding(batches, lengths) -> int:
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)


@pytest.mark.parametrize(
    "n,batch_size,per_bucket", [(1037, 32, 5), (64, 8, 50), (1, 4, 2), (0, 4, 2)]
)
def test_bucket_sampler_covers_every_index_once(n, batch_size, per_bucket):
    lengths = torch.randint(1, 100, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    for shuffle in (True, False):
        sampler = D.LengthBucketSampler(
            lengths, batch_size, shuffle, torch.Generator().manual_seed(0), per_bucket
        )
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(n))
        assert sum(len(b) < batch_size for b in batches) <= 1  # only one short batch


def test_bucket_sampler_is_deterministic_and_reshuffles():
    lengths = torch.randint(1, 100, (500,), generator=torch.Generator().manual_seed(2)).tolist()

    def epochs(seed):
        sampler = D.LengthBucketSampler(lengths, 16, generator=torch.Generator().manual_seed(seed))
        return list(sampler), list(sampler)

    assert epochs(0) == epochs(0)
    first, second = epochs(0)
    assert first != second  # a new order every epoch
    assert epochs(1)[0] != first
    ordered = list(D.LengthBucketSampler(lengths, 16, shuffle=False))
    flat = [lengths[i] for b in ordered for i in b]
    assert flat == sorted(lengths, reverse=True)


def test_bucket_sampler_reduces_padding():
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(5, 128, (5000,), generator=g).tolist()
    bucketed = list(D.LengthBucketSampler(lengths, 32, generator=g))
    order = torch.randperm(len(lengths), generator=g).tolist()
    random_batches = [order[i : i + 32] for i in range(0, len(order), 32)]
    # Random batches of 32 waste about half their tokens; sorted chunks of 50 batches ~2%.
    assert padding(bucketed, lengths) < 0.1 * padding(random_batches, lengths)


# ---------------------------------------------------------------------------------------
# `make data` without the network (tests/test_fetch.py serves files on 127.0.0.1)


def test_make_data_exit_code(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["datasets.py", "--data_dir", str(tmp_path), "--no_download"])
    assert fetch.main() == 1
    assert "MISSING ids-sst-train.csv" in capsys.readouterr().out
    rows = {
        "sst": ["\tid\tsentence\tsentiment", "0\ta\tgood\t3"],
        "cfimdb": ["\tid\tsentence\tsentiment", "0\ta\tgood\t1"],
        "para": [PAIR_HEADER.format("is_duplicate"), "0\ta\tx\ty\t1.0"],
        "sts": [PAIR_HEADER.format("similarity"), "0\ta\tx\ty\t2.5"],
        "snli": ["premise\thypothesis\tlabel", "p\th\t0"],
    }
    for task, lines in rows.items():
        for split in ("train", "dev") if task == "snli" else ("train", "dev", "test"):
            D.task_file(tmp_path, task, split).write_text("\n".join(lines) + "\n")
    assert fetch.main() == 0
    assert "ok      snli-dev.csv" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# The real data folder (MINBERT_DATA)

README_ROWS = {  # /work/shared/data/README.md
    ("sst", "train"): 8544,
    ("sst", "dev"): 1101,
    ("sst", "test"): 2210,
    ("cfimdb", "train"): 1707,
    ("cfimdb", "dev"): 245,
    ("cfimdb", "test"): 488,
    ("para", "train"): 16182 - 2,  # two rows with an empty label are skipped
    ("para", "dev"): 2017,
    ("para", "test"): 2015,
    ("sts", "train"): 6040,
    ("sts", "dev"): 863,
    ("sts", "test"): 1725,
    ("snli", "train"): 99890,
    ("snli", "dev"): 9824,
}


@pytest.mark.parametrize("task,split", list(README_ROWS))
def test_real_data_row_counts(data_dir, task, split):
    # data_dir (tests/conftest.py) skips when MINBERT_DATA has no data.
    examples, warned = read_quietly(D.read_task, data_dir, task, split, strict=False)
    assert len(examples) == README_ROWS[(task, split)]
    labeled = split != "test"
    assert all((e.label is not None) == labeled for e in examples)
    if (task, split) == ("para", "train"):
        assert len(warned) == 1 and "skipped 2 bad row(s) at line(s) 2077, 11398;" in warned[0]
        assert "empty label" in warned[0]
    else:
        assert warned == []


def handout_preprocess(s: str) -> str:
    """The CS224n handout's preprocess_string, as its datasets.py writes it."""
    s = s.lower().replace(".", " .").replace("?", " ?").replace(",", " ,").replace("'", " '")
    return " ".join(s.split())


def test_real_data_matches_the_handout_reader(data_dir):
    # Independent reference: the handout's csv.DictReader loop; we keep case, it lowercases.
    path = D.task_file(data_dir, "sst", "dev")
    with open(path) as fp:
        ref = [
            (r["id"].lower().strip(), r["sentence"].lower().strip(), int(r["sentiment"].strip()))
            for r in csv.DictReader(fp, delimiter="\t")
        ]
    ours = [(e.id.lower(), e.sentence.lower(), e.label) for e in D.read_sentiment(path, 5)]
    assert ours == ref
    path = D.task_file(data_dir, "para", "dev")
    with open(path) as fp:
        ref = [
            (
                r["id"].lower().strip(),
                handout_preprocess(r["sentence1"]),
                handout_preprocess(r["sentence2"]),
                int(float(r["is_duplicate"])),
            )
            for r in csv.DictReader(fp, delimiter="\t")
        ]
    ours = [
        (e.id, e.sentence1.lower(), e.sentence2.lower(), e.label)
        for e in D.read_pairs(path, "binary")
    ]
    assert ours == ref


# ---------------------------------------------------------------- a run's data and batches


class FakeTok:
    pad_token_id = 0

    def __call__(self, texts, text_pair=None, **kw):
        return {"input_ids": [[2, 7, 3] for _ in texts], "token_type_ids": [[0] * 3 for _ in texts]}


def test_fraction_stage_draws_a_fresh_subset_each_loop():
    pairs = D.PairDataset([D.PairExample(str(i), "a", "b", 0.0) for i in range(200)], FakeTok(), 16)

    def subset(seed):
        loader = D.fraction_loader(pairs, 0.03, 4, torch.Generator().manual_seed(seed))
        return sorted(i for b in loader for i in b["ids"])

    assert len(subset(1)) == 6
    assert subset(1) == subset(1)
    assert subset(1) != subset(2)


def test_round_robin_visits_the_largest_set_once_and_cycles_the_others():
    big = torch.utils.data.DataLoader(list(range(10)), batch_size=2)  # 5 batches
    small = torch.utils.data.DataLoader(list(range(100, 104)), batch_size=2)  # 2 batches
    for order in ("fixed", "random"):
        batches = D.MultiTaskBatches(
            {"a": big, "b": small}, "round_robin", order, torch.Generator().manual_seed(0)
        )
        steps = list(batches)
        assert len(steps) == len(batches) == 10 and all(len(s) == 1 for s in steps)
        seen = {t: [x for s in steps for tt, b in s if tt == t for x in b.tolist()] for t in "ab"}
        assert sorted(seen["a"]) == list(range(10))  # every example of the largest, once
        assert sorted(seen["b"]) == sorted(list(range(100, 104)) * 2 + [100, 101])  # cycled
    simultaneous = list(D.MultiTaskBatches({"a": big, "b": small}, "simultaneous"))
    assert len(simultaneous) == 5 and all([t for t, _ in s] == ["a", "b"] for s in simultaneous)


def test_standardized_indices_sample_or_repeat():
    g = torch.Generator().manual_seed(0)
    down = D.standardized_indices(10, 4, g)
    assert len(set(down)) == 4 and all(0 <= i < 10 for i in down)
    up = D.standardized_indices(3, 8, g)
    assert len(up) == 8 and sorted(up[:6]) == [0, 0, 1, 1, 2, 2]  # whole passes first


def test_only_trained_tasks_read_their_training_sets(tiny_env):
    from config import DataConfig
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


def test_a_skipped_rows_warning_prints_as_one_plain_line():
    import warnings

    message = "data/x.csv: skipped 1 bad row(s) at line(s) 3; first: line 3: empty label"
    shown = warnings.formatwarning(message, D.DataWarning, "datasets.py", 300, "code()")
    assert shown == f"warning: {message}\n"
    other = warnings.formatwarning("careful", UserWarning, "x.py", 7, "code()")
    assert other.startswith("x.py:7: UserWarning: careful") and "code()" in other


class RecordedBar:
    """A stand-in for tqdm that records what a progress bar was told."""

    made: list = []

    def __init__(self, iterable=None, **kwargs):
        self.iterable, self.kwargs, self.done = iterable, kwargs, 0
        RecordedBar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n):
        self.done += n


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
