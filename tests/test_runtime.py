"""Device and precision decided once, and each process's share of a batch (runtime.py)."""

import pytest
import torch

import runtime
from helpers import sentence_batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_says_so():
    with pytest.raises(SystemExit, match="no CUDA device is available here; use cpu"):
        runtime.make_runtime("cuda", amp=True)


def test_a_cpu_runtime_is_float32_without_a_scaler():
    rt = runtime.make_runtime("cpu", amp=True)
    assert rt.device.type == "cpu" and rt.amp_dtype is None and rt.scaler is None
    assert rt.main and rt.world == 1
    with pytest.raises(SystemExit, match="expected auto, cpu, cuda or cuda:N"):
        runtime.make_runtime("tpu", amp=True)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_the_shares_of_all_processes_cover_the_batch_once(world):
    batch = sentence_batch(B=7, seed=1) | {"labels": torch.arange(7)}
    seen, shares = [], 0.0
    for rank in range(world):
        rt = runtime.Runtime(torch.device("cpu"), None, None, rank=rank, world=world)
        for part, share in runtime.my_parts(batch, rt, accumulate=2):
            seen += part["labels"].tolist()
            shares += share
            assert share == pytest.approx(len(part["labels"]) / 7)
    assert sorted(seen) == list(range(7)) and shares == pytest.approx(1.0)


def test_one_process_agrees_with_itself():
    rt = runtime.Runtime(torch.device("cpu"), None, None)
    assert runtime.any_process([True, False], rt) == [True, False]
    assert runtime.from_main({"a": 1}, rt) == {"a": 1}
