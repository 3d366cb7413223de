"""The bench's helpers (lab/timing.py, lab/bench.py) on hand-made inputs: interleaved timing (with a fake clock), the
ratios of medians and of minima, and pass/fail on the ratio of the minima; then one smoke run of bench.main on the tiny BERT and data (the memory section,
which changes malloc's settings for the whole process, is left out)."""

import json
import random

import pytest
import torch

from base_bert import BertConfig
from bert import BertModel
from engine import runtime
from lab import bench, measures
from lab.bench import TARGETS
from lab.timing import Row, markdown, passed, ratios, time_interleaved, timed_row


def verdict(row: Row) -> bool | None:
    """The row judged against its target in the bench's TARGETS, as bench.json records it."""
    return passed(row, TARGETS.get(row.target))


class FakeClock:
    """A clock that only moves when a run says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interleaved_order_warmup_and_timings():
    clock, log = FakeClock(), []
    durations = {"ours": iter([10.0, 2.0, 4.0, 3.0]), "ref": iter([5.0, 1.0, 2.0, 1.5])}

    def run(name):
        def call():
            log.append(name)
            clock.now += next(durations[name])

        return call

    times = time_interleaved(
        {"ours": run("ours"), "ref": run("ref")}, repeats=3, warmup=1, clock=clock
    )
    # A B, B A, A B, B A: each repeat reverses the previous order
    assert log == ["ours", "ref", "ref", "ours", "ours", "ref", "ref", "ours"]
    # the warm-up (10.0 and 5.0) is dropped
    assert times == {"ours": [2.0, 4.0, 3.0], "ref": [1.0, 2.0, 1.5]}


def test_prepare_is_untimed_and_passed_to_the_run():
    clock, seen, synced = FakeClock(), [], []

    def prepare():
        clock.now += 100.0  # e.g. building a fresh tokenizer: must not be counted
        return len(seen)

    def run(arg):
        seen.append(arg)
        clock.now += 0.5

    times = time_interleaved(
        {"x": run}, 2, 0, prepare={"x": prepare}, sync=lambda: synced.append(1), clock=clock
    )
    assert times == {"x": [0.5, 0.5]}
    assert seen == [0, 1]  # a fresh prepared argument per call
    assert len(synced) == 4  # before and after every timed call


def test_interleaved_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats >= 1"):
        time_interleaved({"x": lambda: None}, repeats=0)


def test_ratios_of_medians_of_minima_and_paired():
    # medians 2 and 1, minima 1 and 1; pairs 3/1, 1/4, 2/1: their median is 2
    assert ratios([3.0, 1.0, 2.0], [1.0, 4.0, 1.0]) == pytest.approx((2.0, 1.0, 2.0), abs=1e-12)
    # even count: the median is the mean of the two middle values; pairs 0.2, 0.4, 0.6, 0.8
    got = ratios([1.0, 2.0, 3.0, 4.0], [5.0] * 4)
    assert got == pytest.approx((0.5, 0.2, 0.5), abs=1e-12)
    # a load that slows both runs of a repeat alike cancels in the pairs, not in the minima
    assert ratios([1.0, 10.0, 10.0], [2.0, 10.0, 10.0])[1:] == pytest.approx((0.5, 1.0))


def test_timed_row_in_milliseconds_with_rates():
    times = {"ours": [0.2, 0.1, 0.3], "hf": [0.4, 0.3, 0.5]}
    row = timed_row("step", times, "ours", "hf", "train_step", items=(10, "examples"))
    assert (row.unit, row.ours, row.reference) == ("ms", pytest.approx(200), pytest.approx(400))
    assert row.ratio == pytest.approx(0.5) and row.ratio_min == pytest.approx(1 / 3)
    assert row.ratio_paired == pytest.approx(0.5)  # pairs 0.5, 1/3, 0.6
    assert row.note == "50.0 vs 25.0 examples/s"  # 10 per call at 0.2 s and at 0.4 s
    assert row.seconds == {"ours": [0.2, 0.1, 0.3], "ref": [0.4, 0.3, 0.5]}  # kept for the JSON


def test_a_timed_target_is_judged_on_the_paired_ratio():
    # a disturbed repeat moves the medians and a lucky one the minima; the pairs are level
    noisy = Row("fwd", "ms", 110.0, 100.0, 1.1, 0.8, 1.0, target="forward_sdpa")
    assert verdict(noisy) is True
    # medians and minima that look fine do not hide pairs in which ours is slower
    slower = Row("fwd", "ms", 95.0, 100.0, 0.95, 0.9, 1.08, target="forward_sdpa")
    assert verdict(slower) is False
    # an untimed row (memory) is judged on its one ratio
    assert verdict(Row("memory", "MiB", 250.0, 100.0, ratio=2.5, target="smart_memory")) is False
    assert verdict(Row("info", "ms", 1.0, 2.0, 0.5, 0.5)) is None  # no target


def test_targets_bounds_and_sides():
    assert TARGETS["tokenizer"].on == "ratio" and TARGETS["tokenizer"].bound == 0.5
    assert verdict(Row("tok", "ms", 40.0, 100.0, 0.4, 0.45, target="tokenizer"))
    assert not verdict(Row("tok", "ms", 60.0, 100.0, 0.6, 0.55, target="tokenizer"))
    # padding is judged on our value itself, whatever the ratio to random batches
    assert verdict(Row("pad", "real/padded", 0.95, 0.5, ratio=1.9, target="padding"))
    assert not verdict(Row("pad", "real/padded", 0.85, 0.2, ratio=4.25, target="padding"))


def test_markdown_shows_the_three_ratios_and_the_verdict():
    slow = Row("BERT forward", "ms", 130.0, 100.0, 1.3, 1.25, 1.28, target="forward_manual")
    rows = [slow, Row("padding", "real/padded", 0.95, 0.5, 1.9)]
    text = markdown(rows, {"memory": "no glibc"}, {"device": "CPU", "date": "today"}, TARGETS)
    assert text.startswith("# Benchmarks\n\nCPU; today.\n")
    row = "| BERT forward | 130 ms | 100 ms | 1.30 | 1.25 | 1.28 | ratio <= 1.2 | **FAIL** |"
    assert row in text
    assert "| padding | 0.950 | 0.500 | 1.90 | - | - | - | - |" in text
    assert "- not measured: memory: no glibc" in text
    assert "judged on the paired ratio" in text


@pytest.mark.parametrize(
    "flag, message",
    [
        (["--repeats", "0"], "--repeats must be above 0, got 0"),
        (["--warmup", "-1"], "--warmup must be at least 0, got -1"),
        (["--threads", "-1"], "--threads must be at least 0, got -1"),
    ],
)
def test_bad_counts_stop_with_a_message(flag, message):
    with pytest.raises(SystemExit, match=f"^{message}$"):
        bench.main(flag)


@pytest.mark.slow
def test_smoke_run_on_the_tiny_bert(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    sections = ["tokenizer", "forward", "train", "adamw", "padding"]
    argv = ["--only", *sections, "--model", str(bert_dir), "--data_dir", str(data_dir)]
    argv += ["--batch_sizes", "4", "--length", "8", "--repeats", "2", "--warmup", "0"]
    argv += ["--precision", "fp32"]  # whatever this CPU offers
    assert bench.main([*argv, "--out", str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = record["rows"]
    # 2 tokenizer, 2 forward, 3 train (no autocast on a CPU), 2 AdamW, 2 padding rows
    assert len(rows) == 11
    timed = [r for r in rows if r["unit"] == "ms"]
    assert len(timed) == 9 and all(r["ratio_paired"] > 0 and r["ratio_min"] > 0 for r in timed)
    assert all(len(r["seconds"]["ours"]) == len(r["seconds"]["ref"]) == 2 for r in timed)
    assert all(isinstance(r["passed"], bool) for r in rows if r["target"])
    assert "ratio of medians | ratio of minima" in (tmp_path / "out" / "bench.md").read_text()


@pytest.mark.slow
def test_the_precision_section_on_the_tiny_bert(tiny_env, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "native_bf16", lambda device: True)  # emulated where absent
    monkeypatch.setattr(runtime, "native_bf16", lambda device: True)  # auto's probe, too
    bert_dir, data_dir = tiny_env
    argv = ["--only", "precision", "--model", str(bert_dir), "--data_dir", str(data_dir)]
    argv += ["--batch_sizes", "4", "--length", "8", "--repeats", "2", "--warmup", "0"]
    assert bench.main([*argv, "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    names = [r["what"] for r in rows]
    assert [n.split(",")[0].split(":")[0] for n in names] == [
        "auto's probe",
        "matmul 32x32x64 (the FFN's shape)",
        "BERT forward 4x8",
        "train step 4x8",
        "train step 4x8 bf16",
        "train step 4x8 fp32",
    ]
    probe = rows[0]  # bf16's ms against float32's, and what --precision auto takes from them
    pick = "bf16" if probe["ours"] <= 0.9 * probe["reference"] else "fp32"
    assert probe["what"].startswith("auto's probe, encoder layer 4x32x32")
    assert probe["note"].startswith(f"auto: {pick} on this CPU (an encoder layer's")
    shares = [r for r in rows if "FLOP rate" in r["what"]]
    assert all(r["ours"] > 0 for r in shares) and shares[0]["target"] == "bf16_share"


def naive_padding_efficiency(batches) -> float:
    """Pad every batch slot by slot and count the slots that hold a real token."""
    real = slots = 0
    for lengths in batches:
        for length in lengths:
            for position in range(max(lengths)):
                slots += 1
                real += position < length
    return real / slots


def test_padding_efficiency():
    assert measures.padding_efficiency([[2, 4]]) == pytest.approx(6 / 8, abs=1e-12)
    assert measures.padding_efficiency([[2, 4], [3, 3, 3]]) == pytest.approx(15 / 17, abs=1e-12)
    assert measures.padding_efficiency([[5], [7, 7]]) == 1.0
    rng = random.Random(0)
    batches = [[rng.randint(1, 60) for _ in range(rng.randint(1, 32))] for _ in range(50)]
    assert measures.padding_efficiency(batches) == pytest.approx(naive_padding_efficiency(batches))
    with pytest.raises(ValueError, match="no tokens"):
        measures.padding_efficiency([])


def test_random_batches_cover_every_index_once():
    batches = measures.random_batches(10, 4, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(i for b in batches for i in b) == list(range(10))


def test_a_step_is_counted_six_flops_per_weight_and_token_plus_attention():
    cfg = BertConfig(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20
    )
    layer = BertModel(cfg).bert_layers[0]
    weights = sum(p.numel() for n, p in layer.named_parameters() if n.endswith("weight"))
    weights -= sum(
        p.numel() for n, p in layer.named_parameters() if "layer_norm" in n and n.endswith("weight")
    )
    B, T = 3, 5
    attention_flops = 2 * 2 * B * T * T * 8  # Q K^T and P V, 2 FLOPs a multiply-add, per layer
    expected = 2 * (6 * weights * B * T + 3 * attention_flops)  # 2 layers; backward twice forward
    assert measures.train_step_flops(cfg, B, T) == expected


def test_step_shares_split_a_profile_by_kind_of_work():
    """Hand-made profile events: matmuls, attention, dropout and other kernels by their own
    self times; everything under the optimizer's step (its Python too) is AdamW; the data
    path as measured; the wall time left is Python's; the shares sum to 1."""
    from types import SimpleNamespace

    from lab.timing import OTHER, REST, step_shares

    def event(name, us, parent=None):
        return SimpleNamespace(name=name, self_cpu_time_total=us, cpu_parent=parent)

    step = event("Optimizer.step#AdamW.step", 5.0)
    node = event("AddmmBackward0", 3.0)  # autograd's node: bookkeeping, not a kernel
    events = [
        event("aten::addmm", 40.0),
        event("aten::mm", 20.0, node),
        node,
        event("aten::bmm", 6.0),
        event("aten::_softmax", 4.0),
        event("aten::random_", 2.0),
        event("aten::gelu", 7.0),
        step,
        event("aten::sqrt", 3.0, step),
        event("aten::lerp_", 2.0, event("Optimizer.zero_grad#AdamW.zero_grad", 0.0)),
    ]
    shares = step_shares(events, wall_us=100.0, data_us=1.0)
    assert shares == pytest.approx(
        {
            "dense matmuls": 0.60,
            "attention": 0.10,
            "dropout draws": 0.02,
            OTHER: 0.07,
            "AdamW": 0.10,
            "the data path": 0.01,
            REST: 0.10,
        },
        abs=1e-12,
    )


@pytest.mark.slow
def test_the_float32_section_times_and_profiles_the_demos_step(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    argv = ["--only", "float32", "--model", str(bert_dir), "--data_dir", str(data_dir)]
    argv += ["--repeats", "2", "--warmup", "1", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert record["skipped"] == {}
    rows = {r["what"].split(": ")[-1].split(" (")[0]: r for r in record["rows"]}
    assert rows["demo QQP step, float32"]["ours"] > 0
    assert rows["FLOP rate / float32 matmul rate"]["ours"] > 0
    shares = [r["ours"] for r in record["rows"] if ": share in " in r["what"]]
    assert len(shares) == 7 and sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert all(s >= 0 for s in shares[:-1])  # the rest may be a hair below 0 (clocks)
