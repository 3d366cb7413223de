"""grader/leaderboard.py, the course's leaderboard on Gradescope: a real run's predictions
score as sklearn's accuracy and scipy's Pearson r say, by CS224n's overall formula; each
missing or malformed file scores its task 0, named with its line; a bad gold file stops the
build; the archive's run_autograder writes results.json in Gradescope's layout."""

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score

import datasets as data
import exercises
import leaderboard as lb
from commands import command
from commands.outputs import read_predictions
from conftest import tiny_bert_config, write_tiny_checkpoint, write_tiny_data
from helpers import tiny_flags

ROWS = 40  # rows of each mirror dev file in the gold set
RUN_ROWS = 60  # dev rows the run predicts: the gold ids are the first ROWS of them
TINY = "--batch_size 8 --lr 1e-3 --seed 0 --loops 1 --max_length 64 --no_test_predictions"
BOARD = ["Overall", "SST accuracy", "QQP accuracy", "STS Pearson"]


def head(src: Path, dst: Path, rows: int) -> None:
    """The header and the first `rows` rows of a data file."""
    lines = src.read_text(encoding="utf-8").split("\n")[: rows + 1]
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")


def gold_files(data_dir: Path, folder: Path) -> Path:
    """The TA's gold files: the first ROWS rows of the mirror's dev files, renamed."""
    for task in lb.TASKS:
        head(data_dir / f"{task.files}-dev.csv", folder / task.gold, ROWS)
    return folder


@pytest.fixture(scope="module")
def gold(data_dir, tmp_path_factory) -> Path:
    return gold_files(data_dir, tmp_path_factory.mktemp("gold"))


@pytest.fixture(scope="module")
def run_predictions(data_dir, tmp_path_factory) -> Path:
    """The predictions folder of a real run: the tiny BERT, one loop on the tiny training
    data, scoring the first RUN_ROWS rows of the mirror's dev files (a few seconds)."""
    root = tmp_path_factory.mktemp("run")
    folder = write_tiny_data(root / "data")
    for task in lb.TASKS:
        head(data_dir / f"{task.files}-dev.csv", folder / f"{task.files}-dev.csv", RUN_ROWS)
    bert = write_tiny_checkpoint(root / "bert", tiny_bert_config())
    command.main(tiny_flags((bert, folder), root / "run", TINY))
    return root / "run" / "predictions"


def gold_labels(gold: Path, task: lb.Task) -> dict[str, float]:
    """The reference: a gold file read as the handout's reader reads it (csv.DictReader)."""
    with (gold / task.gold).open(encoding="utf-8") as f:
        return {r["id"].strip(): float(r[task.label]) for r in csv.DictReader(f, delimiter="\t")}


def perfect(folder: Path, gold: Path) -> Path:
    """A submission predicting every gold label in predictions/, as the handout writes them
    (SST classes, QQP's 1.0 / 0.0, STS scores)."""
    for task in lb.TASKS:
        labels = gold_labels(gold, task)
        rows = [f"{i} , {int(y) if task.key == 'sst' else y} " for i, y in labels.items()]
        path = folder / "predictions" / task.output
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([f"id \t {task.column} ", *rows]) + "\n")
    return folder


def edit(path: Path, change) -> None:
    """Rewrite a file's lines (split at newlines only) with change(lines)."""
    lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    path.write_text("\n".join(change(lines)) + "\n", encoding="utf-8")


def set_field(lines: list[str], n: int, column: str, value: str) -> list[str]:
    """The lines with line n's field `column` (found by the header) set to value."""
    at = lines[0].split("\t").index(column)
    row = lines[n - 1].split("\t")
    row[at] = value
    return [*lines[: n - 1], "\t".join(row), *lines[n:]]


def test_a_real_runs_predictions_score_as_sklearn_and_scipy_say(run_predictions, gold, tmp_path):
    """The run's dev predictions, renamed as test outputs and kept to the gold ids."""
    submission = tmp_path / "submission"
    (submission / "predictions").mkdir(parents=True)
    reference = {}
    for task in lb.TASKS:
        labels = gold_labels(gold, task)
        lines = (run_predictions / f"{task.key}-dev-output.csv").read_text().splitlines()
        kept = [line for line in lines[1:] if line.split(",")[0].strip() in labels]
        (submission / "predictions" / task.output).write_text("\n".join([lines[0], *kept]) + "\n")
        ids, preds = read_predictions(submission / "predictions" / task.output)
        assert sorted(ids) == sorted(labels) and len(lines) == RUN_ROWS + 1
        by_id = dict(zip(ids, preds, strict=True))
        y, p = list(labels.values()), [by_id[i] for i in labels]
        if task.classes:
            reference[task.name] = accuracy_score([int(v) for v in y], [int(v) for v in p])
        else:
            assert len(set(p)) > 1  # a constant prediction would make r 0 whatever the code
            reference[task.name] = pearsonr(p, y).statistic
    results = lb.score(submission, gold)
    scores = {t["name"].split(":")[0]: t["score"] for t in results["tests"]}
    assert scores["SST"] == pytest.approx(reference["SST"], abs=1e-12)
    assert scores["QQP"] == pytest.approx(reference["QQP"], abs=1e-12)
    assert scores["STS"] == pytest.approx((reference["STS"] + 1) / 2, abs=1e-9)
    overall = (reference["SST"] + reference["QQP"] + (reference["STS"] + 1) / 2) / 3
    assert results["score"] == pytest.approx(overall, abs=1e-9)
    board = {e["name"]: e["value"] for e in results["leaderboard"]}
    assert list(board) == BOARD
    expected = [overall, reference["SST"], reference["QQP"], reference["STS"]]
    assert list(board.values()) == pytest.approx(expected, abs=5e-5)  # rounded to 4 places
    assert [t["status"] for t in results["tests"]] == ["passed"] * 3
    assert f"Overall {overall:.4f} = (SST " in results["output"]


def test_perfect_predictions_score_one(gold, tmp_path):
    results = lb.score(perfect(tmp_path, gold), gold)
    assert results["score"] == pytest.approx(1.0, abs=1e-12)
    assert [e["value"] for e in results["leaderboard"]] == [1.0] * 4
    assert [t["max_score"] for t in results["tests"]] == [1] * 3
    assert results["visibility"] == "visible" and results["stdout_visibility"] == "hidden"
    json.dumps(results, allow_nan=False)  # Gradescope's JSON has no NaN


def test_a_missing_file_scores_its_task_zero_and_is_named(gold, tmp_path):
    submission = perfect(tmp_path, gold)
    (submission / "predictions" / "para-test-output.csv").unlink()
    results = lb.score(submission, gold)
    assert results["score"] == pytest.approx(2 / 3)
    assert [t["status"] for t in results["tests"]] == ["passed", "failed", "passed"]
    assert "QQP: no para-test-output.csv in the submission; expected one" in results["output"]
    assert results["leaderboard"][2] == {"name": "QQP accuracy", "value": 0.0}


def cut(n):
    """Drop line n."""
    return lambda lines: [*lines[: n - 1], *lines[n:]]


def value_at(n, value):
    """Line n's prediction set to value."""
    return lambda lines: [*lines[: n - 1], f"{lines[n - 1].split(',')[0]}, {value}", *lines[n:]]


def every_value(value):
    """Every prediction set to value."""
    return lambda lines: [lines[0]] + [f"{line.split(',')[0]}, {value}" for line in lines[1:]]


# case: (task, the file's lines -> malformed lines, what the output says after the file name)
MALFORMED = {
    "header": (
        "sst",
        lambda lines: ["id \t Predicted_Sentiments ", *lines[1:]],
        ":1: header 'id \\t Predicted_Sentiments '; expected 'id \\t Predicted_Sentiment '",
    ),
    "nan": ("sts", value_at(3, "nan"), ":3: '{lines[2]}'; expected 'id , a finite number'"),
    "class out of range": (
        "sst",
        value_at(4, 5),
        ":4: '{lines[3]}'; expected 'id , one of [0, 1, 2, 3, 4]'",
    ),
    "no comma": (
        "para",
        lambda lines: [*lines[:5], "just-an-id 1.0"],
        ":6: 'just-an-id 1.0'; expected 'id , one of [0, 1]'",
    ),
    "duplicate id": (
        "para",
        lambda lines: [*lines, lines[1]],
        f":{ROWS + 2}: id '{{first}}' again (line 2); expected 1 time(s), as the test file has it",
    ),
    "a long line": (
        "sts",
        value_at(5, "x" * 500),
        ":5: '{lines[4]:.80}'; expected 'id , a finite number'",  # cut to 80 characters
    ),
    "a long header": (
        "sst",
        lambda lines: ["id \t " + "x" * 500, *lines[1:]],
        ":1: header "
        + repr(("id \t " + "x" * 500)[:80])
        + "; expected 'id \\t Predicted_Sentiment '",
    ),
    "missing id": (
        "sts",
        cut(2),
        ": no line for 1 test id(s), the first '{first}'; expected one for every row of the test file",
    ),
    "extra id": (
        "sst",
        lambda lines: [*lines, "not-a-test-id , 2"],
        f":{ROWS + 2}: id 'not-a-test-id' is not a test id; expected only the test's",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_file_scores_zero_naming_its_line(case, gold, tmp_path):
    key, change, said = MALFORMED[case]
    submission = perfect(tmp_path, gold)
    path = submission / "predictions" / f"{key}-test-output.csv"
    first = path.read_text().splitlines()[1].split(",")[0].strip()
    edit(path, change)
    results = lb.score(submission, gold)
    graded = {t["name"].split(":")[0].lower(): t for t in results["tests"]}
    failed = graded.pop({"sst": "sst", "para": "qqp", "sts": "sts"}[key])
    assert failed["status"] == "failed" and failed["score"] == 0
    assert all(t["status"] == "passed" and t["score"] == 1 for t in graded.values())
    assert results["score"] == pytest.approx(2 / 3)
    lines = path.read_text().splitlines()
    said = f"predictions/{key}-test-output.csv{said.format(first=first, lines=lines)}"
    assert said in failed["output"].splitlines() and said in results["output"].splitlines()


def test_a_repeated_test_id_is_scored_row_by_row_and_lone_crs_are_line_ends(gold, tmp_path):
    """A gold file that repeats an id (the handout's test files do): prepare_submit.py writes
    a prediction per row, and the k-th line of that id is scored against its k-th row; a
    file whose lines end in lone CRs reads as the same lines."""
    folder = shutil.copytree(gold, tmp_path / "gold")
    sst = folder / "ids-sst-test.csv"
    lines = sst.read_text().splitlines()
    again = lines[1].split("\t")
    at = lines[0].split("\t").index("sentiment")
    label = again[at]
    again[at] = str((int(float(label)) + 2) % 5)  # the same id, another label
    sst.write_text("\n".join([*lines, "\t".join(again)]) + "\n")
    submission = perfect(tmp_path / "sub", folder)
    out = submission / "predictions" / "sst-test-output.csv"
    rows = out.read_text().splitlines()
    first = rows[1].split(",")[0].strip()
    rows[1] = f"{first} , {label} "  # its first row's label (perfect() read the gold by id)
    rows.append(f"{first} , {again[at]} ")  # its second row's label, as its second line
    out.write_text("\r".join(rows) + "\r")  # lone CRs
    results = lb.score(submission, folder)
    assert results["tests"][0]["status"] == "passed" and results["tests"][0]["score"] == 1
    swapped = [rows[0], rows[-1], *rows[2:-1], rows[1]]  # the two lines of that id swapped
    out.write_text("\n".join(swapped) + "\n")
    assert lb.score(submission, folder)["tests"][0]["score"] < 1


def test_a_constant_sts_prediction_gives_r_zero_and_says_so(gold, tmp_path):
    submission = perfect(tmp_path, gold)
    edit(submission / "predictions" / "sts-test-output.csv", every_value(2.5))
    results = lb.score(submission, gold)
    assert results["tests"][2]["status"] == "passed" and results["tests"][2]["score"] == 0.5
    assert results["leaderboard"][3] == {"name": "STS Pearson", "value": 0.0}
    assert results["score"] == pytest.approx((1 + 1 + 0.5) / 3)
    said = "predictions/sts-test-output.csv: every prediction is 2.5; Pearson r is undefined"
    assert said in results["output"]


def test_a_file_in_two_folders_is_graded_by_its_shorter_path(gold, tmp_path):
    submission = perfect(tmp_path, gold)
    stale = submission / "old" / "predictions" / "sst-test-output.csv"
    stale.parent.mkdir(parents=True)
    shutil.copy(submission / "predictions" / "sst-test-output.csv", stale)
    edit(stale, every_value(0))
    results = lb.score(submission, gold)
    assert results["score"] == pytest.approx(1.0)
    assert (
        "sst-test-output.csv is there 2 times: graded predictions/sst-test-output.csv, "
        "the shortest path, not old/predictions/sst-test-output.csv"
    ) in results["output"]


def test_a_folders_name_reaches_the_output_as_text_in_valid_unicode(gold, tmp_path):
    """A folder named in HTML with undecodable bytes: shown as text, its bytes as escapes."""
    submission = perfect(tmp_path, gold)
    odd = submission / os.fsdecode(b"<b>old\xff") / "sst-test-output.csv"
    odd.parent.mkdir()
    shutil.copy(submission / "predictions" / "sst-test-output.csv", odd)
    out = tmp_path / "results.json"
    lb.main(["score", "--submission", str(submission), "--gold", str(gold), "--results", str(out)])
    results = json.loads(out.read_bytes().decode("utf-8", errors="strict"))
    assert results["output_format"] == results["test_output_format"] == "text"
    assert "<b>old\\udcff/sst-test-output.csv" in results["output"]


def test_a_link_out_of_the_submission_is_not_read(gold, tmp_path):
    """A link to the gold file would show its lines in the output: it is not graded."""
    submission = perfect(tmp_path / "submission", gold)
    (submission / "predictions" / "sst-test-output.csv").unlink()
    (submission / "predictions" / "sst-test-output.csv").symlink_to(gold / "ids-sst-test.csv")
    results = lb.score(submission, gold)
    assert results["tests"][0]["status"] == "failed"
    assert "SST: no sst-test-output.csv in the submission; expected one" in results["output"]
    assert "sentence" not in results["output"]


# case: (gold file, its lines -> bad lines, the one line build stops with after the file name)
BAD_GOLD = {
    "sst class 7": (
        "ids-sst-test.csv",
        lambda lines: set_field(lines, 2, "sentiment", "7"),
        ":2: sentiment '7'; expected one of [0, 1, 2, 3, 4]",
    ),
    "quora without a label": (
        "quora-test.csv",
        lambda lines: set_field(lines, 3, "is_duplicate", ""),
        ":3: is_duplicate ''; expected one of [0, 1]",
    ),
    "sts nan": (
        "sts-test.csv",
        lambda lines: set_field(lines, 4, "similarity", "nan"),
        ":4: similarity 'nan'; expected a number from 0 to 5",
    ),
    "sts over 5": (
        "sts-test.csv",
        lambda lines: set_field(lines, 5, "similarity", "5.5"),
        ":5: similarity '5.5'; expected a number from 0 to 5",
    ),
    "empty id": (
        "quora-test.csv",
        lambda lines: set_field(lines, 6, "id", " "),
        ":6: id ''; expected one word, no space or comma",
    ),
    "header": (
        "quora-test.csv",
        lambda lines: [lines[0].replace("is_duplicate", "label"), *lines[1:]],
        ":1: header ['', 'id', 'sentence1', 'sentence2', 'label']; expected the dev file's, "
        "with 'id' and 'is_duplicate'",
    ),
    "a line too long": (
        "sts-test.csv",
        lambda lines: set_field(lines, 3, "sentence1", "x" * 100_001),
        ":3: a line over 100,000 characters; expected a row",
    ),
    "missing file": ("sts-test.csv", None, ": no such file; expected the STS test set with its"),
}


@pytest.mark.parametrize("case", list(BAD_GOLD))
def test_build_refuses_a_bad_gold_file_naming_its_line(case, gold, tmp_path):
    name, change, said = BAD_GOLD[case]
    folder = shutil.copytree(gold, tmp_path / "gold")
    with (folder / name).open(encoding="utf-8") as f:
        first = next(csv.DictReader(f, delimiter="\t"))["id"]
    if change is None:
        (folder / name).unlink()
    else:
        edit(folder / name, change)
    out = tmp_path / "leaderboard.zip"
    with pytest.raises(SystemExit) as stop:
        lb.build(out, folder)
    assert str(stop.value).startswith(f"{folder / name}{said.format(first=first)}")
    assert "\n" not in str(stop.value) and not out.exists()


def test_the_gold_reader_reads_the_full_dev_files_as_datasets_py_does(data_dir, tmp_path):
    """The mirror's whole dev files as gold: the labels datasets.py reads, id for id."""
    for task in lb.TASKS:
        (tmp_path / task.gold).symlink_to(data_dir / f"{task.files}-dev.csv")
        examples = data.read_task(data_dir, task.key, "dev", strict=True)
        assert lb.read_gold(tmp_path, task) == [(e.id, e.label) for e in examples]


def autograde(root: Path) -> dict:
    """Gradescope's run: its run_autograder with bash, in a bare environment."""
    env = {"PATH": os.environ["PATH"], "AUTOGRADER_ROOT": str(root)}
    done = subprocess.run(
        ["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_the_archive_writes_results_in_gradescopes_layout(gold, tmp_path):
    with pytest.raises(SystemExit, match=re.escape("a Gradescope autograder is a .zip file")):
        lb.build(tmp_path / "leaderboard.tar", gold)
    out = tmp_path / "leaderboard.zip"
    exercises.main(["leaderboard", str(out), "--gold", str(gold)])  # the TA's command
    root = tmp_path / "autograder"  # as Gradescope lays out /autograder
    with zipfile.ZipFile(out) as z:
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
        z.extractall(root / "source")
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    gold_files = [f"gold/{t.gold}" for t in lb.TASKS]
    assert sorted(modes) == sorted(["setup.sh", "run_autograder", "leaderboard.py", *gold_files])
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    perfect(root / "submission", gold)
    results = autograde(root)
    assert [e["name"] for e in results["leaderboard"]] == BOARD
    assert [e["value"] for e in results["leaderboard"]] == [1.0] * 4
    shutil.rmtree(root / "submission" / "predictions")  # nothing submitted: still results
    results = autograde(root)
    assert results["score"] == 0 and [t["status"] for t in results["tests"]] == ["failed"] * 3
    assert [e["value"] for e in results["leaderboard"]] == [0.0, 0.0, 0.0, -1.0]


def test_the_scorer_imports_only_the_standard_library():
    """It runs in Gradescope's image, where nothing is installed, without the project."""
    tree = ast.parse(Path(lb.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names and {n.split(".")[0] for n in names} <= sys.stdlib_module_names
