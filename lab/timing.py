"""Timing two implementations fairly, and the table of what was found (lab/bench.py's).

Runs are interleaved (A B, B A, ...), so a passing load slows both runs of a pair; a
comparison is reported as ours / reference of the medians, of the minima, and the median
of the paired ratios, on which a target is judged. Misses are reported, never adjusted.
`peak_memory_mib` measures what one call adds to the memory in use.
"""

import ctypes
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Target:
    on: str  # "ratio": ours / reference (timed: the median of paired ratios); "ours": ours
    op: str  # "<=" or ">="
    bound: float

    def __str__(self) -> str:
        return f"{self.on} {self.op} {self.bound:g}"


@dataclass
class Row:
    what: str  # what was compared with what
    unit: str  # of ours and reference
    ours: float  # timed rows: the median
    reference: float | None = None
    ratio: float | None = None  # ours / reference; timed rows: of the medians
    ratio_min: float | None = None  # timed rows: ours / reference of the minima
    ratio_paired: float | None = None  # timed rows: median of ours[r] / reference[r]
    target: str | None = None  # the name of its Target; None: information only
    note: str = ""
    seconds: dict | None = None  # timed rows: every repeat's time, {"ours": [...], "ref": [...]}


def passed(row: Row, target: Target | None) -> bool | None:
    """Our value, or the ratio (the paired one when timed), checked against the target."""
    timed = row.ratio if row.ratio_paired is None else row.ratio_paired
    value = None if target is None else row.ours if target.on == "ours" else timed
    if value is None:  # no target, or a ratio without a reference
        return None
    return value <= target.bound if target.op == "<=" else value >= target.bound


class Skip(NotImplementedError):
    """A section that cannot run here; the message says why (as peak_memory_mib's)."""


def time_interleaved(
    runs: dict, repeats: int, warmup=1, prepare=None, sync=lambda: None, clock=time.perf_counter
) -> dict[str, list[float]]:
    """Seconds per call of each run, the runs interleaved: {name: [repeats timings]}.

    Repeat r calls the runs in their order when r is even and in reverse when r is odd;
    the first `warmup` repeats are not kept. `prepare[name]()` (untimed) builds an argument
    for runs[name], e.g. a fresh tokenizer. `sync` waits for the device (CUDA is async).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    prepare, names = prepare or {}, list(runs)
    times = {name: [] for name in names}
    for r in range(warmup + repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            args = (prepare[name](),) if name in prepare else ()
            sync()
            start = clock()
            runs[name](*args)
            sync()
            if r >= warmup:
                times[name].append(clock() - start)
    return times


def ratios(ours: Sequence[float], reference: Sequence[float]) -> tuple[float, float, float]:
    """ours / reference of the medians, of the minima, and the median of the paired ratios
    ours[r] / reference[r] (repeats of the same length)."""
    med = statistics.median
    paired = med(a / b for a, b in zip(ours, reference, strict=True))
    return med(ours) / med(reference), min(ours) / min(reference), paired


def timed_row(what, times, ours="ours", ref="ref", target=None, items=None) -> Row:
    """A row of ms per call from time_interleaved's times; items=(n, name), n done per call,
    puts the rates of both median runs in the note."""
    a, b = (1000 * statistics.median(times[k]) for k in (ours, ref))
    n, name = items or (0, "")
    rates = f"{1000 * n / a:,.1f} vs {1000 * n / b:,.1f} {name}/s" if items else ""
    seconds = {"ours": times[ours], "ref": times[ref]}  # for the JSON: other statistics later
    return Row(what, "ms", a, b, *ratios(times[ours], times[ref]), target, rates, seconds)


def fmt(value: float | None, unit: str = "") -> str:
    """A value as bench.md shows it: ratios to 3 places, times and sizes with their unit."""
    if value is None:
        return "-"
    if unit in ("", "real/padded"):  # ratios and efficiencies
        return f"{value:.3f}" if unit else f"{value:.2f}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def markdown(rows: list[Row], skipped: dict[str, str], meta: dict, targets: dict) -> str:
    """bench.md: a line per row, judged against its target in `targets` (name: Target)."""
    verdict = {True: "pass", False: "**FAIL**", None: "-"}
    head = "| what | ours | reference | ratio of medians | ratio of minima | paired ratio | target "
    lines = ["# Benchmarks\n", "; ".join(meta.values()) + ".\n", head + "| result |"]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        what = (f"{r.what} ({r.note})" if r.note else r.what).replace("|", "\\|")
        target = str(targets[r.target]) if r.target else "-"
        cells = [what, fmt(r.ours, r.unit), fmt(r.reference, r.unit), fmt(r.ratio)]
        cells += [fmt(r.ratio_min), fmt(r.ratio_paired), target]
        cells.append(verdict[passed(r, targets.get(r.target))])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nNotes:")
    lines += [f"- not measured: {name}: {why}" for name, why in skipped.items()]
    lines.append(
        "- ratio = ours / reference, of the times in timed rows (below 1: ours is faster). The "
        "runs are interleaved; a timed target is judged on the paired ratio, the median of "
        "ours / reference over repeats run back to back; medians and minima are shown beside."
    )
    return "\n".join(lines) + "\n"


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Memory that one call of fn adds at its peak over what was in use before it, MiB.

    CUDA: max_memory_allocated. CPU (Linux, glibc): the peak resident set (VmHWM, reset
    through /proc/self/clear_refs). glibc keeps freed blocks for reuse, which would hide a
    step's new tensors, so the mmap threshold is fixed at 64 KiB (each tensor buffer its own
    mapping, returned when freed). That slows the rest of the process: measure after timing.
    Another platform raises NotImplementedError.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - start) / 2**20
    if platform.libc_ver()[0] != "glibc":
        raise NotImplementedError(
            f"CPU memory is measured on Linux with glibc only, not {sys.platform}"
        )

    def status_mib(key: str) -> float:  # the kernel reports kB
        lines = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) for line in lines if line.startswith(key)) / 1024

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # -3: M_MMAP_THRESHOLD
    libc.malloc_trim(0)
    start = status_mib("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the resident set
    fn()
    return status_mib("VmHWM:") - start


KINDS = {  # a profiled op -> the kind of work its self time is (other aten ops: "kernels")
    "aten::mm": "dense matmuls",
    "aten::addmm": "dense matmuls",
    "aten::bmm": "attention",
    "aten::_softmax": "attention",
    "aten::_softmax_backward_data": "attention",
    "aten::random_": "dropout draws",
    "aten::bernoulli_": "dropout draws",
}
OTHER = "elementwise and other kernels"
REST = "Python and autograd's bookkeeping"


def step_shares(events, wall_us: float, data_us: float) -> dict[str, float]:
    """Shares of profiled steps' wall time (microseconds; data_us: drawing their batches)
    by kind of work: each aten op's self time by KINDS (OTHER where unnamed), everything
    under the optimizer's step and zero_grad as "AdamW", the data path, and the rest of
    the wall time: REST. events: torch.profiler's (name, self_cpu_time_total, cpu_parent)."""

    def in_optimizer(e):
        while e is not None:
            if e.name.startswith("Optimizer."):
                return True
            e = e.cpu_parent
        return False

    shares = dict.fromkeys([*dict.fromkeys(KINDS.values()), OTHER, "AdamW"], 0.0)
    for e in events:
        kind = "AdamW" if in_optimizer(e) else KINDS.get(e.name, OTHER)
        if kind == "AdamW" or e.name.startswith("aten::"):
            shares[kind] += e.self_cpu_time_total
    shares["the data path"] = data_us
    shares[REST] = wall_us - sum(shares.values())
    return {k: v / wall_us for k, v in shares.items()}
