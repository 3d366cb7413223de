"""lab/plots.py: the readers return what the run files hold; the pictures are real PNGs."""

import json
import math
import struct

import pytest

import evaluation
from helpers import run
from lab import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) from the PNG header; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def assert_small_png(path):
    width, height = png_size(path)
    assert 400 <= width <= 2500 and 250 <= height <= 1200, (path, width, height)


def naive_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def scores(sst, para, sts) -> dict:
    """A metrics row's scores, as runner.run_plan writes them."""
    f1 = {"macro_f1": 0.0, "weighted_f1": 0.0}
    return {
        "sst": {"accuracy": sst} | f1,
        "para": {"accuracy": para} | f1,
        "sts": {"pearson": sts},
        "overall": (sst + para + (sts + 1) / 2) / 3,
    }


def write_jsonl(path, records, end="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + end)


def step(stage, name, n, tasks, loss):
    return {
        "stage": stage,
        "name": name,
        "epoch": 0,
        "step": n,
        "tasks": tasks,
        "loss": loss,
        "lr": 1e-5,
        "grad_norm": 1.0,
        "examples_per_s": 100.0,
    }


def test_a_tiny_run_gives_both_pictures_and_readers_match_its_files(tiny_env, tmp_path):
    run_dir = tmp_path / "run"
    run(tiny_env, run_dir)
    rows, steps = plots.run_rows(run_dir), plots.read_steps(run_dir)
    assert rows == naive_jsonl(run_dir / "metrics.jsonl")
    assert steps == naive_jsonl(run_dir / "steps.jsonl")
    assert rows[0]["stage"] == "start (no training)"
    assert sorted({s["stage"] for s in steps}) == [row["index"] for row in rows[1:]]
    written = plots.main([str(run_dir), "--out", str(tmp_path / "pictures")])
    assert written == [tmp_path / "pictures" / "forgetting.png", tmp_path / "pictures" / "loss.png"]
    for path in written:
        assert_small_png(path)


def test_forgetting_series_start_and_best_stage(tmp_path):
    rows = [
        {"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8),
        {"stage": "QQP", "index": 0} | scores(0.2, 0.7, 0.8),
        {"stage": "loop 1: SST", "index": 1} | scores(0.4, 0.7, 0.8),
        {"stage": "loop 1: STS", "index": 2} | scores(0.4, 0.7, 0.8),  # ties: the first is kept
    ]
    series = plots.score_series(rows)
    assert list(series) == ["sst", "para", "sts", "overall"]
    assert series["sts"] == ("STS r", [0.8] * 4)
    assert series["para"] == ("QQP acc", [0.5, 0.7, 0.7, 0.7])
    assert evaluation.kept_stage(rows) == 1
    assert evaluation.kept_row(rows) is rows[2]  # the row of that stage, after the start row
    rows[2]["overall"] = rows[3]["overall"] = math.nan  # a NaN score is never the best
    assert evaluation.kept_stage(rows) == 0 and evaluation.kept_row(rows) is rows[1]
    assert evaluation.kept_stage(rows[:1]) is None  # nothing trained yet
    assert evaluation.kept_row(rows[:1]) is None and evaluation.kept_row([]) is None


def test_hand_written_steps_with_a_round_robin_stage_and_a_half_written_line(tmp_path, capsys):
    rows = [{"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8)]
    rows += [{"stage": f"stage {k}", "index": k} | scores(0.3, 0.6, 0.7) for k in range(2)]
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    steps = [step(0, "QQP", n, "para", 0.7 - n / 100) for n in range(1, 41)]
    steps += [step(1, "round robin", n, ("sst", "para", "sts")[n % 3], 1.0) for n in range(1, 31)]
    write_jsonl(tmp_path / "steps.jsonl", steps)
    with open(tmp_path / "steps.jsonl", "a") as f:
        f.write('{"stage": 1, "name": "round ro')  # a stage still training, caught mid-line
    assert plots.read_steps(tmp_path) == steps
    written = plots.main([str(tmp_path)])
    assert written == [tmp_path / "forgetting.png", tmp_path / "loss.png"]
    for path in written:
        assert_small_png(path)
    assert capsys.readouterr().out.splitlines() == [str(p) for p in written]


def test_a_run_without_a_step_log_gets_only_the_forgetting_picture(tmp_path, capsys):
    rows = [{"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8)]
    write_jsonl(tmp_path / "metrics.jsonl", rows + [rows[0] | {"stage": "QQP", "index": 0}])
    assert plots.read_steps(tmp_path) == []
    assert plots.main([str(tmp_path)]) == [tmp_path / "forgetting.png"]
    assert "no loss.png" in capsys.readouterr().out
    assert not (tmp_path / "loss.png").exists()


def test_an_individual_run_gets_pictures_per_task(tmp_path):
    for task, main in (("sst", {"accuracy": 0.3}), ("sts", {"pearson": 0.6})):
        rows = [{"stage": "start (no training)", "index": -1, task: main}]
        rows.append(rows[0] | {"stage": task, "index": 0})
        write_jsonl(tmp_path / task / "metrics.jsonl", rows)
        write_jsonl(tmp_path / task / "steps.jsonl", [step(0, task, 1, task, 1.0)])
        assert list(plots.score_series(rows)) == [task]  # one task, no overall
    written = plots.main([str(tmp_path), "--out", str(tmp_path / "pictures")])
    assert [p.relative_to(tmp_path / "pictures").as_posix() for p in written] == [
        "sst/forgetting.png",
        "sst/loss.png",
        "sts/forgetting.png",
        "sts/loss.png",
    ]
    for path in written:
        assert_small_png(path)


def test_a_folder_without_metrics_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit) as stop:
        plots.main([str(tmp_path / "missing")])
    message = str(stop.value)
    assert "no metrics.jsonl" in message and str(tmp_path / "missing") in message
    assert "\n" not in message


def test_a_metrics_file_cut_short_or_without_a_stage_is_one_line(tmp_path):
    from commands.cli import run_cli
    from engine.checkpoint import CheckpointError

    start = json.dumps({"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8))
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    for text, message in [
        ("", r"metrics.jsonl: empty; expected the start row"),
        (start + '\n{"stage": "QQP", "sst', r"metrics.jsonl:2: not a JSON row of scores"),
        ("[1, 2]\n", r"metrics.jsonl:1: not a JSON row of scores"),
    ]:
        metrics.write_text(text)
        with pytest.raises(CheckpointError, match=message):
            plots.main([str(metrics.parent)])
        with pytest.raises(SystemExit, match="^error: .*" + message):  # the command's line
            run_cli(plots.main, [str(metrics.parent)])
    metrics.write_bytes(b"\xff\xfe{}\n")  # UTF-16, say
    with pytest.raises(CheckpointError, match=r"metrics.jsonl: not UTF-8 text"):
        plots.main([str(metrics.parent)])
    metrics.write_text(start + "\n\n")  # a run still in its first stage; a blank line
    with pytest.raises(SystemExit, match=r"run: no stage with a numeric score in its metrics"):
        plots.main(["--table", f"a={metrics.parent}"])


def test_a_table_of_recipes_over_seeds(tmp_path, capsys):
    def one_run(name, best_sst, seconds):
        rows = [
            {"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8),
            {"stage": "QQP", "index": 0, "tasks": ["para"], "seconds": seconds}
            | scores(0.2, 0.7, 0.6),
            {"stage": "SST", "index": 1, "tasks": ["sst"], "seconds": seconds}
            | scores(best_sst, 0.7, 0.7),
        ]
        write_jsonl(tmp_path / name / "metrics.jsonl", rows)
        return rows

    a, b = one_run("a", 0.4, 60.0), one_run("b", 0.5, 120.0)
    one_run("c", 0.3, 30.0)
    plots.main(["--table", f"plain={tmp_path / 'a'},{tmp_path / 'b'}", f"one={tmp_path / 'c'}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| recipe | seeds | best overall |") and len(lines) == 4
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    overall = [a[2]["overall"], b[2]["overall"]]
    sd = math.sqrt(sum((x - sum(overall) / 2) ** 2 for x in overall))  # n - 1 = 1
    assert cells[:3] == ["plain", "2", f"{sum(overall) / 2:.4f} ± {sd:.4f}"]
    assert cells[3] == f"{0.45:.3f} ± {math.sqrt(2 * 0.05**2):.3f}"  # SST of the best stages
    # SST and QQP only gain (0); STS 0.8 -> 0.6 -> 0.7 loses 0.2, then 0.1 below its best
    forget = (0.0 + 0.0 + (0.2 + 0.1) / 2) / 3
    assert cells[6] == f"{forget:.4f} ± {0:.4f}"
    assert cells[7] == f"{(2 + 4) / 2:.1f} ± {math.sqrt(2):.1f}"  # minutes: 2 and 4
    assert lines[3].split("|")[2].strip() == "1"  # one seed: no spread
    with pytest.raises(SystemExit):
        plots.main(["--table", "nodirs"])


def test_compare_draws_one_panel_per_score_and_refuses_bad_specs(tmp_path):
    def one_run(name, heldout=True):
        rows = [{"stage": "start (no training)", "index": -1} | scores(0.2, 0.5, 0.8)]
        rows += [{"stage": f"S{k}", "index": k} | scores(0.3, 0.6, 0.8) for k in range(41)]
        for row in rows if heldout else []:
            row["heldout"] = 0.89
        write_jsonl(tmp_path / name / "metrics.jsonl", rows)
        return tmp_path / name

    a, b, c = one_run("a"), one_run("b"), one_run("c", heldout=False)
    out = tmp_path / "cmp.png"
    assert plots.main(["--compare", f"a={a}", f"b={b}", "--out", str(out)]) == [out]
    width, height = png_size(out)
    assert 1000 <= width <= 1400 and height > 5 * 2.0 * 110  # five panels: held-out included
    plots.main(["--compare", f"a={a}", f"c={c}", "--out", str(out)])
    assert png_size(out)[1] < 5 * 2.0 * 110  # c has no held-out score: four panels
    seven = {f"r{i}": plots.run_rows(a) for i in range(7)}  # more runs than colours
    for ax in plots.compare_figure(seven).axes:
        lines = ax.get_lines()
        assert len([x for x in lines if x.get_linestyle() == "-"]) == 7, ax.get_ylabel()
        assert len({x.get_color() for x in lines if x.get_linestyle() == "-"}) == 6
    sst_only = [
        {"stage": "start (no training)", "sst": {"accuracy": 0.2}},
        {"stage": "SST", "sst": {"accuracy": 0.4}},
    ]
    (panel,) = plots.compare_figure({"a": plots.run_rows(a), "sst": sst_only}).axes
    assert panel.get_ylabel() == "SST acc"  # only the score both runs have
    for bad in (["--compare", str(a), "--out", str(out)], ["--compare", f"a={a}"]):
        with pytest.raises(SystemExit):
            plots.main(bad)


def test_compare_lines_up_stages_by_name():
    axis = ["SimCSE", "QQP", "loop 1: STS", "loop 1: SST", "loop 2: STS"]
    assert plots.aligned(axis, axis) == [0, 1, 2, 3, 4]
    assert plots.aligned(["QQP", "loop 1: STS", "loop 1: SST"], axis) == [1, 2, 3]
    assert plots.aligned(["QQP", "other", "loop 2: STS"], axis) == [1, 2, 4]
    assert plots.aligned(["SST", "SST"], ["SST", "QQP", "SST"]) == [0, 2]  # repeated names
    start = {"stage": "start (no training)"} | scores(0.2, 0.5, 0.8)
    plain = [start] + [{"stage": n} | scores(0.3, 0.6, 0.8) for n in axis[1:]]
    simcse = [start] + [{"stage": n} | scores(0.4, 0.7, 0.8) for n in axis]
    fig = plots.compare_figure({"plain": plain, "simcse": simcse})
    xs = {line.get_label(): list(line.get_xdata()) for line in fig.axes[0].get_lines()}
    assert xs["plain"] == [2, 3, 4, 5] and xs["simcse"] == [1, 2, 3, 4, 5]
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == axis
