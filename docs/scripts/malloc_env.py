"""The bf16 step with and without glibc's malloc settings, for docs/precision.md.

MALLOC_MMAP_THRESHOLD_ (the largest value glibc accepts, 32 MiB on 64-bit) and
MALLOC_TRIM_THRESHOLD_ (4 GiB) keep freed memory mapped for the next allocation instead
of returning it to the kernel, whose fresh pages then fault in again. Each run is a fresh
process running docs/scripts/bf16_step.py --time 20 (the median of 20 bf16 steps after a
warm-up step); the runs come in pairs, without then with the settings, and the script
prints each pair and the share of the step the settings took off.

Run from the repository root (about two minutes on a 2-core CPU):

    python docs/scripts/malloc_env.py [--pairs 3] [--steps 20]
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

STEP = Path(__file__).resolve().parent / "bf16_step.py"
SETTINGS = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def step_ms(env: dict, steps: int) -> float:
    """The median bf16 step of a fresh process with these environment variables."""
    out = subprocess.run(
        [sys.executable, str(STEP), "--time", str(steps)],
        env={k: v for k, v in os.environ.items() if k not in SETTINGS} | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="pairs of runs (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps a run (default 20)")
    args = parser.parse_args(argv)
    print(" ".join(f"{k}={v}" for k, v in SETTINGS.items()))
    print("| pair | without (ms) | with (ms) | taken off |")
    print("| --- | ---: | ---: | ---: |")
    for pair in range(1, args.pairs + 1):
        without, with_ = step_ms({}, args.steps), step_ms(SETTINGS, args.steps)
        print(f"| {pair} | {without:.0f} | {with_:.0f} | {1 - with_ / without:.0%} |")


if __name__ == "__main__":
    main()
