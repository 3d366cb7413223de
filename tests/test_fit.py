"""--fit_minutes (the demo's): sizes shrunk by one factor from timed steps, said in one line,
kept in the run's config, and a run that trains as one started at those sizes."""

import json
import re

import pytest

from commands import command, estimate
from helpers import tiny_flags

FLAGS = "--preset demo --loops 1 --max_length 64 --batch_size 8 --seed 0 --no_test_predictions"


def table(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.mark.slow
def test_a_slow_machine_gets_a_smaller_sample_that_a_typed_size_runs_again(
    tiny_env, tmp_path, capsys, monkeypatch
):
    """A fake step time makes the tiny data's whole run 1.25x the budget: the run says the sizes
    it chose and why, its config keeps them (fit off), and typing them trains the same table;
    a machine fast enough keeps every size."""
    per_token = {"s": 1.0}  # a trained token's seconds; a scored one's half that
    monkeypatch.setattr(estimate, "time_steps", lambda *a: per_token["s"])
    monkeypatch.setattr(estimate, "time_scoring", lambda *a: per_token["s"] / 2)
    cfg, _ = command.parse_args(tiny_flags(tiny_env, tmp_path / "x", FLAGS))
    plans = command.PRESETS["demo"].plans_of(cfg)
    stages, task_data = plans.stages(), command.seeded_data(cfg, plans)
    trained, scored = estimate.run_tokens(stages, task_data, cfg)(48, 32)
    per_token["s"] = 1.25 * 60 * cfg.data.fit_minutes / (trained + scored / 2)  # 1.25x the budget
    capsys.readouterr()
    command.main(tiny_flags(tiny_env, tmp_path / "fit", FLAGS))
    out = capsys.readouterr().out
    said = re.search(r"sample: (\d+) training and (\d+) dev examples per task at most", out)
    n, d = int(said[1]), int(said[2])
    factor = int(re.search(r"\((\d+)% of 48 and 32\)", out)[1]) / 100
    assert (n, d) == (round(48 * factor), round(32 * factor)) and "--fit_minutes 10;" in out

    def minutes(f):  # the run at factor f, as the fake machine would take it
        trained, scored = estimate.run_tokens(stages, task_data, cfg)(48 * f, 32 * f)
        return per_token["s"] * (trained + scored / 2) / 60

    assert minutes(factor) <= 10 < minutes(factor + 0.05)  # the largest factor that fits
    assert out.index("sample: ") < out.index("SST: ")  # before the data it then reads
    assert f"SST: {n} train, {min(d, 16)} dev" in out and f"held out: {d} SNLI" in out
    assert f"--train_size {n} --dev_size {d} runs" in out
    saved = json.loads((tmp_path / "fit" / "config.json").read_text())["data"]
    assert (saved["train_size"], saved["dev_size"], saved["fit_minutes"]) == (n, d, 0.0)
    again = f"{FLAGS} --train_size {n} --dev_size {d}"
    command.main(tiny_flags(tiny_env, tmp_path / "typed", again))
    assert "sample: " not in capsys.readouterr().out  # a typed size is the size
    assert table(tmp_path / "fit") == table(tmp_path / "typed")
    per_token["s"] = 1e-9  # fast: nothing shrinks
    command.main(tiny_flags(tiny_env, tmp_path / "fast", FLAGS))
    assert "sample: 48 training and 32 dev examples per task at most (100% of" in (
        capsys.readouterr().out
    )
    per_token["s"] = 1e3  # slow: the floor, said, and no smaller
    command.main(tiny_flags(tiny_env, tmp_path / "slow", FLAGS))
    said = "sample: 24 training and 16 dev examples per task at most (50% of 48 and 32, the floor)"
    assert said in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "fit"),
    [
        ("", 10.0),
        ("--train_size 100", 0.0),
        ("--dev_size 100", 0.0),
        ("--train_size 100 --fit_minutes 5", 5.0),
        ("--fit_minutes 0", 0.0),
    ],
)
def test_a_typed_size_turns_the_fit_off_unless_it_is_typed_too(flags, fit):
    cfg, _ = command.parse_args(["--preset", "demo", *flags.split()])
    assert cfg.data.fit_minutes == fit
    assert command.parse_args(["--preset", "thesis"])[0].data.fit_minutes == 0.0
