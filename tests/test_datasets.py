"""datasets.py's readers: hand-written fixture files, good rows and bad rows one kind at a time,
`make data` without the network, and the real data folder against the handout's reader."""

import csv
import re
import warnings

import pytest

import datasets as D
from engine.tsv import DataWarning
from lab import fetch


def write(tmp_path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_quietly(fn, *args, **kwargs):
    """Call a reader; return (result, list of DataWarning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, DataWarning)]


SST_HEADER = "\tid\tsentence\tsentiment"


PAIR_HEADER = "\tid\tsentence1\tsentence2\t{}"


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


def test_a_test_row_is_never_skipped(tmp_path):
    """The handout's reader keeps every test row: an empty sentence is predicted (as
    [CLS] [SEP]) and a repeated id gets a row each, said in one line; a row that cannot
    be read stops, strict or not, since its id would get no prediction."""
    rows = ["\tid\tsentence1\tsentence2", "0\tt1\ta\t ", "1\tt2\tb\tc", "2\tt1\td\te"]
    path = write(tmp_path, "quora-test-student.csv", rows)
    got, warned = read_quietly(D.read_pairs, path, "binary")
    assert [(e.id, e.sentence2) for e in got] == [("t1", ""), ("t2", "c"), ("t1", "e")]
    assert len(warned) == 1 and "predicted as the handout predicts them" in warned[0]
    assert "1 empty text at line(s) 2; 1 repeated id at line(s) 4" in warned[0]
    assert D.read_pairs(path, "binary", strict=True) == got
    sst = write(tmp_path, "sst-test.csv", ["\tid\tsentence", "0\ts1\t", "1\t\tno id"])
    with pytest.raises(D.DataError, match=r":3: empty id; expected text; a test row is never"):
        D.read_sentiment(sst, 5)
    labeled = [f"{row}\t1" for row in rows[1:]]
    dev = write(tmp_path, "quora-dev.csv", [PAIR_HEADER.format("is_duplicate"), *labeled])
    assert [e.id for e in read_quietly(D.read_pairs, dev, "binary")[0]] == ["t2", "t1"]  # dev


def test_read_snli(tmp_path):
    path = write(
        tmp_path, "snli.csv", ["premise\thypothesis\tlabel", "A dog runs.\tAn animal moves.\t0"]
    )
    assert D.read_snli(path) == [D.NLIExample("A dog runs.", "An animal moves.", 0)]


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


def test_a_skipped_rows_warning_prints_as_one_plain_line():
    import warnings

    message = "data/x.csv: skipped 1 bad row(s) at line(s) 3; first: line 3: empty label"
    shown = warnings.formatwarning(message, DataWarning, "datasets.py", 300, "code()")
    assert shown == f"warning: {message}\n"
    other = warnings.formatwarning("careful", UserWarning, "x.py", 7, "code()")
    assert other.startswith("x.py:7: UserWarning: careful") and "code()" in other
