"""Device and precision decided once, and each process's share of a batch (engine/runtime.py)."""

from datetime import timedelta

import pytest
import torch

from engine import checks, runtime
from engine.flags import DeviceConfig
from helpers import run, sentence_batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_says_so():
    with pytest.raises(SystemExit, match="no CUDA device is available here; use cpu"):
        runtime.make_runtime("cuda", "auto")


@pytest.mark.parametrize(
    ("device", "message"),
    [("cuda:1", r"no such GPU; this machine has 1$"), ("mps", "expected auto, cpu, cuda or")],
)
def test_a_device_this_machine_lacks_stops_before_training(monkeypatch, device, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit, match=message):
        runtime.pick_device(device)
    assert runtime.pick_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("faster", ["bf16", "fp32"])
def test_auto_on_a_cpu_takes_the_precision_measured_faster(monkeypatch, faster):
    """The probe times both precisions at the run's shape (here a fake: 2 ms for the faster,
    3 ms for the other) and auto takes the faster one, saying so with both timings."""
    monkeypatch.setattr(runtime, "native_bf16", lambda device: True)
    shapes = []

    def fake(shape):
        shapes.append(shape)
        return {p: 0.002 if p == faster else 0.003 for p in ("fp32", "bf16")}

    monkeypatch.setattr(runtime, "ffn_times", fake)
    rt = runtime.make_runtime("cpu", "auto", shape=(64, 8))
    assert rt.device.type == "cpu" and not rt.scaler.is_enabled() and rt.main and rt.world == 1
    assert shapes == [(64, 8)] and rt.precision == faster
    assert rt.amp_dtype == runtime.AUTOCAST[faster]
    ms = {p: "2.0" if p == faster else "3.0" for p in ("fp32", "bf16")}
    assert rt.why == (
        f"auto: {faster} measured faster on this CPU (a layer's feed-forward, forward and "
        f"backward: bf16 {ms['bf16']} ms, float32 {ms['fp32']} ms)"
    )


def test_a_typed_precision_or_a_cpu_without_bf16_is_not_measured(monkeypatch):
    def never():
        raise AssertionError("measured")

    cpu = torch.device("cpu")
    for name in ("fp32", "bf16", "fp16"):
        assert runtime.pick_precision(cpu, name, never) == (name, "as asked")
    monkeypatch.setattr(runtime, "native_bf16", lambda device: False)
    assert runtime.pick_precision(cpu, "auto", never) == (
        "fp32",
        "auto: this CPU has no native bf16 dot products",
    )


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_a_gpu_follows_what_it_multiplies_natively(monkeypatch, native):
    monkeypatch.setattr(runtime, "native_bf16", lambda device: native)
    gpu = torch.device("cuda")  # a T4 has no bf16: fp16 with a scaler; an A100 has it
    assert runtime.pick_precision(gpu, "auto")[0] == ("bf16" if native else "fp16")


def test_the_probe_times_a_forward_and_backward_in_both_precisions():
    times = runtime.ffn_times(shape=(64, 16), repeats=2)
    assert sorted(times) == ["bf16", "fp32"] and all(0 < t < 1 for t in times.values())


def test_every_precision_can_be_forced_on_the_cpu():
    for name, dtype in [("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)]:
        rt = runtime.make_runtime("cpu", name)
        assert rt.amp_dtype == dtype and rt.precision == name and rt.why == "as asked"
        assert rt.scaler.is_enabled() == (name == "fp16")  # GradScaler("cpu"): a no-op but fp16
        with rt.autocast():
            y = torch.ones(2, 3) @ torch.ones(3, 2)
        assert y.dtype == (dtype or torch.float32)
    with pytest.raises(SystemExit, match="expected auto, cpu, cuda or cuda:N"):
        runtime.make_runtime("tpu", "auto")
    with pytest.raises(SystemExit, match="--precision fp64: expected one of auto, fp32"):
        runtime.make_runtime("cpu", "fp64")


def test_the_old_no_amp_flag_means_float32():
    assert DeviceConfig(amp=False).resolved_precision == "fp32"
    assert DeviceConfig(amp=False, precision="bf16").resolved_precision == "bf16"  # typed wins
    assert DeviceConfig().resolved_precision == "auto"


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


def test_a_data_parallel_process_waits_for_the_others_only_so_long(monkeypatch):
    asked = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(runtime.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        runtime.dist, "init_process_group", lambda b, timeout: asked.update(b=b, t=timeout)
    )
    monkeypatch.setattr(runtime.dist, "get_rank", lambda: 0)
    rt = runtime.make_runtime("cpu", "fp32", timeout_minutes=7)
    assert asked == {"b": "gloo", "t": timedelta(minutes=7)} and rt.world == 2 and rt.main


def test_more_processes_than_gpus_stop_with_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    message = "torchrun started 2 processes on a machine with 1 GPU.s.: use --nproc_per_node 1"
    with pytest.raises(SystemExit, match=message):
        runtime.make_runtime("auto", "fp32")


@pytest.mark.parametrize("B", [1, 2, 5, 7, 8, 12, 13])
@pytest.mark.parametrize("world,accumulate", [(1, 1), (2, 1), (2, 2), (3, 2), (4, 1)])
def test_even_parts_says_whether_every_process_gets_as_many_micro_batches(B, world, accumulate):
    batch = sentence_batch(B)
    counts = [
        len(
            runtime.my_parts(
                batch, runtime.Runtime(torch.device("cpu"), None, None, r, world), accumulate
            )
        )
        for r in range(world)
    ]
    rt = runtime.Runtime(torch.device("cpu"), None, None, 0, world)
    assert runtime.even_parts(batch, rt, accumulate) == (min(counts) > 0 and len(set(counts)) == 1)


def test_every_process_but_the_main_one_draws_its_own_masks():
    def draws(rank, world=3):
        torch.manual_seed(7)  # what every process starts from (or resumes to)
        runtime.own_generators(runtime.Runtime(torch.device("cpu"), None, None, rank, world))
        return torch.rand(5)

    torch.manual_seed(7)
    alone = torch.rand(5)
    assert torch.equal(draws(0), alone) and torch.equal(draws(0, world=1), alone)
    ranks = [draws(r) for r in range(3)]
    assert all(not torch.equal(ranks[i], ranks[j]) for i in range(3) for j in range(i))
    assert torch.equal(draws(2), ranks[2])  # the same again after a resume to that state


def test_compile_on_the_cpu_stops_before_a_run_folder_is_made(tiny_env, tmp_path):
    """Compiled layers train slower than eager on the CPU (docs/precision.md): --compile
    stops there with one line, before anything is written; on CUDA it passes."""
    with pytest.raises(SystemExit, match=r"^--compile: on the CPU .* --device cuda"):
        run(tiny_env, tmp_path / "run", "--compile")
    assert not (tmp_path / "run").exists()
    checks.check_compile(True, torch.device("cuda", 0))
    checks.check_compile(False, torch.device("cpu"))


def test_to_device_moves_tensors_only():
    batch = {"input_ids": torch.ones(2, 3), "ids": ["a", "b"]}
    moved = runtime.to_device(batch, "meta")
    assert moved["input_ids"].device.type == "meta"
    assert moved["ids"] is batch["ids"]
