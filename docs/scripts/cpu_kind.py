"""This CPU's kind and what --precision auto makes of it, for docs/precision.md's table.

Prints one markdown row: the CPU's name and the instruction sets torch sees (AVX-512,
AVX512-BF16, AMX), auto's pick and why, the probe's two timings (an encoder layer's
training forward and backward at the demo's shape; measured here even where auto takes
float32 unmeasured), and the demo's QQP step at both precisions, interleaved
(lab.bench's float32 section builds the step as the run does).

Run from the repository root, alone on the machine (about a minute on a 2-core CPU);
limit the CPU to AVX2 with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2:

    python docs/scripts/cpu_kind.py [--data_dir DATA] [--repeats 5]
"""

import argparse
import platform
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

from base_bert import load_config, resolve_model_dir  # noqa: E402
from bert import BertLayer  # noqa: E402
from commands.command import PROBE_TOKENS  # noqa: E402
from datasets import data_dir  # noqa: E402
from engine import runtime  # noqa: E402
from lab.bench import Context, demo_qqp_steps  # noqa: E402
from lab.timing import time_interleaved  # noqa: E402
from trainer import train_step  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cpu = torch.device("cpu")
    config = load_config(resolve_model_dir("minilm"))
    layer = lambda H: runtime.fast_dropout(BertLayer(config))  # noqa: E731
    probe = runtime.layer_times((32, PROBE_TOKENS, config.hidden_size), layer)
    pick, why = runtime.pick_precision(cpu, "auto", lambda: probe)
    rt = runtime.make_runtime("cpu", "fp32")
    ctx = Context(rt, "minilm", [32], 64, args.repeats, 1, data_dir(args.data_dir))
    model, stage, step, steps = demo_qqp_steps(ctx)
    optimizer = model.configure_optimizers(step.optim)
    batches = [next(steps) for _ in range(args.repeats + 1)]
    runs = {}
    for name in ("fp32", "bf16"):
        bf16 = replace(step, rt=replace(step.rt, amp_dtype=runtime.AUTOCAST[name]))
        g = torch.Generator().manual_seed(0)
        cycle = iter(batches * 2 * (args.repeats + 2))
        runs[name] = lambda s=bf16, g=g, c=cycle: train_step(model, optimizer, stage, next(c), s, g)
    times = time_interleaved(runs, args.repeats, 1)
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    flags = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if has(f)]
    print(
        "| CPU | AVX-512 / BF16 / AMX | auto | probe: bf16 / float32 ms | demo QQP step: float32 / bf16 ms |"
    )
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| {cpu_name()}, {torch.get_num_threads()} threads, torch sees "
        f"{torch.backends.cpu.get_cpu_capability()} | {' '.join(flags) or 'none'} | "
        f"{pick} ({why}) | {1000 * probe['bf16']:.1f} / {1000 * probe['fp32']:.1f} | "
        f"{ms['fp32']:.0f} / {ms['bf16']:.0f} |"
    )


def has(flag: str) -> bool:
    return flag in Path("/proc/cpuinfo").read_text().split()


if __name__ == "__main__":
    main()
