"""Device and precision decided once, and each process's share of a batch (engine/runtime.py)."""

import subprocess
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import torch

from commands import checks
from engine import runtime
from helpers import run, sentence_batch
from settings import DeviceConfig

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize(
    ("bf16_ms", "picked"), [(2.0, "bf16"), (2.7, "bf16"), (2.71, "fp32"), (3.0, "fp32")]
)
def test_auto_on_a_cpu_takes_bf16_only_when_it_wins_by_the_margin(monkeypatch, bf16_ms, picked):
    """The probe (here a fake: float32 3 ms) times both precisions, and auto takes bf16 only
    at 90% of float32's time or less (2.7 ms), saying so with both timings."""
    monkeypatch.setattr(runtime, "native_bf16", lambda device: True)
    calls = []

    def fake():
        calls.append(1)
        return {"fp32": 0.003, "bf16": bf16_ms / 1000}

    rt = runtime.make_runtime("cpu", "auto", probe=fake)
    assert rt.device.type == "cpu" and not rt.scaler.is_enabled() and rt.main and rt.world == 1
    assert calls == [1] and rt.precision == picked
    assert rt.amp_dtype == runtime.AUTOCAST[picked]
    assert rt.why == (
        f"auto: {picked} on this CPU (an encoder layer's forward and backward: bf16 "
        f"{bf16_ms:.1f} ms, float32 3.0 ms; bf16 needs at most 90% of float32's time)"
    )


def test_a_probe_that_cannot_run_leaves_float32(monkeypatch):
    """An open exercise's layer raises in the probe: auto takes float32 and says why; the
    run then stops where the body is used, as without the probe."""
    monkeypatch.setattr(runtime, "native_bf16", lambda device: True)

    def open_body(H):
        raise NotImplementedError("exercise layer")

    probe = partial(runtime.layer_times, (2, 4, 8), open_body)
    assert runtime.pick_precision(torch.device("cpu"), "auto", probe) == (
        "fp32",
        "auto: float32, unmeasured (the probe's layer raised NotImplementedError)",
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


@pytest.mark.parametrize("own", [False, True])
def test_the_probe_trains_a_whole_layer_in_both_precisions_and_leaves_the_generators(own):
    """layer_times runs a training forward and backward of the layer (torch's stand-in, or
    bert.py's BertLayer with the run's dropout) at (B, T, H), once per precision per round,
    (its feed-forward's matmul in bf16 under autocast), and the global generator goes on
    as if untouched."""
    from base_bert import BertConfig
    from bert import BertLayer

    config = BertConfig(hidden_size=16, num_attention_heads=2, intermediate_size=64)
    built, passes = [], []

    def layer(H):
        built.append(H)
        module = runtime.fast_dropout(BertLayer(config)) if own else runtime.StandInLayer(H)
        ffn = [m for m in module.modules() if getattr(m, "out_features", 0) == 4 * H]
        ffn[0].register_forward_hook(lambda m, args, y: passes.append((m.training, y.dtype)))
        return module

    before = torch.get_rng_state()
    times = runtime.layer_times((3, 5, 16), layer, repeats=2)
    assert torch.equal(torch.get_rng_state(), before)
    assert sorted(times) == ["bf16", "fp32"] and all(0 < t < 1 for t in times.values())
    assert built == [16]
    assert passes == [(True, torch.float32), (True, torch.bfloat16)] * 3  # a warm-up, 2 timed


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
        for part, share in runtime.my_pieces(batch, rt, accumulate=2):
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
def test_even_pieces_says_whether_every_process_gets_as_many_micro_batches(B, world, accumulate):
    batch = sentence_batch(B)
    counts = [
        len(
            runtime.my_pieces(
                batch, runtime.Runtime(torch.device("cpu"), None, None, r, world), accumulate
            )
        )
        for r in range(world)
    ]
    rt = runtime.Runtime(torch.device("cpu"), None, None, 0, world)
    assert runtime.even_pieces(batch, rt, accumulate) == (min(counts) > 0 and len(set(counts)) == 1)


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


def test_a_run_never_imports_torchs_compiler_for_its_optimizer():
    """torch wraps four of Optimizer's methods to keep torch.compile out, importing
    torch._dynamo at the first call (3 s); under run_cli (the project's commands) they run as
    written: a fresh process steps, zeroes, saves and loads AdamW without it, to the same
    update."""
    for name in runtime.OPTIMIZER_WRAPPED:  # torch still wraps them: else this is no help
        assert hasattr(getattr(torch.optim.Optimizer, name), "__wrapped__"), name
    code = """if True:
        import sys, torch
        from commands.cli import run_cli
        from optimizer import AdamW

        def main(argv):
            w = torch.nn.Parameter(torch.ones(3))
            opt = AdamW([w], lr=0.5)
            w.grad = torch.tensor([1.0, -2.0, 0.0])
            opt.step()
            opt.zero_grad()
            opt.load_state_dict(opt.state_dict())
            print("torch._dynamo" in sys.modules, *w.tolist())

        run_cli(main, [])
    """
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported, *weights = done.stdout.split()
    first_step = [1 - 0.5, 1 + 0.5, 1.0]  # Adam's first step: lr x sign(g), up to eps
    assert imported == "False" and [round(float(x), 5) for x in weights] == first_step
