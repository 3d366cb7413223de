"""Data-parallel training under torchrun: 2 CPU processes (gloo) against 1, on a tiny BERT.

Dropout is off (model and heads), so one process and two differ only by float rounding:
the two sum their halves' gradients where one process takes the whole batch's mean, and
in-batch objectives (SimCSE, MNRL, distillation) gather the batch's rows.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import distributed

from base_bert import BertConfig
from commands import command
from conftest import write_tiny_checkpoint, write_tiny_data
from helpers import tiny_flags, weights

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [  # two processes each: several seconds a test
    pytest.mark.skipif(not distributed.is_available(), reason="no torch.distributed"),
    pytest.mark.slow,
]

# Attention key biases get no gradient in exact arithmetic (a shift that softmax ignores), so
# AdamW turns their rounding noise into +-lr steps, differently in one process and in two.
NOISE_ONLY = "self_attention.key.bias"


@pytest.fixture
def env(tmp_path, tiny_config):
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = BertConfig(**tiny_config.to_dict() | no_dropout)
    return write_tiny_checkpoint(tmp_path / "bert", config), write_tiny_data(tmp_path / "data")


def argv(env, run_dir, *extra):
    flags = "--batch_size 8 --lr 1e-3 --seed 0 --loops 1 --dropout 0 --max_length 64"
    flags += " --device cpu"  # gloo on the CPU, also where a GPU is (two processes, one GPU)
    return tiny_flags(env, run_dir, flags + " --no_test_predictions", *extra)


def torchrun(args, wait=True, script=ROOT / "multitask_classifier.py"):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        *args,
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True)
    # a group out of step would wait for gloo's 30 minutes: stop it well before
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]  # names the run
    return done


def assert_close_weights(a_dir, b_dir, atol=2e-5):
    a, b = weights(a_dir / "state.safetensors"), weights(b_dir / "state.safetensors")
    assert a.keys() == b.keys()
    compared = [k for k in a if NOISE_ONLY not in k]
    assert len(compared) > 20
    for k in compared:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=atol, msg=f"{b_dir}: {k}")


# Each a path of the update under two processes: {name: the run's flags}
CONFIGS = {
    "plain": ["--preset", "thesis"],
    "smart": ["--preset", "thesis-smart", "--smart_batch_size", "8", "--smart_dropout", "shared"],
    "pcgrad": ["--preset", "multitask", "--weighting", "pcgrad", "--multitask_epochs", "1"],
    # batches of one: the second process has no rows, and still joins PCGrad's sums
    "pcgrad-rowless": ["--preset", "multitask", "--weighting", "pcgrad", "--batch_size", "1"]
    + ["--multitask_epochs", "1", "--examples_per_task", "6"],
    # in-batch objectives: one process compares the whole batch, so two must gather it
    "simcse-stage": ["--preset", "simcse", "--simcse_data", "para", "--simcse_loss", "mnrl"],
    "mnrl-simcse-term": ["--preset", "thesis", "--para_loss", "mnrl", "--simcse_weight", "0.5"],
    "distillation": ["--preset", "defended", "--batch_size", "7"],  # shares of 4 and 3
}


def test_two_processes_train_the_weights_of_one(env, tmp_path):
    """Every configuration in one torchrun job (tests/torchrun_runs.py: torchrun and its
    processes started once), each against its run in one process."""
    runs = [argv(env, tmp_path / name / "two", *flags) for name, flags in CONFIGS.items()]
    out = torchrun([json.dumps(runs)], script=ROOT / "tests" / "torchrun_runs.py").stdout
    outputs = out.split("=== run ")[1:]
    assert len(outputs) == len(CONFIGS)
    for (name, flags), printed in zip(CONFIGS.items(), outputs, strict=True):
        one, two = tmp_path / name / "one", tmp_path / name / "two"
        command.main(argv(env, one, *flags))
        # one process prints (the others' stdout is closed by the first run's make_runtime)
        assert printed.count("forgetting table") == 1, name
        assert_close_weights(one, two)
        one_rows = (one / "metrics.jsonl").read_text().splitlines()
        two_rows = (two / "metrics.jsonl").read_text().splitlines()
        assert len(one_rows) == len(two_rows), name  # one table, its rows written once
        for a, b in zip(one_rows[1:], two_rows[1:], strict=True):  # each dev set scored whole
            a, b = json.loads(a), json.loads(b)
            assert a["stage"] == b["stage"] and abs(a["train_loss"] - b["train_loss"]) < 1e-4
        steps = len((two / "steps.jsonl").read_text().splitlines())
        assert steps == len((one / "steps.jsonl").read_text().splitlines()), name


def test_a_stopped_two_process_run_resumes_to_the_same_weights(env, tmp_path):
    bigger = (env[0], write_tiny_data(tmp_path / "more", n_train=400))
    torchrun(argv(bigger, tmp_path / "straight"))
    run = torchrun(argv(bigger, tmp_path / "resumed"), wait=False)
    steps = tmp_path / "resumed" / "steps.jsonl"
    deadline = time.monotonic() + 120
    while run.poll() is None and not (steps.is_file() and steps.stat().st_size > 0):
        assert time.monotonic() < deadline, "no training step within 2 minutes"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGTERM)  # torchrun passes it on to both processes
    assert run.wait(timeout=120) != 0, "the run ended before it could be stopped"
    logged = len(steps.read_text().splitlines())
    total = len((tmp_path / "straight" / "steps.jsonl").read_text().splitlines())
    assert 0 < logged < total  # stopped inside the plan, its checkpoint on disk
    torchrun(["--resume", str(tmp_path / "resumed")])
    assert len(steps.read_text().splitlines()) == total
    assert_close_weights(tmp_path / "straight", tmp_path / "resumed", atol=1e-6)
