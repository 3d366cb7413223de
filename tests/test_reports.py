"""lab/reports.py: the reports' presets train end to end, and their tables are written and
resumed (the reports' losses, heads and checks are tested beside their modules)."""

import json
import math

import pytest

import evaluation
from helpers import run
from lab import reports


@pytest.mark.parametrize(
    "preset",
    [
        "broadhurst-1",
        "broadhurst-2",
        "auslin-siamese-gs",
        "auslin-segments-gs-rand",
        "sicurello-simcse",
        "sicurello-simcsecanon",
        "sicurello-unif-sst",
    ],
)
def test_report_presets_train_and_score(tiny_env, tmp_path, preset):
    # a quarter of the tiny data and of the epochs; Broadhurst's 12,080 examples become 16
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        preset,
        "--scale",
        "0.25",
        "--examples_per_task",
        "16",
    )
    assert rows and all(math.isfinite(r["overall"]) for r in rows)
    assert all(math.isfinite(r["train_loss"]) for r in rows)


def fake_rows(sst, para, sts):
    start = {"stage": "start (no training)", "index": -1}
    scored = {"sst": {"accuracy": sst}, "para": {"accuracy": para}, "sts": {"pearson": sts}}
    best = {"stage": "epoch 1", "index": 0, **scored}
    best["overall"] = evaluation.overall_score(sst, para, sts)
    worse = {**best, "stage": "epoch 2", "index": 1, "overall": best["overall"] - 0.1}
    return [start | {k: best[k] for k in ("sst", "para", "sts", "overall")}, best, worse]


def test_a_table_sets_their_scores_beside_the_kept_models():
    table = reports.TABLES["auslin-siamese"]
    done = {"seconds": 90.0, "rows": fake_rows(0.5, 0.75, 0.8)}
    text = reports.report_table(table, {"auslin-siamese-cosine-mse": done})
    mse, contrastive = text.strip().splitlines()[-2:]
    overall = (0.470 + 0.471 + (0.042 + 1) / 2) / 3  # theirs, computed from their three
    assert f"| {overall:.3f} | 0.500 | 0.750 | 0.800 | {(0.5 + 0.75 + 0.9) / 3:.3f} | 1.5 |" in mse
    assert "| not run |" in contrastive and "0.375" in contrastive


@pytest.mark.slow
def test_a_table_runs_each_row_once_and_resumes(tiny_env, tmp_path, monkeypatch):
    bert_dir, data_dir = tiny_env
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))
    row = "sicurello-vanilla-sst"  # labelled "SST only: BERT_vanilla" in presets.py
    monkeypatch.setitem(reports.TABLES, "tiny", reports.Table("tiny", "none", (row,)))
    argv = ["tiny", "--out", str(tmp_path), "--bert", str(bert_dir), "--max_length", "32"]
    argv += ["--scale", "0.5"]
    text = reports.make_table("tiny", reports.parse_args(argv))
    record = json.loads((tmp_path / "tiny" / row / reports.DONE).read_text())
    assert record["scale"] == 0.5 and len(record["rows"]) == 1 + 2  # start + 2 epochs of 3 x 0.5
    assert (
        tmp_path / "tiny" / "tiny.md"
    ).read_text() == text and "| SST only: BERT_vanilla |" in text
    calls = []
    monkeypatch.setattr(reports, "run_row", lambda *a: calls.append(a))
    assert reports.make_table("tiny", reports.parse_args(argv)) == text and not calls
    with pytest.raises(SystemExit, match="was run at --scale 0.5, not 0.25"):
        reports.make_table("tiny", reports.parse_args([*argv, "--scale", "0.25"]))
