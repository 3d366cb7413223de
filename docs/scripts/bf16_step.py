"""Where a bf16 training step of MiniLM goes on the CPU, for docs/precision.md.

The step: MiniLM in train mode on one random batch of 32 x 64 (lengths 32 to 64), mean
pooling, dropout, a linear SST head, cross-entropy, backward and optimizer.AdamW's loop
(lab/bench.py's train step, written with bert.py and optimizer.py alone), under bf16 autocast.
With torch.profiler over three steps after a warm-up step, it prints the CPU time of the
matmuls (the self time of aten::mm, addmm and bmm), of dropout's forward (runtime.dropout:
its masks and their multiplication) and of the AdamW step, beside the whole. It does so
for the code as it is, and --before for the two pieces as they were before commit bcc1984:
dropout by F.dropout (one Bernoulli draw per element) and adamw_step.AdamWBefore.
--time N prints the median milliseconds of N steps instead (docs/scripts/malloc_env.py
runs it so).

Run from the repository root (under a minute on a 2-core CPU):

    python docs/scripts/bf16_step.py [--before] [--time N]
"""

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from adamw_step import AdamWBefore  # noqa: E402  (docs/scripts, this file's folder)
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import bert  # noqa: E402
from engine import runtime  # noqa: E402
from optimizer import AdamW  # noqa: E402

B, T = 32, 64
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def make_step(before: bool, labelled: bool):
    """A function running one training step (its parts named for the profiler when
    labelled); before: F.dropout and the AdamW update as they were before bcc1984."""
    inner = (lambda x, p, training=True: F.dropout(x, p, training)) if before else runtime.dropout

    def dropout(x, p, training=True):
        with record_function("dropout") if labelled else nullcontext():
            return inner(x, p, training)

    runtime.dropout = dropout  # the engine's Dropout looks it up at each call
    torch.manual_seed(0)
    model = runtime.fast_dropout(bert.BertModel.from_pretrained("minilm")).train()  # a run's
    head = torch.nn.Linear(model.config.hidden_size, 5)
    params = [*model.parameters(), *head.parameters()]
    optimizer = (AdamWBefore if before else AdamW)(params, lr=1e-5, eps=1e-6)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    labels = torch.randint(0, 5, (B,), generator=g)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model(ids * mask, mask)["last_hidden_state"]  # (B, T, H)
            pooled = runtime.dropout(bert.mean_pool(hidden, mask), 0.1)  # (B, H)
            loss = F.cross_entropy(head(pooled).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with record_function("AdamW step") if labelled else nullcontext():
            optimizer.step()

    return step


def breakdown(before: bool) -> None:
    step = make_step(before, labelled=True)
    step()  # the moments are made and the kernels chosen: not timed
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    parts = {
        "matmuls (self time of " + ", ".join(MATMULS) + ")": sum(
            e.self_cpu_time_total for e in events if e.key in MATMULS
        ),
        "dropout, forward": sum(e.cpu_time_total for e in events if e.key == "dropout"),
        "AdamW step": sum(e.cpu_time_total for e in events if e.key == "AdamW step"),
    }
    code = "as before bcc1984 (F.dropout, AdamWBefore)" if before else "as it is"
    print(f"three bf16 steps of {B} x {T}, code {code}: {wall:.2f} s wall")
    print("| part | CPU time (s) | share |")
    print("| --- | ---: | ---: |")
    for name, us in parts.items():
        print(f"| {name} | {us / 1e6:.2f} | {us / 1e6 / total:.0%} |")
    print(f"| all | {total:.2f} | 100% |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", action="store_true", help="the code before bcc1984")
    parser.add_argument("--time", type=int, default=0, help="median ms of this many steps")
    args = parser.parse_args(argv)
    if not args.time:
        return breakdown(args.before)
    step, ms = make_step(args.before, labelled=False), []
    step()  # untimed, as above
    for _ in range(args.time):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    print(f"{statistics.median(ms):.1f}")


if __name__ == "__main__":
    main()
