"""Benchmarks: each of our from-scratch pieces against an independent reference, on one device.

References: Hugging Face transformers' BertModel, BertTokenizerLegacy (pure Python) and
BertTokenizer (Rust); torch.optim.AdamW. Every figure is measured in ONE process as a ratio
ours / reference, timed interleaved: each repeat runs ours and the reference back to back,
in alternating order (A B, B A, ...), so a machine that speeds up or slows down during the
run hits both alike. A figure is the median of several repeats after a warm-up. Targets live
in TARGETS below; a missed target is reported as missed, never adjusted.

    python bench.py                    # everything: under 3 minutes on a 2-core CPU
    python bench.py --quick            # fewer repeats and a smaller tokenizer corpus
    python bench.py --only tokenizer   # one section

Results go to bench-results/bench.json and bench-results/bench.md (also printed).
"""

import argparse
import ctypes
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import base_bert
import datasets as data
import multitask_classifier as mt
from bert import BertModel, mean_pool
from optimizer import AdamW
from smart import EMATeacher, SmartConfig
from tokenizer import BertTokenizer

# ---------------------------------------------------------------------------------------
# Targets and result rows


@dataclass(frozen=True)
class Target:
    on: str  # "ratio": ours / reference; "ours": our value itself
    op: str  # "<=" or ">="
    bound: float

    def passed(self, ours: float, ratio: float | None) -> bool:
        value = ratio if self.on == "ratio" else ours
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def __str__(self) -> str:
        return f"{self.on} {self.op} {self.bound:g}"


TARGETS = {
    "forward_sdpa": Target("ratio", "<=", 1.0),  # time, our sdpa vs HF sdpa
    "forward_manual": Target("ratio", "<=", 1.2),  # time, hand-written attention vs HF eager
    "train_step": Target("ratio", "<=", 1.05),  # time of forward + backward + AdamW
    "adamw": Target("ratio", "<=", 1.3),  # time of one optimizer step, like vs like
    "tokenizer": Target("ratio", ">=", 2.0),  # throughput vs HF's pure-Python tokenizer
    "smart_time": Target("ratio", "<=", 3.5),  # SMART step vs plain step
    "smart_memory": Target("ratio", "<=", 2.0),  # peak memory, SMART step vs plain step
    "padding": Target("ours", ">=", 0.9),  # real / padded tokens with length bucketing (SST)
}


@dataclass
class Row:
    section: str  # which part of the bench produced it
    what: str  # what was compared with what
    unit: str  # unit of ours and reference
    ours: float
    reference: float | None  # None: nothing to compare with (ratio and target empty)
    ratio: float | None = None  # ours / reference (timed rows: median / median)
    target: str | None = None  # key of TARGETS, None for information only
    note: str = ""

    def __post_init__(self):
        if self.ratio is None and self.reference:
            self.ratio = self.ours / self.reference

    @property
    def passed(self) -> bool | None:
        if self.target is None or (TARGETS[self.target].on == "ratio" and self.ratio is None):
            return None
        return TARGETS[self.target].passed(self.ours, self.ratio)


class Skip(Exception):
    """A section that cannot run here; the message says why."""


# ---------------------------------------------------------------------------------------
# Pure helpers (tested in tests/test_bench.py)


def time_interleaved(
    runs: dict[str, Callable],
    repeats: int,
    warmup: int = 1,
    prepare: dict[str, Callable[[], object]] | None = None,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each run, the runs interleaved: {name: [repeats timings]}.

    Repeat r calls the runs in their order when r is even and in reverse when r is odd.
    The first `warmup` repeats are not kept. `prepare[name]()` (untimed) builds an argument
    for runs[name], e.g. a fresh tokenizer; runs without one are called with no argument.
    `sync` waits for the device (CUDA kernels are asynchronous).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    prepare = prepare or {}
    names = list(runs)
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


def ratio_of_medians(ours: Sequence[float], reference: Sequence[float]) -> float:
    """median(ours) / median(reference)."""
    return statistics.median(ours) / statistics.median(reference)


def padding_efficiency(batches: Iterable[Sequence[int]]) -> float:
    """Real tokens / padded tokens when each batch is padded to its longest sequence.

    batches: the sequence lengths of each batch; [[2, 4]] -> 6 / 8 = 0.75.
    """
    real = padded = 0
    for lengths in batches:
        real += sum(lengths)
        padded += len(lengths) * max(lengths, default=0)
    if padded == 0:
        raise ValueError("padding_efficiency: no tokens in the batches")
    return real / padded


def random_batches(n: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffled indices 0..n-1 cut into batches: a plain DataLoader(shuffle=True)."""
    order = torch.randperm(n, generator=generator).tolist()
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


# ---------------------------------------------------------------------------------------
# Measuring on the device


@dataclass
class Context:
    device: torch.device
    rt: mt.Runtime  # precision of training steps (bf16 autocast on CUDA), as in training
    repeats: int  # timed repeats per figure
    warmup: int  # untimed repeats before them
    quick: bool  # smaller inputs
    data_dir: Path  # CS224n data folder
    gpu_model: str  # checkpoint for the GPU-only section
    skipped: dict = field(default_factory=dict)  # what could not be measured -> why

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, runs, warmup=None, prepare=None) -> dict[str, list[float]]:
        warmup = self.warmup if warmup is None else warmup
        return time_interleaved(runs, self.repeats, warmup, prepare, self.sync)


def _proc_status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # the kernel reports kB
    raise KeyError(field)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Memory that one call of fn adds at its peak over what was in use when it started, MiB.

    CUDA: the caching allocator's max_memory_allocated minus memory_allocated at the start.
    CPU (Linux with glibc only): the process's peak resident set (VmHWM, reset by writing 5
    to /proc/self/clear_refs) minus its resident set at the start. glibc keeps freed blocks
    for reuse, which would hide a step's new tensors, so the mmap threshold is first fixed at
    64 KiB: every tensor buffer above that is a mapping of its own, returned when freed. This
    slows later allocations, so run it after the CPU timings. Freed blocks already in the heap
    are reused first, so malloc_trim gives their pages back: reusing them shows again. What
    remains is fragmentation, which the peak includes (as a real run's memory does).
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - start) / 2**20
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        raise Skip(f"CPU memory is measured on Linux with glibc only, not on {sys.platform}")
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
    libc.malloc_trim(0)  # gives back the free pages inside the heap too
    start = _proc_status_mib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    fn()
    return _proc_status_mib("VmHWM") - start


def random_batch(B: int, T: int, vocab_size: int, device, seed: int = 0) -> dict:
    """Random ids with a realistic mask: lengths uniform in [T/2, T], the first one T.

    Also SST-like labels (5 classes). Tensors are (B, T) long, labels (B,) long.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(999, vocab_size, (B, T), generator=g)  # 999+: word pieces, no specials
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    batch = {
        "input_ids": ids * mask,  # [PAD] = 0 after the end
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "labels": torch.randint(0, 5, (B,), generator=g),
    }
    return {k: v.to(device) for k, v in batch.items()}


def hf_bert(model_dir: Path, attention: str, device):
    """transformers' BertModel on the same checkpoint, with 'eager' or 'sdpa' attention."""
    import transformers  # the references are imported where used: importing bench stays fast

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    impl = "eager" if attention == "manual" else attention
    model = transformers.BertModel.from_pretrained(str(model_dir), attn_implementation=impl)
    return model.to(device)


class HFClassifier(nn.Module):
    """The reference training model: HF's BertModel, masked mean pooling, dropout, a linear head
    (our sentiment model's architecture, written with the independent encoder)."""

    def __init__(self, bert, num_labels: int = 5, dropout: float = 0.1):
        super().__init__()
        self.bert, self.dropout = bert, nn.Dropout(dropout)
        self.head = nn.Linear(bert.config.hidden_size, num_labels)

    def forward(self, batch):
        out = self.bert(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
        )
        pooled = mean_pool(out.last_hidden_state, batch["attention_mask"])  # (B, H)
        return self.head(self.dropout(pooled))  # (B, C)


def reference_step(model: HFClassifier, optimizer, batch, rt: mt.Runtime):
    with rt.autocast():
        loss = F.cross_entropy(model(batch).float(), batch["labels"])
    mt.optimizer_step(loss, optimizer, rt)


def our_step(model, optimizer, batch, rt: mt.Runtime, smart: SmartConfig, teacher=None):
    """One step of the training loop (multitask_classifier.train_stage) on an SST batch."""
    loss = mt.batch_loss(model, "sst", batch, smart, teacher, rt)
    mt.optimizer_step(loss, optimizer, rt)
    if teacher is not None:
        teacher.update(model, smart.beta_start)


def precision(rt: mt.Runtime) -> str:
    """'float32', or the autocast dtype training uses on this device ('bfloat16' on most GPUs)."""
    return str(rt.amp_dtype or torch.float32).removeprefix("torch.")


def our_model(name: str, attention: str, device) -> mt.MultitaskBERT:
    return mt.MultitaskBERT(BertModel.from_pretrained(name, attention=attention)).to(device)


def timed_row(section, what, times, ours="ours", ref="ref", target=None, note="") -> Row:
    """A timing row in milliseconds from time_interleaved's result."""
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    ratio = ratio_of_medians(times[ours], times[ref])
    return Row(section, what, "ms", ms[ours], ms[ref], ratio, target, note)


# ---------------------------------------------------------------------------------------
# Sections


def forward_rows(ctx: Context, attention: str) -> list[Row]:
    """Our BertModel vs HF's with the matching attention, batches of 32 x 64 and 32 x 128."""
    ours = BertModel.from_pretrained("minilm", attention=attention).to(ctx.device).eval()
    ref = hf_bert(base_bert.resolve_model_dir("minilm"), attention, ctx.device).eval()
    kind = "hand-written attention vs HF eager" if attention == "manual" else "sdpa vs HF sdpa"
    rows = []
    for T in (64, 128):
        b = random_batch(32, T, ours.config.vocab_size, ctx.device)
        args = (b["input_ids"], b["attention_mask"], b["token_type_ids"])
        with torch.no_grad():
            diff = (ours(*args)["last_hidden_state"] - ref(*args).last_hidden_state).abs().max()
            times = ctx.time({"ours": partial(ours, *args), "ref": partial(ref, *args)})
        target = "forward_manual" if attention == "manual" else "forward_sdpa"
        note = f"largest difference from HF {diff:.1e}"
        rows.append(
            timed_row("forward", f"BERT forward 32x{T}, {kind}", times, target=target, note=note)
        )
    return rows


def bench_forward(ctx: Context) -> list[Row]:
    """BERT forward (eval, no_grad, float32) of the embedded model vs HF's, per attention kind."""
    return [row for attention in ("manual", "sdpa") for row in forward_rows(ctx, attention)]


def train_pair(ctx: Context, model_dir: Path, attention: str):
    """Our multitask model and the HF reference on one checkpoint, each with its AdamW.

    Both optimizers take torch.optim.AdamW's default path for the device (foreach on CUDA,
    a loop on the CPU) and the project's default hyperparameters (no weight decay).
    """
    foreach = ctx.device.type == "cuda"
    ours = our_model(str(model_dir), attention, ctx.device).train()
    ref = HFClassifier(hf_bert(model_dir, attention, ctx.device)).to(ctx.device).train()
    ours_opt = AdamW(ours.parameters(), lr=1e-5, foreach=foreach)
    ref_opt = torch.optim.AdamW(
        ref.parameters(), lr=1e-5, eps=1e-6, weight_decay=0.0, foreach=foreach
    )
    return ours, ours_opt, ref, ref_opt


def train_row(ctx: Context, attention: str) -> Row:
    model_dir = base_bert.resolve_model_dir("minilm")
    ours, ours_opt, ref, ref_opt = train_pair(ctx, model_dir, attention)
    ref_rt = mt.make_runtime(str(ctx.device), ctx.rt.amp_dtype is not None)  # its own scaler
    batch = random_batch(32, 64, ours.bert.config.vocab_size, ctx.device)
    plain = SmartConfig(lambda_s=0.0, mu=0.0)
    times = ctx.time(
        {
            "ours": lambda: our_step(ours, ours_opt, batch, ctx.rt, plain),
            "ref": lambda: reference_step(ref, ref_opt, batch, ref_rt),
        }
    )
    kind = "manual vs HF eager" if attention == "manual" else "sdpa vs HF sdpa"
    what = f"train step 32x64, {kind}, {precision(ctx.rt)}"
    return timed_row("train", what, times, target="train_step")


def bench_train_step(ctx: Context) -> list[Row]:
    """Forward + backward + AdamW of the multitask model vs HF BertModel + head + torch AdamW."""
    return [train_row(ctx, attention) for attention in ("manual", "sdpa")]


def bench_adamw(ctx: Context) -> list[Row]:
    """One AdamW step on the embedded model's parameters with random gradients."""
    model = BertModel.from_pretrained("minilm")
    params = [nn.Parameter(p.detach().to(ctx.device, copy=True)) for p in model.parameters()]
    g = torch.Generator(device=ctx.device).manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, device=ctx.device)
    # The optimizers share the parameters (each keeps its own moments): updating the same
    # tensors costs the same, and the memory stays at one model. Hyperparameters are the
    # project's defaults (no weight decay) for all four.
    hyper = dict(lr=1e-5, eps=1e-6, weight_decay=0.0)
    opts = {
        "loop": AdamW(params, **hyper),
        "foreach": AdamW(params, **hyper, foreach=True),
        "torch_loop": torch.optim.AdamW(params, **hyper, foreach=False),
        "torch_foreach": torch.optim.AdamW(params, **hyper, foreach=True),
    }
    times = ctx.time({k: o.step for k, o in opts.items()})
    what = f"AdamW step, {sum(p.numel() for p in params) / 1e6:.1f}M parameters"
    pairs = [  # (ours, reference, target)
        ("loop", "torch_loop", "adamw"),
        ("foreach", "torch_foreach", "adamw"),
        ("loop", "torch_foreach", None),
    ]
    return [
        timed_row("adamw", f"{what}, our {o} vs {r.replace('_', ' ')}", times, o, r, target)
        for o, r, target in pairs
    ]


def _need_data(ctx: Context, *tasks: str) -> None:
    for task in tasks:
        path = data.task_file(ctx.data_dir, task, "train")
        if not path.is_file():
            raise Skip(f"no {path}; set MINBERT_DATA (or --data_dir) to the CS224n data folder")


def bench_tokenizer(ctx: Context) -> list[Row]:
    """Sentences per second on SST train, each timed run with a fresh tokenizer (cold cache)."""
    import transformers

    _need_data(ctx, "sst")
    texts = [e.sentence for e in data.read_task(ctx.data_dir, "sst", "train")]
    texts = texts[:1000] if ctx.quick else texts
    model_dir = base_bert.resolve_model_dir("minilm")
    makers = {
        "ours": lambda: BertTokenizer.from_pretrained("minilm"),
        "legacy": lambda: transformers.BertTokenizerLegacy.from_pretrained(str(model_dir)),
        "fast": lambda: transformers.BertTokenizer.from_pretrained(str(model_dir)),
    }
    ids = {}

    def run(name):
        def encode(tok):
            out = tok(texts, padding=False, truncation=True, max_length=128, return_tensors=None)
            ids[name] = out["input_ids"]

        return encode

    # Every run starts from a fresh tokenizer (made untimed): there is nothing to warm up.
    times = ctx.time({name: run(name) for name in makers}, warmup=0, prepare=makers)
    rate = {k: len(texts) / statistics.median(v) for k, v in times.items()}
    differ = sum(a != b for a, b in zip(ids["ours"], ids["fast"], strict=True))
    what = f"tokenize SST train ({len(texts)} sentences, fresh tokenizer per run)"
    legacy = Row(
        "tokenizer",
        f"{what} vs HF legacy (Python)",
        "sent/s",
        rate["ours"],
        rate["legacy"],
        target="tokenizer",
    )
    fast = Row(
        "tokenizer",
        f"{what} vs HF fast (Rust)",
        "sent/s",
        rate["ours"],
        rate["fast"],
        note=f"ids differ from HF fast on {differ} sentences",
    )
    return [legacy, fast]


def bench_smart(ctx: Context) -> list[Row]:
    """SMART step (lambda_s=10, mu=1, EMA teacher) vs a plain step: time and peak memory."""
    model = our_model("minilm", "manual", ctx.device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5, foreach=ctx.device.type == "cuda")
    teacher = EMATeacher(model)
    smart, plain = SmartConfig(lambda_s=10.0, mu=1.0), SmartConfig(lambda_s=0.0, mu=0.0)
    batch = random_batch(32, 64, model.bert.config.vocab_size, ctx.device)
    steps = {
        "smart": lambda: our_step(model, optimizer, batch, ctx.rt, smart, teacher),
        "plain": lambda: our_step(model, optimizer, batch, ctx.rt, plain),
    }
    times = ctx.time(steps)
    what = "SST step 32x64, SMART (lambda_s=10, mu=1, 1 ascent step) vs plain"
    rows = [timed_row("smart", f"{what}: time", times, "smart", "plain", "smart_time")]
    try:
        mem = {k: peak_memory_mib(step, ctx.device) for k, step in steps.items()}
    except Skip as e:
        ctx.skipped["smart memory"] = str(e)
        return rows
    how = "allocator peak" if ctx.device.type == "cuda" else "peak RSS"
    note = f"{how} over the step's start (weights, AdamW state, teacher already there)"
    rows.append(
        Row(
            "smart",
            f"{what}: peak memory",
            "MiB",
            mem["smart"],
            mem["plain"],
            target="smart_memory",
            note=note,
        )
    )
    return rows


def bench_padding(ctx: Context) -> list[Row]:
    """Real / padded tokens of training batches of 32, length-bucketed vs plain random."""
    _need_data(ctx, "sst", "para")
    tok = BertTokenizer.from_pretrained("minilm")
    rows = []
    for task in ("sst", "para"):
        examples = data.read_task(ctx.data_dir, task, "train")
        if task == "sst":
            ds = data.SentenceDataset(examples, tok, max_length=128)
            sides = [[len(x) for x in ds.input_ids]]
        else:  # siamese pairs: both sides of a batch are padded to one length
            ds = data.PairDataset(examples, tok, max_length=128)
            sides = [[len(x) for x in side] for side in ds.input_ids]

        def lengths(batches, sides=sides):
            return [[s[i] for s in sides for i in b] for b in batches]

        g = torch.Generator().manual_seed(0)
        bucketed = list(data.LengthBucketSampler(ds.lengths, 32, shuffle=True, generator=g))
        plain = random_batches(len(ds), 32, g)
        name = "SST" if task == "sst" else "QQP"
        rows.append(
            Row(
                "padding",
                f"padding efficiency {name} train, batch 32: LengthBucketSampler vs random",
                "real/padded",
                padding_efficiency(lengths(bucketed)),
                padding_efficiency(lengths(plain)),
                target="padding" if task == "sst" else None,
            )
        )
    return rows


def local_checkpoint(name: str) -> Path:
    """A folder, or a hub name already in the local Hugging Face cache; never downloads."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as e:  # not cached, or huggingface_hub missing
        raise Skip(
            f"{name} is not a folder nor in the local Hugging Face cache ({type(e).__name__}); "
            "the bench never downloads: fetch it once online or pass --gpu_model FOLDER"
        ) from None


def gpu_rows(ctx: Context, model_dir: Path, attention: str) -> list[Row]:
    """Plain steps at batch 32 (ours vs HF) and SMART vs plain at batch 8, T = 128."""
    T = 128  # the training default --max_length
    ours, ours_opt, ref, ref_opt = train_pair(ctx, model_dir, attention)
    ref_rt = mt.make_runtime(str(ctx.device), ctx.rt.amp_dtype is not None)
    teacher = EMATeacher(ours)
    plain, smart = SmartConfig(lambda_s=0.0, mu=0.0), SmartConfig(lambda_s=10.0, mu=1.0)
    vocab = ours.bert.config.vocab_size
    b32, b8 = random_batch(32, T, vocab, ctx.device), random_batch(8, T, vocab, ctx.device)
    steps = {
        "ours": lambda: our_step(ours, ours_opt, b32, ctx.rt, plain),
        "ref": lambda: reference_step(ref, ref_opt, b32, ref_rt),
        "smart8": lambda: our_step(ours, ours_opt, b8, ctx.rt, smart, teacher),
        "plain8": lambda: our_step(ours, ours_opt, b8, ctx.rt, plain),
    }
    times = ctx.time(steps)
    mem = {k: peak_memory_mib(step, ctx.device) for k, step in steps.items()}
    tokens = {"ours": b32, "ref": b32, "smart8": b8, "plain8": b8}
    tps = {k: b["input_ids"].numel() / statistics.median(times[k]) for k, b in tokens.items()}
    what = f"{Path(ctx.gpu_model).name} train step, {attention} attention, {precision(ctx.rt)}"
    vs_hf = f"{what}, batch 32x{T} vs HF {'eager' if attention == 'manual' else 'sdpa'}"
    vs_plain = f"{what}, SMART batch 8x{T} vs plain 8x{T}"
    return [
        Row("gpu", vs_hf, "tokens/s", tps["ours"], tps["ref"]),
        Row("gpu", vs_hf, "MiB", mem["ours"], mem["ref"], note="peak memory"),
        Row("gpu", vs_plain, "tokens/s", tps["smart8"], tps["plain8"]),
        Row("gpu", vs_plain, "MiB", mem["smart8"], mem["plain8"], note="peak memory"),
    ]


def bench_gpu_base(ctx: Context) -> list[Row]:
    """bert-base-uncased training throughput and peak memory at the thesis batch sizes."""
    if ctx.device.type != "cuda":
        raise Skip("GPU only: bert-base training throughput is not measured on a CPU")
    model_dir = local_checkpoint(ctx.gpu_model)
    return [row for attention in ("manual", "sdpa") for row in gpu_rows(ctx, model_dir, attention)]


# SMART changes malloc's settings to measure CPU memory, so it runs after the CPU timings.
SECTIONS = {
    "forward": bench_forward,
    "train": bench_train_step,
    "adamw": bench_adamw,
    "tokenizer": bench_tokenizer,
    "smart": bench_smart,
    "padding": bench_padding,
    "gpu": bench_gpu_base,
}


# ---------------------------------------------------------------------------------------
# Report


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "real/padded":
        return f"{value:.3f}"
    if unit in ("sent/s", "tokens/s"):
        return f"{value:,.0f} {unit}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def markdown(rows: list[Row], skipped: dict[str, str], meta: dict) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"{meta['device']}, torch {meta['torch']} ({meta['threads']} threads), transformers "
        f"{meta['transformers']}, {meta['repeats']} timed repeats after {meta['warmup']} "
        f"warm-up{'s' if meta['warmup'] != 1 else ''}, {meta['date']}.",
        "",
        "| what | ours | reference | ratio | target | result |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        target = str(TARGETS[r.target]) if r.target else "-"
        result = {True: "pass", False: "**FAIL**", None: "-"}[r.passed]
        what = (f"{r.what} ({r.note})" if r.note else r.what).replace("|", "\\|")
        lines.append(
            f"| {what} | {format_value(r.ours, r.unit)} | {format_value(r.reference, r.unit)} "
            f"| {ratio} | {target} | {result} |"
        )
    lines += ["", "Notes:"]
    for r in rows:
        if r.passed is False:
            t = TARGETS[r.target]
            value = r.ratio if t.on == "ratio" else r.ours
            lines.append(f"- target missed: {r.what}: {t.on} {value:.3f}, target {t}.")
    for name, reason in skipped.items():
        lines.append(f"- not measured: {name}: {reason}")
    lines += [
        "- ratio = ours / reference; for times, median over median of the interleaved repeats.",
        "- forward and train inputs: random ids, lengths uniform in [T/2, T] with the first at T.",
        "- tokenizers: every timed run builds a fresh tokenizer (untimed), so our word cache "
        "starts cold; ids come back as Python lists for all three.",
        "- CPU peak memory: peak resident set (VmHWM) over the resident set at the step's start, "
        "with glibc's mmap threshold fixed at 64 KiB so freed tensors leave the process; "
        "CUDA: max_memory_allocated over memory_allocated at the start.",
        "- Other processes on the machine make CPU timings noisy; rerun on a quiet machine.",
    ]
    return "\n".join(lines) + "\n"


def write_results(rows, skipped, meta, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "meta": meta,
        "targets": {k: str(t) for k, t in TARGETS.items()},
        "rows": [asdict(r) | {"passed": r.passed} for r in rows],
        "skipped": skipped,
    }
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    text = markdown(rows, skipped, meta)
    (out / "bench.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time our BERT, training step, AdamW, tokenizer and SMART against "
        "their references; write bench-results/bench.{json,md}.",
    )
    p.add_argument("--quick", action="store_true", help="1 repeat, 1000 SST sentences: a smoke run")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3; quick 1)")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed repeats before the timed ones (default 1)"
    )
    p.add_argument(
        "--only", choices=list(SECTIONS), default=None, help="run this section only (default: all)"
    )
    p.add_argument(
        "--device", default="auto", help="'auto' (default: CUDA if present), 'cpu' or 'cuda'"
    )
    p.add_argument(
        "--out",
        default="bench-results",
        help="folder for bench.json and bench.md (default bench-results)",
    )
    p.add_argument(
        "--data_dir", default=None, help="CS224n data folder (default $MINBERT_DATA, else data/)"
    )
    p.add_argument(
        "--gpu_model",
        default="bert-base-uncased",
        help="GPU section: a checkpoint folder, or a hub name already in the local Hugging Face "
        "cache (default bert-base-uncased)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="torch.manual_seed before each section (default 0)"
    )
    args = p.parse_args(argv)
    args.repeats = args.repeats if args.repeats is not None else 1 if args.quick else 3
    if args.repeats < 1 or args.warmup < 0:
        p.error(f"need --repeats >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device is available here")
    rt = mt.make_runtime(args.device, amp=True)
    ctx = Context(
        rt.device,
        rt,
        args.repeats,
        args.warmup,
        args.quick,
        data.data_dir(args.data_dir),
        args.gpu_model,
    )
    import transformers

    name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "CPU"
    meta = {
        "device": f"{rt.device.type} ({name})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"device {meta['device']}, torch threads {meta['threads']}, repeats {args.repeats}")
    rows, skipped = [], ctx.skipped
    start = time.perf_counter()
    for section, run in SECTIONS.items():
        if args.only and section != args.only:
            continue
        torch.manual_seed(args.seed)
        t0 = time.perf_counter()
        try:
            new = run(ctx)
        except Skip as e:
            skipped[section] = str(e)
            print(f"[{section}] skipped: {e}")
            continue
        rows += new
        for r in new:
            ratio = "" if r.ratio is None else f"  ratio {r.ratio:.2f}"
            print(f"[{section}] {r.what}: {format_value(r.ours, r.unit)}{ratio}")
        print(f"[{section}] {time.perf_counter() - t0:.0f} s")
    meta["seconds"] = round(time.perf_counter() - start, 1)
    print()
    print(write_results(rows, skipped, meta, Path(args.out)), end="")
    print(f"written to {args.out}/bench.json and bench.md in {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
