"""The bench's pure helpers on hand-made inputs: interleaved timing (with a fake clock),
ratio of medians, padding efficiency, and the pass/fail logic of its targets. The bench
itself (python bench.py) is not run here."""

import pytest
import torch

from bench import (
    TARGETS,
    Row,
    markdown,
    padding_efficiency,
    random_batches,
    ratio_of_medians,
    time_interleaved,
)


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
    assert ratio_of_medians(times["ours"], times["ref"]) == pytest.approx(3.0 / 1.5, abs=1e-12)


def test_prepare_is_untimed_and_passed_to_the_run():
    clock, seen, synced = FakeClock(), [], []

    def prepare():
        clock.now += 100.0  # e.g. building a fresh tokenizer: must not be counted
        return len(seen)

    def run(arg):
        seen.append(arg)
        clock.now += 0.5

    times = time_interleaved(
        {"x": run},
        repeats=2,
        warmup=0,
        prepare={"x": prepare},
        sync=lambda: synced.append(1),
        clock=clock,
    )
    assert times == {"x": [0.5, 0.5]}
    assert seen == [0, 1]  # a fresh prepared argument per call
    assert len(synced) == 4  # before and after every timed call


def test_interleaved_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats >= 1"):
        time_interleaved({"x": lambda: None}, repeats=0)


def test_ratio_of_medians():
    assert ratio_of_medians([3.0, 1.0, 2.0], [1.0, 4.0, 1.0]) == pytest.approx(2.0, abs=1e-12)
    # even count: the mean of the two middle values, 2.5 / 5.0
    assert ratio_of_medians([1.0, 2.0, 3.0, 4.0], [5.0]) == pytest.approx(0.5, abs=1e-12)


def test_padding_efficiency():
    assert padding_efficiency([[2, 4]]) == pytest.approx(6 / 8, abs=1e-12)
    # (2 + 4 + 3 + 3 + 3) real tokens in 2 * 4 + 3 * 3 padded slots
    assert padding_efficiency([[2, 4], [3, 3, 3]]) == pytest.approx(15 / 17, abs=1e-12)
    assert padding_efficiency([[5], [7, 7]]) == 1.0
    with pytest.raises(ValueError, match="no tokens"):
        padding_efficiency([])


def test_random_batches_cover_every_index_once():
    batches = random_batches(10, 4, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(i for b in batches for i in b) == list(range(10))


def test_targets_pass_and_fail():
    assert TARGETS["forward_sdpa"].passed(ours=10.0, ratio=1.0)
    assert not TARGETS["forward_sdpa"].passed(ours=10.0, ratio=1.01)
    assert TARGETS["tokenizer"].passed(ours=1.0, ratio=2.5)
    assert not TARGETS["tokenizer"].passed(ours=1.0, ratio=1.9)
    assert TARGETS["padding"].passed(ours=0.95, ratio=None)  # on the value, not the ratio
    assert not TARGETS["padding"].passed(ours=0.85, ratio=5.0)


def test_row_ratio_and_report():
    slow = Row("forward", "BERT forward", "ms", 130.0, 100.0, target="forward_manual")
    info = Row("adamw", "loop vs foreach", "ms", 5.0, 4.0)
    nothing = Row("gpu", "tokens/s alone", "tokens/s", 1000.0, None)
    assert slow.ratio == pytest.approx(1.3, abs=1e-12) and slow.passed is False
    assert info.passed is None and nothing.ratio is None and nothing.passed is None
    meta = {"device": "cpu", "torch": "x", "threads": 2, "transformers": "y"}
    text = markdown(
        [slow, info, nothing],
        {"gpu": "no GPU"},
        meta | {"repeats": 3, "warmup": 1, "date": "today"},
    )
    assert "| BERT forward | 130 ms | 100 ms | 1.30 | ratio <= 1.2 | **FAIL** |" in text
    assert "target missed: BERT forward: ratio 1.300, target ratio <= 1.2." in text
    assert "not measured: gpu: no GPU" in text
