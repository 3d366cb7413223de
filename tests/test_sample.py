"""lab.sample, the data copy `make submit-demo` runs on: each file's header and first rows
byte for byte, a quoted field over two lines and the real files' bad rows kept in their
rows; a run on it predicts, and prepare_submit.py checks, every id of the copy."""

import subprocess
import sys
import warnings

import pytest

import datasets as data
from commands import command
from conftest import add_real_bad_rows
from engine.tsv import DataWarning
from evaluation import MULTITASK
from helpers import a_clone, tiny_flags
from lab import sample

TWO_LINES = '7\tquoratrain-twolines\t"a question\nover two lines"\tgood day\t1\n'


def test_the_copy_is_each_files_head_as_the_handouts_reader_reads_it(tiny_env, tmp_path):
    source = add_real_bad_rows(tiny_env[1])
    train = source / "quora-train.csv"
    header, *rows = train.read_text().splitlines(keepends=True)
    train.write_text(header + TWO_LINES + "".join(rows))
    out = sample.main([str(tmp_path / "copy"), "--rows", "3", "--data_dir", str(source)])
    assert (out / "quora-train.csv").read_text() == header + TWO_LINES + "".join(rows[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        for task in data.FILE_STEMS:
            for split in data._TASK_SPLITS[task]:
                kept = data.read_task(out, task, split)
                assert kept == data.read_task(source, task, split)[: len(kept)] and kept
    test_rows = (out / "quora-test-student.csv").read_text().count("\n")
    assert test_rows == 4  # the header and 3 rows, whatever the source's length


def test_the_empty_sst_test_row_is_kept_among_the_rows(tiny_env, tmp_path):
    source = add_real_bad_rows(tiny_env[1])
    path = source / "ids-sst-test-student.csv"
    header, *rows = path.read_text().splitlines(keepends=True)
    path.write_text(header + rows[-1] + "".join(rows[:-1]))  # the empty sentence first
    out = sample.main([str(tmp_path / "copy"), "--rows", "2", "--data_dir", str(source)])
    kept = data.read_task(out, "sst", "test")
    assert [e.id for e in kept] == ["ids-ssttest-empty", "ids-ssttest-student0"]


@pytest.mark.parametrize(
    ("args", "says"), [(["--rows", "0"], "--rows must be at least 1"), ([], "the data folder")]
)
def test_a_copy_over_its_source_or_of_no_rows_is_refused(tiny_env, args, says):
    done = subprocess.run(
        [sys.executable, "-m", "lab.sample", str(tiny_env[1]), "--data_dir", str(tiny_env[1])]
        + args,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stderr


def test_the_demos_way_predicts_and_checks_every_id_of_the_copy(tiny_env, tmp_path):
    copy = sample.main([str(tmp_path / "copy"), "--rows", "5", "--data_dir", str(tiny_env[1])])
    run_dir = tmp_path / "run"
    flags = tiny_flags((tiny_env[0], copy), run_dir, "--preset handout --epochs 1 --seed 0")
    command.main(flags + ["--max_length", "64", "--option", "finetune"])
    clone = a_clone(tmp_path)
    done = subprocess.run(
        [sys.executable, "prepare_submit.py", str(run_dir), "--data_dir", str(copy)],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for task in MULTITASK:
        path = clone / "predictions" / f"{task}-test-output.csv"
        assert path.read_text().count("\n") == 1 + 5  # the header and the copy's 5 ids
