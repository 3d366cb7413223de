"""Benchmarks: speed and memory of our from-scratch pieces against independent references.

Sections (--only): tokenizer (ours vs HF's pure-Python BertTokenizerLegacy, the target,
and its Rust one); forward (our BertModel vs transformers' with the same weights); train
(trainer.train_step vs HF's BertModel with our head and torch's AdamW; SMART vs plain);
precision (bf16 vs float32: the FFN's matmul, the forward, the train step, each step's FLOP
rate as a share of its matmul rate); compile (compiled layers vs eager); adamw (ours vs
torch's); memory (a step's peak: ours vs HF, SMART vs plain, bf16 vs float32); padding
(real / padded tokens, length buckets vs random batches).

Timed at the precision training picks. A CPU runs the embedded MiniLM at 32x64, CUDA
bert-base's shape with random weights at 8, 16 and 32 x 128. Runs are interleaved (A B,
B A, ...); a ratio is ours / reference of the medians, of the minima, and the median of the
paired ratios, on which targets are judged (a passing load slows both runs of a pair).
Misses are reported, never adjusted.

    python bench.py                                 # minutes; several times that when busy
    python bench.py --only train memory --repeats 3
"""

import argparse
import ctypes
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import datasets as data
from base_bert import BertConfig, resolve_model_dir
from bert import BertModel, mean_pool, train_step_flops
from config import OptimConfig, Stage
from losses import StepContext
from multitask_classifier import MultitaskBERT, compile_layers
from optimizer import AdamW, backward, optimizer_step
from runtime import AUTOCAST, PRECISIONS, Runtime, make_runtime, native_bf16
from smart import EMATeacher, SmartConfig
from tokenizer import BertTokenizer
from trainer import new_optimizer, train_step

RANDOM_BASE = "bert-base"  # --model: bert-base-uncased's shape with random weights
SIZES = {"cpu": ("minilm", [32], 64), "cuda": (RANDOM_BASE, [8, 16, 32], 128)}  # model, B, T
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # BertModel's, in order
SENTENCES = 2000  # SST train sentences per tokenizer run (HF's Python tokenizer is slow)


@dataclass(frozen=True)
class Target:
    on: str  # "ratio": ours / reference (timed: the median of paired ratios); "ours": ours
    op: str  # "<=" or ">="
    bound: float

    def __str__(self) -> str:
        return f"{self.on} {self.op} {self.bound:g}"


TARGETS = {
    "tokenizer": Target("ratio", "<=", 0.5),  # time: twice the pure-Python throughput
    "forward_manual": Target("ratio", "<=", 1.2),  # time, hand-written attention vs eager
    "forward_sdpa": Target("ratio", "<=", 1.05),  # time, sdpa vs sdpa: the same torch kernel
    "train_step": Target("ratio", "<=", 1.05),  # time of forward + backward + AdamW
    "smart_time": Target("ratio", "<=", 3.5),  # SMART step vs plain step
    "adamw": Target("ratio", "<=", 1.3),  # one optimizer step, like vs like
    "smart_memory": Target("ratio", "<=", 2.0),  # peak memory, SMART step vs plain step
    "bf16_step": Target("ratio", "<=", 0.6),  # time, bf16 autocast step vs float32 step
    "bf16_share": Target("ours", ">=", 0.5),  # a bf16 step's FLOP rate / the bf16 matmul's
    "padding": Target("ours", ">=", 0.9),  # real / padded tokens with length buckets (SST)
}


@dataclass
class Row:
    what: str  # what was compared with what
    unit: str  # of ours and reference
    ours: float  # timed rows: the median
    reference: float | None = None
    ratio: float | None = None  # ours / reference; timed rows: of the medians
    ratio_min: float | None = None  # timed rows: ours / reference of the minima
    ratio_paired: float | None = None  # timed rows: median of ours[r] / reference[r]
    target: str | None = None  # key of TARGETS; None: information only
    note: str = ""
    seconds: dict | None = None  # timed rows: every repeat's time, {"ours": [...], "ref": [...]}

    @property
    def passed(self) -> bool | None:
        """Our value, or the ratio (the paired one when timed), checked against the target."""
        t = TARGETS.get(self.target)
        timed = self.ratio if self.ratio_paired is None else self.ratio_paired
        value = None if t is None else self.ours if t.on == "ours" else timed
        if value is None:  # no target, or a ratio without a reference
            return None
        return value <= t.bound if t.op == "<=" else value >= t.bound


class Skip(Exception):
    """A section that cannot run here; the message says why."""


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
    rates = (
        f"{1000 * items[0] / a:,.1f} vs {1000 * items[0] / b:,.1f} {items[1]}/s" if items else ""
    )
    seconds = {"ours": times[ours], "ref": times[ref]}  # for the JSON: other statistics later
    median, minimum, paired = ratios(times[ours], times[ref])
    return Row(what, "ms", a, b, median, minimum, paired, target, rates, seconds)


@dataclass
class Context:
    rt: Runtime  # device and precision, decided as training decides them
    model: str  # encoder: a checkpoint folder or name, or RANDOM_BASE
    batch_sizes: list[int]
    length: int  # tokens per sequence of the random batches
    repeats: int  # timed repeats per comparison, after `warmup` untimed ones
    warmup: int
    data_dir: Path  # CS224n data folder
    skipped: dict = field(default_factory=dict)  # what was not measured -> why

    def time(self, runs, warmup=None, prepare=None) -> dict[str, list[float]]:
        cuda, warmup = self.rt.device.type == "cuda", self.warmup if warmup is None else warmup
        sync = partial(torch.cuda.synchronize, self.rt.device) if cuda else lambda: None
        return time_interleaved(runs, self.repeats, warmup, prepare, sync)


def our_bert(ctx: Context, attention: str = "manual") -> BertModel:
    """Our BertModel for --model: a checkpoint, or bert-base's shape with BERT's init."""
    if ctx.model == RANDOM_BASE:
        return BertModel(BertConfig(attention=attention))
    return BertModel.from_pretrained(ctx.model, attention=attention)


def encoders(ctx: Context, attention: str) -> tuple[BertModel, nn.Module]:
    """Our BertModel for --model and transformers' BertModel with the same weights, with
    'eager' attention against our hand-written one and 'sdpa' against ours."""
    import transformers  # imported where used: importing bench stays fast

    transformers.logging.set_verbosity_error()
    ours = our_bert(ctx, attention)
    cfg = {k: v for k, v in ours.config.to_dict().items() if k != "attention"}
    impl = "eager" if attention == "manual" else "sdpa"
    ref = transformers.BertModel(transformers.BertConfig(**cfg, attn_implementation=impl))
    ref.load_state_dict(ours.state_dict())  # our parameter names are HF's
    return ours.to(ctx.rt.device), ref.to(ctx.rt.device)


def random_batch(B: int, T: int, vocab_size: int, device) -> dict:
    """(B, T) random ids, lengths uniform in [T/2, T] with the first at T; SST labels (B,)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab_size, (B, T), generator=g)  # any id costs the same
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    labels = torch.randint(0, 5, (B,), generator=g)
    batch = dict(input_ids=ids * mask, attention_mask=mask, token_type_ids=0 * ids, labels=labels)
    return {k: v.to(device) for k, v in batch.items()}


def reference_step(model: nn.ModuleDict, optimizer, batch, rt: Runtime) -> None:
    """Our SST model's step written with the independent pieces: HF's BertModel, masked
    mean pooling, dropout, a linear head, cross-entropy and torch.optim.AdamW."""
    inputs = {k: batch[k] for k in INPUTS}
    with rt.autocast():
        hidden = model["bert"](**inputs).last_hidden_state  # (B, T, H)
        pooled = F.dropout(mean_pool(hidden, batch["attention_mask"]), 0.1)  # (B, H)
        loss = F.cross_entropy(model["head"](pooled).float(), batch["labels"])
    optimizer.zero_grad(set_to_none=True)
    backward(loss, rt.scaler)
    optimizer_step(optimizer, rt.scaler)


def step_runs(ctx: Context, B: int, attentions=("manual", "sdpa")) -> dict[str, Callable]:
    """Training steps on one SST batch of B x ctx.length, each a call with no argument:
    ours (trainer.train_step) and the reference per attention kind, and ours with SMART
    (float32 against autocast: bench_precision)."""
    adamw = dict(lr=1e-5, eps=1e-6, weight_decay=0.0, foreach=ctx.rt.device.type == "cuda")
    runs = {}
    for attention in attentions:
        bert, ref_bert = encoders(ctx, attention)
        ours = MultitaskBERT(bert).to(ctx.rt.device).train()
        runs[attention] = own_step(ctx, B, ctx.rt.precision, ours)
        ref = nn.ModuleDict({"bert": ref_bert, "head": nn.Linear(bert.config.hidden_size, 5)})
        ref_opt = torch.optim.AdamW(ref.to(ctx.rt.device).parameters(), **adamw)
        batch = random_batch(B, ctx.length, bert.config.vocab_size, ctx.rt.device)
        ref_rt = make_runtime(str(ctx.rt.device), ctx.rt.precision)  # its own scaler
        runs[f"hf_{attention}"] = partial(reference_step, ref, ref_opt, batch, ref_rt)
        if attention == "manual":  # the training default
            smart = SmartConfig(lambda_s=10.0, mu=1.0)
            runs["smart"] = own_step(ctx, B, ctx.rt.precision, ours, smart)
    return runs


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Memory that one call of fn adds at its peak over what was in use before it, MiB.

    CUDA: max_memory_allocated. CPU (Linux, glibc): the peak resident set (VmHWM, reset
    through /proc/self/clear_refs). glibc keeps freed blocks for reuse, which would hide a
    step's new tensors, so the mmap threshold is fixed at 64 KiB (each tensor buffer its own
    mapping, returned when freed). That slows the rest of the process: it runs after timings.
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
        raise Skip(f"CPU memory is measured on Linux with glibc only, not on {sys.platform}")

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


# ---------------------------------------------------------------------------------------
# Sections: each returns its rows, or raises Skip (or FileNotFoundError: no data)


def bench_tokenizer(ctx: Context) -> list[Row]:
    """A fresh tokenizer per run (made untimed), so our word cache starts cold: nothing to
    warm up. The embedded model's vocabulary, which is bert-base-uncased's."""
    import transformers

    texts = [e.sentence for e in data.read_task(ctx.data_dir, "sst", "train")][:SENTENCES]
    folder = str(resolve_model_dir("minilm"))
    makers = {
        "ours": lambda: BertTokenizer.from_pretrained("minilm"),
        "legacy": lambda: transformers.BertTokenizerLegacy.from_pretrained(folder),
        "fast": lambda: transformers.BertTokenizer.from_pretrained(folder),
    }

    def encode(tok):
        tok(texts, padding=False, truncation=True, max_length=128, return_tensors=None)

    times = ctx.time(dict.fromkeys(makers, encode), warmup=0, prepare=makers)
    what, items = f"tokenize {len(texts)} SST train sentences", (len(texts), "sentences")
    return [
        timed_row(f"{what}, vs HF {ref}", times, "ours", ref.split()[0], target, items)
        for ref, target in (("legacy (Python)", "tokenizer"), ("fast (Rust)", None))
    ]


def bench_forward(ctx: Context) -> list[Row]:
    """BERT forward in eval mode, without gradients, at training precision."""
    rows = []
    for attention, ref_name in (("manual", "HF eager"), ("sdpa", "HF sdpa")):
        ours, ref = (m.eval() for m in encoders(ctx, attention))
        for B in ctx.batch_sizes:
            b = random_batch(B, ctx.length, ours.config.vocab_size, ctx.rt.device)
            args = [b[k] for k in INPUTS]
            with torch.no_grad(), ctx.rt.autocast():
                times = ctx.time({"ours": partial(ours, *args), "ref": partial(ref, *args)})
            what = f"BERT forward {B}x{ctx.length} {ctx.rt.precision}, {attention} vs {ref_name}"
            rows.append(timed_row(what, times, target=f"forward_{attention}"))
    return rows


def bench_train(ctx: Context) -> list[Row]:
    """All steps of step_runs interleaved, so each ratio compares runs made side by side."""
    rows = []
    for B in ctx.batch_sizes:
        times, what = ctx.time(step_runs(ctx, B)), f"train step {B}x{ctx.length} {ctx.rt.precision}"
        rows += [
            timed_row(f"{what}, {vs}", times, ours, ref, target, (B, "examples"))
            for ours, ref, vs, target in (
                ("manual", "hf_manual", "manual vs HF eager", "train_step"),
                ("sdpa", "hf_sdpa", "sdpa vs HF sdpa", "train_step"),
                ("smart", "manual", "SMART (lambda_s=10, mu=1) vs plain", "smart_time"),
            )
            if ref in times
        ]
    return rows


def bench_adamw(ctx: Context) -> list[Row]:
    """One AdamW step on the encoder's parameters with random gradients. The optimizers
    share the parameters (each keeps its own moments): same work, one model in memory."""
    params = [nn.Parameter(p.detach()) for p in encoders(ctx, "manual")[0].parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    hyper = dict(lr=1e-5, eps=1e-6, weight_decay=0.0)  # the project's defaults
    opts = {
        "loop": AdamW(params, **hyper),
        "foreach": AdamW(params, **hyper, foreach=True),
        "torch loop": torch.optim.AdamW(params, **hyper, foreach=False),
        "torch foreach": torch.optim.AdamW(params, **hyper, foreach=True),
    }
    times = ctx.time({k: o.step for k, o in opts.items()})
    what = f"AdamW step, {sum(p.numel() for p in params) / 1e6:.1f}M parameters"
    return [
        timed_row(f"{what}, our {o} vs {r}", times, o, r, "adamw")
        for o, r in (("loop", "torch loop"), ("foreach", "torch foreach"))
    ]


def own_step(ctx: Context, B: int, precision: str, model=None, smart=None) -> partial:
    """One train_step of our SST model (by default a fresh one for --model) on the same
    B x ctx.length batch at `precision`; with SMART and its teacher when `smart` is given
    (the teacher's momentum schedule does not change a step's cost)."""
    if model is None:
        torch.manual_seed(0)  # random weights and heads: the same for every precision
        model = MultitaskBERT(our_bert(ctx)).to(ctx.rt.device).train()
    batch = random_batch(B, ctx.length, model.bert.config.vocab_size, ctx.rt.device)
    scaler = torch.amp.GradScaler(ctx.rt.device.type) if precision == "fp16" else None
    step = StepContext(Runtime(ctx.rt.device, AUTOCAST[precision], scaler))
    step.teacher = EMATeacher(model, smart) if smart else None
    stage = Stage(("sst",), lr=1e-5, batch_size=B, smart=smart or SmartConfig.off())
    foreach = ctx.rt.device.type == "cuda"
    optimizer = new_optimizer(model, OptimConfig(1e-5, foreach_adamw=foreach))
    return partial(train_step, model, optimizer, stage, [("sst", batch)], step, torch.Generator())


def matmul_rates(ctx: Context, M: int, K: int, N: int, low: str) -> tuple[dict, Row]:
    """FLOP/s of an (M, K) x (K, N) matmul in float32 and in `low`, timed interleaved."""
    g, device = torch.Generator().manual_seed(0), ctx.rt.device
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    dtypes = {"fp32": torch.float32, low: AUTOCAST[low]}
    times = ctx.time(
        {k: partial(torch.matmul, a.to(device, d), b.to(device, d)) for k, d in dtypes.items()}
    )
    rates = {k: 2 * M * K * N / statistics.median(t) for k, t in times.items()}
    row = timed_row(f"matmul {M}x{K}x{N} (the FFN's shape), {low} vs float32", times, low, "fp32")
    row.note = f"{rates[low] / 1e9:,.0f} vs {rates['fp32'] / 1e9:,.0f} GFLOP/s"
    return rates, row


def bench_precision(ctx: Context) -> list[Row]:
    """bf16 autocast (fp16 on a GPU without bf16) against float32, and compile against eager,
    all in this process; a step's FLOP rate is judged against the matmul of its precision."""
    cuda = ctx.rt.device.type == "cuda"
    if not native_bf16(ctx.rt.device) and not cuda:
        raise Skip("this CPU has no native bf16 dot products: training runs float32 here")
    low = "bf16" if native_bf16(ctx.rt.device) else "fp16"
    rows = []
    for B in ctx.batch_sizes:
        steps = {p: own_step(ctx, B, p) for p in ("fp32", low)}
        config = steps["fp32"].args[0].bert.config
        T, H = ctx.length, config.hidden_size
        rates, matmul = matmul_rates(ctx, B * T, H, config.intermediate_size, low)
        rows += [matmul, forward_row(ctx, steps["fp32"].args[0].bert, B, low)]
        times = ctx.time(steps)
        what = f"train step {B}x{T}"
        rows.append(timed_row(f"{what}, {low} vs float32", times, low, "fp32", "bf16_step"))
        flops = train_step_flops(config, B, T)
        for p, target in ((low, "bf16_share" if low == "bf16" else None), ("fp32", None)):
            rate = flops / statistics.median(times[p])
            note = f"{rate / 1e9:,.0f} GFLOP/s of {flops / 1e9:,.1f} GFLOP a step"
            share = f"{what} {p}: FLOP rate / {p} matmul rate"
            rows.append(Row(share, "", rate / rates[p], target=target, note=note))
    return rows


def forward_row(ctx: Context, bert: BertModel, B: int, low: str) -> Row:
    """Our BERT forward (eval, no gradients) under `low` autocast against float32."""
    args = [random_batch(B, ctx.length, bert.config.vocab_size, ctx.rt.device)[k] for k in INPUTS]

    def forward(precision):
        with torch.no_grad(), Runtime(ctx.rt.device, AUTOCAST[precision], None).autocast():
            bert.eval()(*args)

    times = ctx.time({p: partial(forward, p) for p in ("fp32", low)})
    bert.train()
    return timed_row(f"BERT forward {B}x{ctx.length}, {low} vs float32", times, low, "fp32")


def bench_compile(ctx: Context) -> list[Row]:
    """The train step with torch.compile'd layers against eager at the training precision,
    after compiling (timed apart, in the note): what --compile gains or costs per step."""
    B, precision = ctx.batch_sizes[-1], ctx.rt.precision
    torch.manual_seed(0)  # the eager model's weights and heads (own_step seeds the same)
    compiled = MultitaskBERT(compile_layers(our_bert(ctx))).to(ctx.rt.device).train()
    steps = {
        "eager": own_step(ctx, B, precision),
        "compiled": own_step(ctx, B, precision, compiled),
    }
    t0 = time.perf_counter()
    steps["compiled"]()  # inductor compiles on the first call (C++ on a CPU)
    seconds = time.perf_counter() - t0
    what = f"train step {B}x{ctx.length} {precision}, compiled vs eager"
    row = timed_row(what, ctx.time(steps), "compiled", "eager")
    row.note = f"compiling took {seconds:.0f} s"
    return [row]


def bench_memory(ctx: Context) -> list[Row]:
    """Peak memory of one step over what was in use before it (weights, AdamW's moments,
    the teacher), hand-written attention. After every timing: see peak_memory_mib."""
    rows, how = [], "allocator peak" if ctx.rt.device.type == "cuda" else "peak RSS"
    for B in ctx.batch_sizes:
        runs, kept = step_runs(ctx, B, ("manual",)), ("manual", "hf_manual", "smart")
        for name in kept:  # the first step makes AdamW's moments: not a step's cost
            runs[name]()
        mib = {name: peak_memory_mib(runs[name], ctx.rt.device) for name in kept}
        what = f"peak memory of a train step {B}x{ctx.length} {ctx.rt.precision}"
        for ours, ref, vs, target in (
            ("manual", "hf_manual", "ours vs HF eager", None),
            ("smart", "manual", "SMART vs plain", "smart_memory"),
        ):
            a, b = mib[ours], mib[ref]
            rows.append(Row(f"{what}, {vs}", "MiB", a, b, a / b, target=target, note=how))
    if ctx.rt.amp_dtype is not None:  # what autocast's copies and halves add or save
        B, low = ctx.batch_sizes[-1], ctx.rt.precision
        steps = {p: own_step(ctx, B, p) for p in (low, "fp32")}
        for step in steps.values():
            step()  # AdamW's moments: not a step's cost
        mib = {p: peak_memory_mib(step, ctx.rt.device) for p, step in steps.items()}
        what = f"peak memory of a train step {B}x{ctx.length}, {low} vs float32"
        rows.append(Row(what, "MiB", mib[low], mib["fp32"], mib[low] / mib["fp32"], note=how))
    return rows


def bench_padding(ctx: Context) -> list[Row]:
    """Real / padded tokens of training batches of 32, length-bucketed vs plain random."""
    tok, rows = BertTokenizer.from_pretrained("minilm"), []
    sst = data.SentenceDataset(data.read_task(ctx.data_dir, "sst", "train"), tok, 128)
    qqp = data.PairDataset(data.read_task(ctx.data_dir, "para", "train"), tok, 128)
    # siamese pairs: both sides of a batch are padded to one length
    for name, ds, sides in (("SST", sst, [sst.input_ids]), ("QQP", qqp, qqp.input_ids)):

        def efficiency(batches, sides=sides):
            return data.padding_efficiency([len(s[i]) for s in sides for i in b] for b in batches)

        g = torch.Generator().manual_seed(0)
        bucketed = efficiency(data.LengthBucketSampler(ds.lengths, 32, generator=g))
        shuffled = efficiency(data.random_batches(len(ds), 32, g))
        what = f"padding efficiency {name} train, batch 32: LengthBucketSampler vs random"
        ratio, target = bucketed / shuffled, "padding" if name == "SST" else None
        rows.append(Row(what, "real/padded", bucketed, shuffled, ratio, target=target))
    return rows


TIMED = (bench_tokenizer, bench_forward, bench_train, bench_precision, bench_compile, bench_adamw)
# memory changes malloc's settings on a CPU, so it comes after every timed section
SECTIONS = {f.__name__.removeprefix("bench_"): f for f in (*TIMED, bench_memory, bench_padding)}


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit in ("", "real/padded"):  # ratios and efficiencies
        return f"{value:.3f}" if unit else f"{value:.2f}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


VERDICT = {True: "pass", False: "**FAIL**", None: "-"}


def markdown(rows: list[Row], skipped: dict[str, str], meta: dict) -> str:
    head = "| what | ours | reference | ratio of medians | ratio of minima | paired ratio | target "
    lines = ["# Benchmarks\n", "; ".join(meta.values()) + ".\n", head + "| result |"]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        what = (f"{r.what} ({r.note})" if r.note else r.what).replace("|", "\\|")
        target = str(TARGETS[r.target]) if r.target else "-"
        cells = [what, fmt(r.ours, r.unit), fmt(r.reference, r.unit), fmt(r.ratio)]
        cells += [fmt(r.ratio_min), fmt(r.ratio_paired), target, VERDICT[r.passed]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nNotes:")
    lines += [f"- not measured: {name}: {why}" for name, why in skipped.items()]
    lines.append(
        "- ratio = ours / reference, of the times in timed rows (below 1: ours is faster). The "
        "runs are interleaved; a timed target is judged on the paired ratio, the median of "
        "ours / reference over repeats run back to back; medians and minima are shown beside."
    )
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # fmt: off
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION",
                   help=f"run only these sections, of: {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--device", default="auto",
                   help="'auto' (CUDA if present, the default), 'cpu' or 'cuda'")
    p.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="of the rows at training precision (default: auto, as training picks)")
    p.add_argument("--model", help=f"encoder of forward, train, adamw and memory: a checkpoint "
                   f"folder, 'minilm' (embedded) or '{RANDOM_BASE}' (its shape, random weights); "
                   f"default: minilm on a CPU, {RANDOM_BASE} on CUDA")
    p.add_argument("--batch_sizes", type=int, nargs="+", metavar="B",
                   help="batch sizes of forward, train and memory (default: 32; 8 16 32 on CUDA)")
    p.add_argument("--length", type=int, metavar="T",
                   help="tokens per sequence of those batches (default: 64; 128 on CUDA)")
    p.add_argument("--repeats", type=int, default=7,
                   help="timed repeats of every comparison (default: 7)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repeats before them (default: 1)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: 0, "
                   "torch's choice, as in training); 1 spares each op the stalls at thread "
                   "barriers that a machine busy with other work causes")
    p.add_argument("--data_dir", help="CS224n data folder (default: $MINBERT_DATA, else data/)")
    p.add_argument("--out", default="bench-results",
                   help="folder for bench.json and bench.md (default: bench-results)")
    # fmt: on
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.threads < 0:
        p.error("need --repeats >= 1, --warmup >= 0 and --threads >= 0")
    return args


def main(argv=None) -> int:
    import transformers

    args = parse_args(argv)
    rt = make_runtime(args.device, args.precision)  # as training would pick it
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = rt.device.type == "cuda"
    given, defaults = (args.model, args.batch_sizes, args.length), SIZES["cuda" if cuda else "cpu"]
    sizes = [arg or default for arg, default in zip(given, defaults, strict=True)]
    ctx = Context(rt, *sizes, args.repeats, args.warmup, data.data_dir(args.data_dir))
    meta = {
        "device": f"{torch.cuda.get_device_name(rt.device) if cuda else 'CPU'}, {ctx.rt.precision}",
        "torch": f"torch {torch.__version__} ({torch.get_num_threads()} threads)",
        "transformers": f"transformers {transformers.__version__}",
        "sizes": f"model {ctx.model}, batches {ctx.batch_sizes} x {ctx.length}",
        "repeats": f"{ctx.repeats} timed repeats after {ctx.warmup} warm-up",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print("; ".join(meta.values()))
    rows, start = [], time.perf_counter()
    for section in (s for s in SECTIONS if s in (args.only or SECTIONS)):
        torch.manual_seed(0)  # dropout and random weights: the same draws every run
        t0 = time.perf_counter()
        try:
            new = SECTIONS[section](ctx)
        except (Skip, FileNotFoundError) as e:  # e.g. no data: say so, measure the rest
            ctx.skipped[section], new = str(e), []
        for r in new:
            print(f"[{section}]", r.what, fmt(r.ours, r.unit), fmt(r.ratio), fmt(r.ratio_min))
        print(f"[{section}]", ctx.skipped.get(section, f"{time.perf_counter() - t0:.0f} s"))
        rows += new
    meta["seconds"] = f"{time.perf_counter() - start:.0f} s"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"meta": meta, "targets": {k: str(t) for k, t in TARGETS.items()}}
    record |= {"skipped": ctx.skipped, "rows": [asdict(r) | {"passed": r.passed} for r in rows]}
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "bench.md").write_text(markdown(rows, ctx.skipped, meta))
    print("\n" + (out / "bench.md").read_text() + f"written to {out}/bench.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
