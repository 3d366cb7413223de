"""The run configuration: flags generated from the dataclasses, presets under typed flags,
bounds, and the JSON a run folder keeps."""

import json
import re
import shlex
from pathlib import Path

import pytest

import presets
from commands import cli, command, flags
from settings import RunConfig

REPO = Path(__file__).resolve().parent.parent


def test_defaults_come_from_the_dataclasses():
    cfg, typed, extras = cli.parse(RunConfig(), [])
    assert cfg == RunConfig() and typed == {} and extras == {}
    assert cfg.optim.lr == 1e-5 and cfg.smart.lambda_sst == 10.0 and cfg.device.amp


def test_every_setting_is_one_flag_with_help():
    names = [flags.flag_of(f) for _, f, _ in flags.leaves(RunConfig())]
    assert len(names) == len(set(names))  # no flag names two settings
    assert all(f.metadata["help"] for _, f, _ in flags.leaves(RunConfig()))


def test_a_preset_sets_values_under_the_flags_the_user_typed():
    cfg, _ = command.parse_args(["--preset", "thesis-smart"])
    assert cfg.smart.enabled
    cfg, _ = command.parse_args(["--preset", "equibert", "--simcse_loss", "mnrl"])
    assert cfg.simcse.simcse_loss == "mnrl"  # typed beats the preset's align_uniform
    cfg, _ = command.parse_args(["--preset", "equibert"])
    assert cfg.simcse.simcse_loss == "align_uniform"


def test_switches_and_lists_parse():
    cfg, typed, _ = cli.parse(
        RunConfig(),
        [
            "--no_amp",
            "--smart",
            "--cross_encode",
            "para",
            "sts",
            "--sequential_epochs",
            "1",
            "2",
            "3",
        ],
    )
    assert not cfg.device.amp and cfg.smart.enabled
    assert cfg.multitask.cross_encode == ["para", "sts"]
    assert cfg.schedule.sequential_epochs == (1, 2, 3)
    assert typed == {  # what was typed, by setting, apart from the defaults
        "device.amp": False,
        "smart.enabled": True,
        "multitask.cross_encode": ["para", "sts"],
        "schedule.sequential_epochs": (1, 2, 3),
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--para_fraction", "0"], "--para_fraction must be above 0, got 0.0"),
        (["--para_fraction", "1.5"], "--para_fraction must be at most 1, got 1.5"),
        (["--sequential_epochs", "1", "0", "1"], r"--sequential_epochs must be at least 1"),
        (["--simcse_batch_size", "1"], "--simcse_batch_size must be at least 2, got 1"),
        (["--max_length", "2"], "--max_length must be at least 3, got 2"),
        (["--seed", "-1"], "--seed must be at least 0, got -1"),
        (["--seed", "4294967296"], "--seed must be at most 4294967295, got 4294967296"),
        (["--lr", "nan"], "--lr must be a finite number, got nan"),
        (["--mu", "inf"], "--mu must be a finite number, got inf"),
        (["--dropout", "1.5"], "--dropout must be at most 1, got 1.5"),
    ],
)
def test_out_of_range_values_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        cli.parse(RunConfig(), argv)


def test_json_round_trip_and_settings_added_since():
    cfg, _ = command.parse_args(["--lr", "3e-5", "--sequential_epochs", "1", "2", "3", "--smart"])
    saved = json.loads(json.dumps(flags.to_dict(cfg)))
    assert flags.from_dict(RunConfig, saved) == cfg
    del saved["smart"]["mu"]  # a run saved before `mu` existed gets today's default
    assert flags.from_dict(RunConfig, saved).smart.mu == RunConfig().smart.mu
    saved["optim"]["lrr"] = 1.0  # a hand edit's typo would otherwise train with the default
    with pytest.raises(SystemExit, match=r"^c.json: unknown settings optim.lrr$"):
        flags.from_dict(RunConfig, saved, "c.json")
    with pytest.raises(SystemExit, match=r"^c.json: no settings"):
        flags.from_dict(RunConfig, {}, "c.json")


def test_the_flags_in_the_readme_docs_and_makefile_still_parse():
    files = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").glob("*.md"))]
    text = "".join(f.read_text() for f in files).replace("\\\n", " ")  # continued lines
    commands = re.findall(r"multitask_classifier.py([^\n`|#]*)", text)
    assert len(commands) >= 10
    for line in commands:
        argv = [a for a in shlex.split(line) if not a.startswith("$(")]  # make variables
        if not {"--resume", "--predict"} & set(argv):  # need a run
            command.parse_args(argv)


def test_stages_check_their_fields():
    with pytest.raises(ValueError, match=r"unknown task 'qqp'; expected one of \['cfimdb'"):
        presets.Stage(("qqp",), 1e-5, 32)
    with pytest.raises(ValueError, match="loss 'mnrl' does not fit task 'sst'"):
        presets.Stage(("sst",), 1e-5, 32, losses={"sst": "mnrl"})
    with pytest.raises(ValueError, match="a multitask stage needs"):
        presets.Stage(("sst", "para"), 1e-5, 32, kind="multitask")
    with pytest.raises(ValueError, match="unknown stage kind 'simcse'"):
        presets.Stage((), 1e-5, 32, kind="simcse")
