"""Benchmarks: speed and memory of our from-scratch pieces against independent references.

Sections (--only): tokenizer (ours vs HF's pure-Python BertTokenizerLegacy, the target,
and its Rust one); forward (our BertModel vs transformers' with the same weights); train
(trainer.train_step vs HF's BertModel with our head and torch's AdamW; SMART vs plain);
float32 (the demo's QQP step as a run builds it: its FLOP rate against float32 matmuls at
its shape, and its time by kind of work from torch.profiler); precision (bf16 vs float32:
auto's probe, the FFN's matmul, the forward, the train step, each step's FLOP rate as a
share of its matmul rate); compile (compiled layers vs eager); adamw (ours vs torch's);
memory (a step's peak: ours vs HF, SMART vs plain, bf16 vs float32); padding (real /
padded tokens, length buckets vs random batches).

Timed at the precision training picks, at the sizes of --model, --batch_sizes and --length.
Runs are interleaved (A B, B A, ...); a ratio is ours / reference of the medians, of the
minima, and the median of the paired ratios, on which targets are judged (a passing load
slows both runs of a pair). Misses are reported, never adjusted.

    python -m lab.bench                                 # minutes; several times that when busy
    python -m lab.bench --only train memory --repeats 3
"""

import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch import nn

import batches
import datasets as data
import trainer
from base_bert import BertConfig, ours_to_hf, resolve_model_dir
from bert import BertLayer, BertModel, mean_pool
from commands import cli
from commands.command import PROBE_TOKENS
from engine import runtime
from engine.runtime import (
    AUTOCAST,
    PRECISIONS,
    Runtime,
    layer_times,
    make_runtime,
    native_bf16,
    pick_precision,
)
from lab.measures import padding_efficiency, random_batches, train_step_flops
from lab.timing import (
    Row,
    Skip,
    Target,
    fmt,
    markdown,
    passed,
    peak_memory_mib,
    step_shares,
    time_interleaved,
    timed_row,
)
from optimizer import AdamW
from presets import PRESETS, Stage
from sbert import SentenceBERT
from settings import OptimConfig, option
from smart import EMATeacher, SmartConfig
from tokenizer import BertTokenizer
from trainer import StepContext, train_step

RANDOM_BASE = "bert-base"  # --model: bert-base-uncased's shape with random weights
SIZES = {"cpu": ("minilm", [32], 64), "cuda": (RANDOM_BASE, [8, 16, 32], 128)}  # model, B, T
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # BertModel's, in order
SENTENCES = 2000  # SST train sentences per tokenizer run (HF's Python tokenizer is slow)
ADAMW = dict(lr=1e-5, eps=1e-6, weight_decay=0.0)  # the project's AdamW settings
SMART = SmartConfig(lambda_s=10.0, mu=1.0, dropout="independent")  # the thesis presets'


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
class Context:
    rt: Runtime  # device and precision, decided as training decides them
    model: str  # encoder: a checkpoint folder or name, or RANDOM_BASE
    batch_sizes: list[int]
    length: int  # tokens per sequence of the random batches
    repeats: int  # timed repeats per comparison, after `warmup` untimed ones
    warmup: int
    data_dir: Path  # CS224n data folder
    skipped: dict = field(default_factory=dict)  # what was not measured -> why

    @property
    def cuda(self) -> bool:
        return self.rt.device.type == "cuda"

    def time(self, runs, warmup=None, prepare=None) -> dict[str, list[float]]:
        warmup = self.warmup if warmup is None else warmup
        sync = partial(torch.cuda.synchronize, self.rt.device) if self.cuda else lambda: None
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
    ref.load_state_dict({ours_to_hf(k): v for k, v in ours.state_dict().items()})
    return ours.to(ctx.rt.device), ref.to(ctx.rt.device)


def random_batch(ctx: Context, B: int, vocab_size: int) -> dict:
    """(B, T = ctx.length) random ids, lengths uniform in [T/2, T], the first T; labels (B,)."""
    g, T = torch.Generator().manual_seed(0), ctx.length
    ids = torch.randint(1, vocab_size, (B, T), generator=g)  # any id costs the same
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    labels = torch.randint(0, 5, (B,), generator=g)
    batch = dict(input_ids=ids * mask, attention_mask=mask, token_type_ids=0 * ids, labels=labels)
    return {k: v.to(ctx.rt.device) for k, v in batch.items()}


def reference_step(model: nn.ModuleDict, optimizer, batch, rt: Runtime) -> None:
    """Our SST model's step written with the independent pieces: HF's BertModel, masked
    mean pooling, dropout, a linear head, cross-entropy and torch.optim.AdamW."""
    inputs = {k: batch[k] for k in INPUTS}
    with rt.autocast():
        hidden = model["bert"](**inputs).last_hidden_state  # (B, T, H)
        pooled = F.dropout(mean_pool(hidden, batch["attention_mask"]), 0.1)  # (B, H)
        loss = F.cross_entropy(model["head"](pooled).float(), batch["labels"])
    optimizer.zero_grad(set_to_none=True)
    rt.scaler.scale(loss).backward()  # train_step's update, unclipped
    rt.scaler.unscale_(optimizer)
    rt.scaler.step(optimizer)
    rt.scaler.update()


def step_runs(ctx: Context, B: int, attentions=("manual", "sdpa")) -> dict[str, Callable]:
    """Training steps on one SST batch of B x ctx.length, each a call with no argument:
    ours (trainer.train_step) and the reference per attention kind, and ours with SMART
    (float32 against autocast: bench_precision)."""
    device, runs = ctx.rt.device, {}
    for attention in attentions:
        bert, ref_bert = encoders(ctx, attention)
        ours = runtime.fast_dropout(SentenceBERT(bert)).to(device).train()  # as a run's
        runs[attention] = own_step(ctx, B, model=ours)
        ref = nn.ModuleDict({"bert": ref_bert, "head": nn.Linear(bert.config.hidden_size, 5)})
        ref_opt = torch.optim.AdamW(ref.to(device).parameters(), **ADAMW, foreach=ctx.cuda)
        batch = random_batch(ctx, B, bert.config.vocab_size)
        ref_rt = make_runtime(str(device), ctx.rt.precision)  # its own scaler
        runs[f"hf_{attention}"] = partial(reference_step, ref, ref_opt, batch, ref_rt)
        if attention == "manual":  # the training default
            runs["smart"] = own_step(ctx, B, model=ours, smart=SMART)
    return runs


def own_step(ctx: Context, B: int, precision=None, model=None, smart=None, compiled=False):
    """One train_step of our SST model (by default a fresh one for --model, compiled or not) on
    the same B x ctx.length batch at `precision` (default: training's); with SMART and its
    teacher when `smart` is given (the teacher's momentum schedule does not change its cost)."""
    precision = precision or ctx.rt.precision
    if model is None:
        torch.manual_seed(0)  # random weights and heads: the same for every precision
        bert = runtime.compile_layers(our_bert(ctx)) if compiled else our_bert(ctx)
        model = runtime.fast_dropout(SentenceBERT(bert)).to(ctx.rt.device).train()  # as a run's
    batch = random_batch(ctx, B, model.bert.config.vocab_size)
    scaler = torch.amp.GradScaler(ctx.rt.device.type, enabled=precision == "fp16")
    teacher = EMATeacher(model, smart) if smart else None
    step = StepContext(Runtime(ctx.rt.device, AUTOCAST[precision], scaler), teacher=teacher)
    stage = Stage(("sst",), lr=1e-5, batch_size=B, smart=smart or SmartConfig.off())
    optimizer = model.configure_optimizers(OptimConfig(1e-5, foreach_adamw=ctx.cuda))
    return partial(train_step, model, optimizer, stage, [("sst", batch)], step, torch.Generator())


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
            args = [random_batch(ctx, B, ours.config.vocab_size)[k] for k in INPUTS]
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
                ("smart", "manual", "SMART (thesis: own masks) vs plain", "smart_time"),
            )
        ]
    return rows


def bench_adamw(ctx: Context) -> list[Row]:
    """One AdamW step on the encoder's parameters with random gradients. The optimizers
    share the parameters (each keeps its own moments): same work, one model in memory."""
    params = list(our_bert(ctx).to(ctx.rt.device).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opts = {
        "loop": AdamW(params, **ADAMW),
        "foreach": AdamW(params, **ADAMW, foreach=True),
        "torch loop": torch.optim.AdamW(params, **ADAMW, foreach=False),
        "torch foreach": torch.optim.AdamW(params, **ADAMW, foreach=True),
    }
    times = ctx.time({k: o.step for k, o in opts.items()})
    what = f"AdamW step, {sum(p.numel() for p in params) / 1e6:.1f}M parameters"
    return [
        timed_row(f"{what}, our {o} vs {r}", times, o, r, "adamw")
        for o, r in (("loop", "torch loop"), ("foreach", "torch foreach"))
    ]


def eval_forward(bert: BertModel, args: list, device: torch.device, precision: str) -> None:
    """Our BERT's forward in eval mode, without gradients, under `precision`'s autocast."""
    with (
        torch.no_grad(),
        Runtime(device, AUTOCAST[precision], torch.amp.GradScaler(enabled=False)).autocast(),
    ):
        bert.eval()(*args)


def bench_precision(ctx: Context) -> list[Row]:
    """bf16 autocast (fp16 on a GPU without bf16) against float32 on the FFN's matmul, our
    BERT forward (eval, no gradients) and the train step, all in this process; a step's FLOP
    rate is judged against the matmul of its precision."""
    device = ctx.rt.device
    if not native_bf16(device) and not ctx.cuda:
        raise Skip("this CPU has no native bf16 dot products: training runs float32 here")
    low, rows = "bf16" if native_bf16(device) else "fp16", []
    dtypes = {"fp32": torch.float32, low: AUTOCAST[low]}

    def versus(what: str, runs: dict, target=None) -> tuple[dict, Row]:  # runs: {precision: f}
        times = ctx.time(runs)
        return times, timed_row(f"{what}, {low} vs float32", times, low, "fp32", target)

    for B in ctx.batch_sizes:
        steps = {p: own_step(ctx, B, p) for p in dtypes}
        bert, T = steps["fp32"].args[0].bert, ctx.length
        M, K, N = B * T, bert.config.hidden_size, bert.config.intermediate_size
        if not ctx.cuda:  # what --precision auto decides here, at this batch's shape
            layer = lambda H, c=bert.config: runtime.fast_dropout(BertLayer(c))  # noqa: E731
            probe = layer_times((B, PROBE_TOKENS, K), layer)
            _, why = pick_precision(device, "auto", lambda probe=probe: probe)
            ms = {p: 1000 * t for p, t in probe.items()}
            what = f"auto's probe, encoder layer {B}x{PROBE_TOKENS}x{K}: bf16 vs float32"
            rows.append(Row(what, "ms", ms["bf16"], ms["fp32"], ms["bf16"] / ms["fp32"], note=why))
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        mm = {p: partial(torch.matmul, a.to(device, d), b.to(device, d)) for p, d in dtypes.items()}
        times, matmul = versus(f"matmul {M}x{K}x{N} (the FFN's shape)", mm)
        rates = {p: 2 * M * K * N / statistics.median(t) for p, t in times.items()}
        matmul.note = f"{rates[low] / 1e9:,.0f} vs {rates['fp32'] / 1e9:,.0f} GFLOP/s"
        args = [random_batch(ctx, B, bert.config.vocab_size)[k] for k in INPUTS]
        forward = {p: partial(eval_forward, bert, args, device, p) for p in dtypes}
        rows += [matmul, versus(f"BERT forward {B}x{T}", forward)[1]]
        bert.train()
        times, step = versus(f"train step {B}x{T}", steps, "bf16_step")
        rows.append(step)
        flops = train_step_flops(bert.config, B, T)
        for p, target in ((low, "bf16_share" if low == "bf16" else None), ("fp32", None)):
            rate = flops / statistics.median(times[p])
            note = f"{rate / 1e9:,.0f} GFLOP/s of {flops / 1e9:,.1f} GFLOP a step"
            share = f"train step {B}x{T} {p}: FLOP rate / {p} matmul rate"
            rows.append(Row(share, "", rate / rates[p], target=target, note=note))
    return rows


def demo_qqp_steps(ctx: Context):
    """The demo's model in float32 on the CPU, its first stage (one QQP epoch) and that
    stage's steps as the run draws them: (model, stage, step context, iterator of steps)."""
    from commands import command  # the run's own construction

    if ctx.cuda or ctx.model == RANDOM_BASE:
        raise Skip("the demo's step: a checkpoint (--model) on the CPU")
    argv = ["--preset", "demo", "--precision", "fp32", "--bert", ctx.model]
    try:
        cfg, _ = command.parse_args([*argv, "--data_dir", str(ctx.data_dir)])
    except SystemExit as e:  # no data, or a checkpoint the demo cannot run
        raise Skip(f"the demo's step: {e}") from None
    plans = PRESETS[cfg.preset].plans_of(cfg)
    task_data = command.seeded_data(cfg, plans)
    model = command.run_model(cfg)().train()
    reference = trainer.reference_of(model, cfg.optim)
    rt = Runtime(ctx.rt.device, None, torch.amp.GradScaler("cpu", enabled=False))
    step = StepContext(rt, cfg.optim, reference=reference)
    stage = plans.stages()[0]  # the demo's one QQP epoch
    steps = trainer.stage_steps(task_data, stage, torch.Generator().manual_seed(0), cfg.seed)
    return model, stage, step, itertools.cycle(steps)  # a small data set's steps again


def bench_float32(ctx: Context) -> list[Row]:
    """The demo's QQP step in float32, what every CPU without bf16 trains in: its FLOP rate
    against float32 matmuls at its shape over `repeats` steps, then its time by kind of work
    over as many more, profiled (torch.profiler; timing.step_shares)."""
    model, stage, step, steps = demo_qqp_steps(ctx)
    optimizer = model.configure_optimizers(OptimConfig(stage.lr))
    config, g = model.bert.config, torch.Generator().manual_seed(0)

    def timed() -> tuple[float, float, int, int]:  # seconds drawing, seconds in all, N, T
        t0 = time.perf_counter()
        step_batches = next(steps)
        t1 = time.perf_counter()
        train_step(model, optimizer, stage, step_batches, step, g)
        N, T = step_batches[0][1]["input_ids"].flatten(0, -2).shape  # the padded sentences
        return t1 - t0, time.perf_counter() - t0, N, T

    for _ in range(ctx.warmup):
        timed()
    runs = [timed() for _ in range(ctx.repeats)]
    passes = 4 if step.optim.distill else 3  # forward 1, backward 2; distillation's reference 1
    flops = sum(train_step_flops(config, N, T) * passes / 3 for _, _, N, T in runs)
    H, inner, M = config.hidden_size, config.intermediate_size, sum(N * T for *_, N, T in runs)
    M //= len(runs)
    a, b = torch.randn(M, H, generator=g), torch.randn(H, inner, generator=g)
    mm_rate = 2 * M * H * inner / statistics.median(ctx.time({"mm": partial(a.matmul, b)})["mm"])
    walls = [wall for _, wall, _, _ in runs]
    rate, what = flops / sum(walls), f"demo QQP step, float32 ({M:,} tokens on average)"
    note = f"{rate / 1e9:,.0f} GFLOP/s against {mm_rate / 1e9:,.0f} of a {M}x{H}x{inner} matmul"
    rows = [Row(what, "ms", 1000 * statistics.median(walls), note=f"{len(runs)} steps")]
    rows.append(Row(f"{what}: FLOP rate / float32 matmul rate", "", rate / mm_rate, note=note))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        runs = [timed() for _ in range(ctx.repeats)]
    wall_us, data_us = (1e6 * sum(r[i] for r in runs) for i in (1, 0))
    shares = step_shares(prof.events(), wall_us, data_us)
    rows += [Row(f"demo QQP step, float32: share in {k}", "", v) for k, v in shares.items()]
    return rows


def bench_compile(ctx: Context) -> list[Row]:
    """The train step with torch.compile'd layers against eager at the training precision,
    after compiling (timed apart, in the note): what --compile gains or costs per step."""
    B = ctx.batch_sizes[-1]
    steps = {k: own_step(ctx, B, compiled=k == "compiled") for k in ("eager", "compiled")}
    t0 = time.perf_counter()
    steps["compiled"]()  # inductor compiles on the first call (C++ on a CPU)
    seconds = time.perf_counter() - t0
    what = f"train step {B}x{ctx.length} {ctx.rt.precision}, compiled vs eager"
    row = timed_row(what, ctx.time(steps), "compiled", "eager")
    row.note = f"compiling took {seconds:.0f} s"
    return [row]


def bench_memory(ctx: Context) -> list[Row]:
    """Peak memory of one step over what was in use before it (weights, AdamW's moments,
    the teacher), hand-written attention. After every timing: see timing.peak_memory_mib."""

    def peaks(steps: dict[str, Callable]) -> dict[str, float]:  # MiB, each step's second
        for step in steps.values():
            step()  # the first step makes AdamW's moments: not a step's cost
        return {name: peak_memory_mib(step, ctx.rt.device) for name, step in steps.items()}

    pairs = []  # (what, ours, reference, target)
    for B in ctx.batch_sizes:
        mib = peaks(step_runs(ctx, B, ("manual",)))
        what = f"peak memory of a train step {B}x{ctx.length} {ctx.rt.precision}"
        pairs.append((f"{what}, ours vs HF eager", mib["manual"], mib["hf_manual"], None))
        pairs.append((f"{what}, SMART vs plain", mib["smart"], mib["manual"], "smart_memory"))
    if ctx.rt.amp_dtype is not None:  # what autocast's copies and halves add or save
        B, low = ctx.batch_sizes[-1], ctx.rt.precision
        mib = peaks({p: own_step(ctx, B, p) for p in (low, "fp32")})
        what = f"peak memory of a train step {B}x{ctx.length}, {low} vs float32"
        pairs.append((what, mib[low], mib["fp32"], None))
    how = "allocator peak" if ctx.cuda else "peak RSS"
    return [Row(w, "MiB", a, b, a / b, target=t, note=how) for w, a, b, t in pairs]


def bench_padding(ctx: Context) -> list[Row]:
    """Real / padded tokens of training batches of 32, length-bucketed vs plain random."""
    tok, rows = BertTokenizer.from_pretrained("minilm"), []
    sst = data.SentenceDataset(data.read_task(ctx.data_dir, "sst", "train"), tok, 128)
    qqp = data.PairDataset(data.read_task(ctx.data_dir, "para", "train"), tok, 128)
    # siamese pairs: both sides of a batch are padded to one length
    for name, ds, sides in (("SST", sst, [sst.input_ids]), ("QQP", qqp, qqp.input_ids)):

        def efficiency(batches, sides=sides):
            return padding_efficiency([len(s[i]) for s in sides for i in b] for b in batches)

        g = torch.Generator().manual_seed(0)
        bucketed = efficiency(batches.LengthBucketSampler(ds.lengths, 32, generator=g))
        shuffled = efficiency(random_batches(len(ds), 32, g))
        what = f"padding efficiency {name} train, batch 32: LengthBucketSampler vs random"
        ratio, target = bucketed / shuffled, "padding" if name == "SST" else None
        rows.append(Row(what, "real/padded", bucketed, shuffled, ratio, target=target))
    return rows


TIMED = (
    bench_tokenizer,
    bench_forward,
    bench_train,
    bench_float32,
    bench_precision,
    bench_compile,
    bench_adamw,
)
# memory changes malloc's settings on a CPU, so it comes after every timed section
SECTIONS = {f.__name__.removeprefix("bench_"): f for f in (*TIMED, bench_memory, bench_padding)}


@dataclass
class BenchConfig:
    """benchmarks"""

    only: list = option([], "run only these sections; none: all", choices=tuple(SECTIONS))
    device: str = option("auto", "'auto' (CUDA if present), 'cpu' or 'cuda'")
    precision: str = option("auto", "of the rows at training precision", choices=PRECISIONS)
    model: str | None = option(
        None,
        f"encoder: a checkpoint folder, 'minilm' or '{RANDOM_BASE}' (its shape, random weights); "
        f"none: minilm on a CPU, {RANDOM_BASE} on CUDA",
    )
    batch_sizes: list = option([], "of forward, train, memory; none: 32, on CUDA 8 16 32", type=int)
    length: int = option(0, "tokens per sequence of those batches; 0: 64, on CUDA 128", minimum=0)
    repeats: int = option(7, "timed repeats of every comparison", positive=True)
    warmup: int = option(1, "untimed repeats before them", minimum=0)
    threads: int = option(0, "CPU threads (0: torch's, as training; 1: no busy stalls)", minimum=0)
    data_dir: str | None = option(None, "CS224n data folder (default: $MINBERT_DATA, else data/)")
    out: str = option("bench-results", "folder for bench.json and bench.md")


def main(argv=None) -> int:
    import transformers

    args, _, _ = cli.parse(BenchConfig(), argv, __doc__)
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
        except (NotImplementedError, FileNotFoundError) as e:  # Skip, no data: say so, go on
            ctx.skipped[section], new = str(e), []
        for r in new:
            print(f"[{section}]", r.what, fmt(r.ours, r.unit), fmt(r.ratio), fmt(r.ratio_min))
        print(f"[{section}]", ctx.skipped.get(section, f"{time.perf_counter() - t0:.0f} s"))
        rows += new
    meta["seconds"] = f"{time.perf_counter() - start:.0f} s"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"meta": meta, "targets": {k: str(t) for k, t in TARGETS.items()}}
    rows_out = [asdict(r) | {"passed": passed(r, TARGETS.get(r.target))} for r in rows]
    record |= {"skipped": ctx.skipped, "rows": rows_out}
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "bench.md").write_text(markdown(rows, ctx.skipped, meta, TARGETS))
    print("\n" + (out / "bench.md").read_text() + f"written to {out}/bench.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
