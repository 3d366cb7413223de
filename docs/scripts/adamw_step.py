"""One AdamW step over MiniLM's parameters, for docs/precision.md (the bf16 step's bounds).

It prints the milliseconds of one step of optimizer.AdamW's loop (the update since commit
bcc1984: bias corrections folded into scalars, sqrt(v) in a shared scratch buffer), of the
same loop with the update as it was before bcc1984 (sqrt(v) / sqrt(bias2) + eps in two new
tensors per parameter), and of torch.optim.AdamW(foreach=False). The three share the 22.7M
parameters and random gradients (each keeps its own moments) and run interleaved, one step
each per round: the median and the range over the rounds after a warm-up round.

Run from the repository root (well under a minute on a 2-core CPU):

    python docs/scripts/adamw_step.py [--rounds 20]
"""

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

from bert import BertModel  # noqa: E402
from optimizer import AdamW  # noqa: E402

SETTINGS = dict(lr=1e-5, eps=1e-6, weight_decay=0.0)  # the project's AdamW settings


class AdamWBefore(AdamW):
    """optimizer.AdamW with its loop update as it was before commit bcc1984."""

    def _loop_update(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for p in params:
            state = self._state(p)
            state["step"] += 1
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(p.grad, 1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
            bias1, bias2 = self._bias_corrections(group, state["step"])
            if group["weight_decay"]:
                p.mul_(1.0 - lr * group["weight_decay"])
            denom = (exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(eps)  # two new tensors
            p.addcdiv_(exp_avg, denom, value=-lr / bias1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    args = parser.parse_args(argv)
    params = list(BertModel.from_pretrained("minilm").parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    optimizers = {
        "optimizer.AdamW, loop (now)": AdamW(params, **SETTINGS),
        "optimizer.AdamW, loop, update before bcc1984": AdamWBefore(params, **SETTINGS),
        "torch.optim.AdamW(foreach=False)": torch.optim.AdamW(params, **SETTINGS, foreach=False),
    }
    times = {name: [] for name in optimizers}
    for r in range(args.rounds + 1):  # round 0 makes the moments: not timed
        for name, opt in optimizers.items():
            t0 = time.perf_counter()
            opt.step()
            if r:
                times[name].append((time.perf_counter() - t0) * 1e3)
    n = sum(p.numel() for p in params) / 1e6
    print(f"one AdamW step, {n:.1f}M parameters, {args.rounds} rounds")
    print("| optimizer | median (ms) | range (ms) |")
    print("| --- | ---: | ---: |")
    for name, ms in times.items():
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f}-{max(ms):.1f} |")


if __name__ == "__main__":
    main()
