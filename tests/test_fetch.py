"""`make data` end to end against a stand-in server on 127.0.0.1: the handout's files and
an SNLI-1.0-shaped zip built here, a cut-short download, a server error, a corrupt zip;
then a run trains on what was fetched. No test goes online."""

import http.server
import json
import threading
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import datasets as D
from commands import command
from conftest import write_tiny_data
from helpers import tiny_flags
from lab import fetch

LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}


class Handler(http.server.SimpleHTTPRequestHandler):
    """Files of the served folder; /error/... answers 500; /html/... a web page; /short/...
    announces more bytes than it sends, then hangs up."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.startswith("/error/"):
            return self.send_error(500, "stand-in failure")
        if self.path.startswith("/html/"):  # a login or rate-limit page, status 200
            body = b"<!DOCTYPE html>\n<html><body>Please sign in</body></html>\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        if self.path.startswith("/short/"):
            body = (Path(self.directory) / self.path.removeprefix("/short/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return None
        return super().do_GET()

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server(tmp_path):
    """A folder served on 127.0.0.1: handout/ (the CS224n files but SNLI), snli_1.0.zip
    (SNLI 1.0's layout, rows with and without a gold label), bad.zip (a corrupt member).
    Yields (base address, source folder, the zip's expected rows)."""
    source = write_tiny_data(tmp_path / "tiny")
    served = tmp_path / "served"
    (served / "handout").mkdir(parents=True)
    for f in source.glob("*.csv"):
        if not f.name.startswith("snli"):
            (served / "handout" / f.name).write_bytes(f.read_bytes())
    expected = {}
    members = {}
    for split, member in fetch.SNLI_MEMBERS.items():
        rows = [
            line.split("\t") for line in (source / f"snli-{split}.csv").read_text().splitlines()[1:]
        ]
        rows[0][0] = 'A "quoted"\tpremise'  # a quote and a tab, as real sentences may hold
        rows[1][1] = "two  spaces"  # kept as they are, as SNLI's own files keep them
        lines, kept = [], []
        for i, (premise, hypothesis, label) in enumerate(rows):
            gold = "-" if i % 5 == 4 else LABELS[int(label)]  # every fifth: no gold label
            lines.append(
                json.dumps({"gold_label": gold, "sentence1": premise, "sentence2": hypothesis})
            )
            if gold != "-":
                kept.append((premise.replace("\t", " "), hypothesis, int(label)))
        members[member], expected[split] = "\n".join(lines) + "\n", kept
    with zipfile.ZipFile(served / "snli_1.0.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            z.writestr(name, text)
    with zipfile.ZipFile(served / "bad.zip", "w", zipfile.ZIP_STORED) as z:
        for name, text in members.items():
            z.writestr(name, text)
    with zipfile.ZipFile(served / "train-only.zip", "w") as z:  # the test split missing
        train = fetch.SNLI_MEMBERS["train"]
        z.writestr(train, members[train])
    np.save(served / "optimizer_test.npy", np.ones((2, 3)))  # the handout's references
    torch.save({"pooler_output": torch.zeros(2, 4)}, served / "sanity_check.data")
    raw = bytearray((served / "bad.zip").read_bytes())
    at = raw.index(b"gold_label")  # a stored member's bytes: flip one, its CRC no longer holds
    raw[at] ^= 0x20
    (served / "bad.zip").write_bytes(bytes(raw))
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(Handler, directory=str(served))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", source, expected
    httpd.shutdown()


def point_at(monkeypatch, handout, snli):
    monkeypatch.setenv("MINBERT_HANDOUT_URL", handout)
    monkeypatch.setenv("MINBERT_SNLI_URL", snli)


def test_make_data_fetches_every_file_and_builds_snli(server, tmp_path, monkeypatch, capsys):
    base, source, expected = server
    point_at(monkeypatch, f"{base}/handout/", f"{base}/snli_1.0.zip")
    folder = tmp_path / "data"
    monkeypatch.setattr("sys.argv", ["lab/fetch.py", "--data_dir", str(folder)])
    assert fetch.main() == 0
    out = capsys.readouterr().out
    assert f"from {base}/handout/ids-sst-train.csv" in out and f"from {base}/snli_1.0.zip" in out
    for name in D.expected_files():
        if not name.startswith("snli"):
            assert (folder / name).read_bytes() == (source / name).read_bytes(), name
    for split in ("train", "dev"):
        got = [
            (e.premise, e.hypothesis, e.label) for e in D.read_snli(folder / f"snli-{split}.csv")
        ]
        assert got == expected[split] and len(got) > 10
    assert got[0][0] == 'A "quoted" premise'  # the tab became a space
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*D.expected_files(), *fetch.REFERENCES]
    )  # no zip, no .part
    assert (folder / "optimizer_test.npy").read_bytes() == (
        source.parent / "served" / "optimizer_test.npy"
    ).read_bytes()
    monkeypatch.setattr("sys.argv", ["lab/fetch.py", "--data_dir", str(folder), "--quiet"])
    point_at(monkeypatch, "http://127.0.0.1:9/", "http://127.0.0.1:9/x.zip")  # nothing to fetch
    assert fetch.main() == 0 and capsys.readouterr().out == ""


def test_snli_train_is_the_first_rows_of_the_release(server, tmp_path, monkeypatch):
    base, _, expected = server
    point_at(monkeypatch, f"{base}/handout/", f"{base}/snli_1.0.zip")
    monkeypatch.setattr(fetch, "SNLI_TRAIN_ROWS", 10)  # 10 lines of which 2 have no gold label
    fetch.fetch_snli(tmp_path, timeout=5)
    train = D.read_snli(tmp_path / "snli-train.csv")
    assert [(e.premise, e.hypothesis, e.label) for e in train] == expected["train"][:8]
    monkeypatch.setattr("sys.argv", ["lab/fetch.py", "--data_dir", str(tmp_path), "--snli_all"])
    assert fetch.main() == 0  # the handout's files fetched, SNLI rebuilt from all of train
    train = D.read_snli(tmp_path / "snli-train.csv")
    assert [(e.premise, e.hypothesis, e.label) for e in train] == expected["train"]
    assert len(expected["train"]) > 8


@pytest.mark.parametrize(
    "handout,snli,says",
    [
        ("{base}/short/handout/", "{base}/snli_1.0.zip", "download was cut short"),
        ("{base}/handout/", "{base}/short/snli_1.0.zip", "download was cut short"),
        ("{base}/error/handout/", "{base}/snli_1.0.zip", "(HTTP 500)"),
        ("{base}/handout/", "{base}/error/snli_1.0.zip", "(HTTP 500)"),
        ("{base}/handout/", "{base}/bad.zip", "fails its CRC check"),
        ("{base}/handout/", "{base}/handout/ids-sst-dev.csv", "not the SNLI 1.0 release"),
        ("{base}/handout/", "{base}/train-only.zip", "not the SNLI 1.0 release"),
        (
            "{base}/html/handout/",
            "{base}/snli_1.0.zip",
            "ids-sst-train.csv is not the handout's file",
        ),
        ("127.0.0.1/handout/", "{base}/snli_1.0.zip", "expected an http(s):// or file: address"),
    ],
    ids=[
        "short-file",
        "short-zip",
        "error-file",
        "error-zip",
        "corrupt-zip",
        "not-a-zip",
        "no-test-split",
        "web-page",
        "no-scheme",
    ],
)
def test_a_failed_fetch_says_why_and_leaves_nothing_half_written(
    server, tmp_path, monkeypatch, capsys, handout, snli, says
):
    base, _, _ = server
    point_at(monkeypatch, handout.format(base=base), snli.format(base=base))
    folder = tmp_path / "data"
    missing = fetch.fetch_missing(folder, timeout=5)
    assert says in capsys.readouterr().out
    assert missing and not list(folder.glob("*.part")) and not list(folder.glob("*.zip"))
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # staging, archive
    for task in D.FILE_STEMS:  # every task whole or absent: a half task is never fetched again
        splits = D.SPLITS[:2] if task == "snli" else D.SPLITS
        present = [D.task_file(folder, task, s).is_file() for s in splits]
        assert all(present) or not any(present), task
    for name in D.expected_files():  # every file there is whole
        if (folder / name).is_file():
            assert name not in missing
            D.read_task(folder, *task_and_split(name))


def task_and_split(name: str) -> tuple[str, str]:
    for task in D.FILE_STEMS:
        for split in D.SPLITS:
            try:
                if D.task_file(".", task, split).name == name:
                    return task, split
            except ValueError:
                continue
    raise AssertionError(name)


def test_a_run_trains_on_what_make_data_fetched(server, tmp_path, monkeypatch, tiny_env):
    """A newcomer's path: no data folder, a server standing in for the handout and SNLI;
    fetch, then train a plan that reads SNLI (held-out pairs) and print its table."""
    base, _, _ = server
    point_at(monkeypatch, f"{base}/handout/", f"{base}/snli_1.0.zip")
    folder = tmp_path / "fresh"
    assert fetch.fetch_missing(folder, timeout=5) == []
    bert_dir, _ = tiny_env
    flags = "--batch_size 8 --loops 1 --max_length 64 --heldout_size 20 --no_test_predictions"
    command.main(tiny_flags((bert_dir, folder), tmp_path / "run", flags))
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 5 and "heldout" in json.loads(rows[-1])


def test_only_whole_missing_tasks_are_fetched(server, tmp_path, monkeypatch, capsys):
    """A task with any file present is left alone: mixing sources would leak (a mirror's
    quora-train.csv is cut from the handout's quora-dev.csv)."""
    base, _, _ = server
    point_at(monkeypatch, f"{base}/handout/", f"{base}/snli_1.0.zip")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "quora-train.csv").write_text("from a mirror")
    missing = fetch.fetch_missing(folder, timeout=5)
    assert missing == ["quora-dev.csv", "quora-test-student.csv"]
    assert (folder / "quora-train.csv").read_text() == "from a mirror"
    assert "quora" not in capsys.readouterr().out


def test_an_unreachable_source_stops_the_fetching_at_once(tmp_path, monkeypatch, capsys):
    point_at(monkeypatch, "http://127.0.0.1:9/data/", "http://127.0.0.1:9/snli_1.0.zip")
    assert fetch.fetch_missing(tmp_path, timeout=5) == D.expected_files()
    out = capsys.readouterr().out
    assert out.count("offline?") == 1 and "downloaded" not in out
    assert list(tmp_path.iterdir()) == []


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "data").write_text("")
    with pytest.raises(SystemExit):
        fetch.main(["--data_dir", str(tmp_path / "data"), "--no_download"])
    assert f"data folder {tmp_path / 'data'} is a file" in capsys.readouterr().err


def test_the_handouts_references_are_optional_and_checked(server, tmp_path, monkeypatch, capsys):
    base, source, _ = server
    folder = tmp_path / "data"
    folder.mkdir()
    for f in source.glob("*.csv"):  # every data file there: only the references are missing
        (folder / f.name).write_bytes(f.read_bytes())
    point_at(monkeypatch, f"{base}/html/handout/", f"{base}/snli_1.0.zip")  # a login page
    assert fetch.main(["--data_dir", str(folder), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"optimizer_test.npy: {base}/html/optimizer_test.npy is not the handout's file" in out
    assert not (folder / "optimizer_test.npy").exists()
    point_at(monkeypatch, f"{base}/nowhere/handout/", f"{base}/snli_1.0.zip")  # not served
    assert fetch.main(["--data_dir", str(folder), "--quiet"]) == 0  # optional: still 0
    assert "sanity_check.data: not fetched from" in capsys.readouterr().out
    point_at(monkeypatch, f"{base}/handout/", f"{base}/snli_1.0.zip")
    assert fetch.main(["--data_dir", str(folder), "--quiet"]) == 0
    assert all((folder / name).is_file() for name in fetch.REFERENCES)
