"""Where and how the numbers are computed: device, precision and data-parallel processes.

Decided once, in `make_runtime`, and carried by every step as a `Runtime`. Under torchrun
(WORLD_SIZE > 1) every process builds the same global batches and trains on its share
(`micro_batches`); gradients are summed over the processes before the update, as
DistributedDataParallel would. The main process alone prints (make_runtime silences the
others), scores and writes (runfolder.Run). `peak_memory_mib` measures what one call
takes on the device (lab/bench.py). `dropout` is BERT's dropout with a faster draw on
the CPU than F.dropout's.
"""

import atexit
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_gather  # autograd-aware, unlike dist's


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p).

    On a GPU this is F.dropout's fused kernel. On the CPU, F.dropout draws one Bernoulli
    sample per element (about 5 ns each here: a fifth of a bf16 training step). Here each
    element gets a 16-bit random integer instead, four to one 64-bit draw, and survives
    when it is at least p's cut: the keep probability is 1 - round(p * 2^16) / 2^16
    (0.899994 for p = 0.1), and survivors are scaled by its exact inverse, so E[out] = x.
    The draws come from torch's generator, so seeding and fork_rng work as for F.dropout.
    """
    if not training or p == 0.0 or x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)  # (F.dropout also rejects a p outside [0, 1])
    cut = round(p * 2**16)  # an element is dropped when its draw falls below the cut
    if cut == 2**16:  # p within 2^-17 of 1 rounds to dropping everything, as F.dropout(x, 1)
        return x * 0.0
    n = x.numel()
    draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    draws = draws.view(torch.int16)[:n].view(x.shape)  # (ceil(n/4),) -> (4 ceil(n/4),) -> x's
    return x * (draws >= cut - 2**15) * (2**16 / (2**16 - cut))


class Dropout(nn.Dropout):
    """nn.Dropout running `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def fast_dropout(model: nn.Module) -> nn.Module:
    """Every nn.Dropout of `model` (bert.py's, the heads') made a `Dropout` above: the same
    module and masks' law, a faster draw on the CPU. The lesson writes torch's dropout; a
    run's model gets this one (command.model_factory)."""
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = Dropout
    return model


def check_attention(bert: nn.Module) -> float:
    """Probe bert.py's hand-written attention against torch's fused SDPA on random inputs
    (float64, CPU, padded keys, no dropout); where they agree, --attention auto may take
    SDPA on a GPU (each BertSelfAttention's sdpa_checked), else bert.py's code runs on
    every device, so an edit to it always takes effect. Returns the largest difference
    (inf: the hand-written one failed)."""
    layers = [m for m in bert.modules() if hasattr(m, "sdpa_checked")]
    if not layers:
        return math.inf
    g = torch.Generator().manual_seed(0)
    nh, hs = layers[0].num_attention_heads, layers[0].attention_head_size
    q, k, v = torch.randn(3, 2, nh, 5, hs, dtype=torch.float64, generator=g)  # (B, nh, T, hs)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    mask[1, ..., 3:] = torch.finfo(torch.float64).min  # the second example's last two keys
    training = layers[0].training
    try:
        layers[0].eval()
        ours = layers[0].attention(k, q, v, mask)  # (B, T, H): the heads merged
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
        gap = (ours - sdpa.transpose(1, 2).flatten(2)).abs().max().item()
    except Exception:  # a body that cannot run here is not SDPA's computation
        gap = math.inf
    finally:
        layers[0].train(training)
    for layer in layers:
        layer.sdpa_checked = gap < 1e-9
    return gap


def attention_line(bert: nn.Module, device: torch.device) -> str:
    """The run's line on which attention runs on `device` (probed again: check_attention)."""
    kind, gap = bert.config.attention, check_attention(bert)
    ours = "bert.py's BertSelfAttention.attention"
    if kind == "sdpa":
        return "attention: torch's fused SDPA (--attention sdpa), not bert.py's"
    if gap == math.inf:
        return "attention: the model's own, never torch's SDPA (the probe could not run it)"
    if gap >= 1e-9:
        return f"attention: {ours}, on every device (it differs from torch's SDPA by {gap:.2g})"
    if kind == "auto" and device.type == "cuda":
        return f"attention: torch's fused SDPA, equal to {ours} on a probe"
    return f"attention: {ours}"


PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # --precision
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Runtime:
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype, None for float32
    scaler: torch.amp.GradScaler  # enabled for float16 only: elsewhere each call is a no-op
    rank: int = 0  # this process among `world` data-parallel ones (torchrun)
    world: int = 1
    why: str = ""  # how the precision was chosen, as the run prints it

    @property
    def precision(self) -> str:
        """'fp32', 'bf16' or 'fp16'."""
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp_dtype]

    def autocast(self, float32: bool = False):
        """The run's autocast; float32: none for these passes (smart.passes_in_float32)."""
        if self.amp_dtype is None or float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def main(self) -> bool:
        """The process that scores, prints and writes files (the only one without torchrun)."""
        return self.rank == 0


def pick_device(device_arg: str) -> torch.device:
    """--device as a torch.device: 'auto' is CUDA when present, else the CPU."""
    if device_arg.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device_arg}: no CUDA device is available here; use cpu")
    if device_arg == "auto":
        device_arg = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device_arg)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {device_arg}: expected auto, cpu, cuda or cuda:N")
    count = torch.cuda.device_count()
    if device.type == "cuda" and (device.index or 0) >= count:
        raise SystemExit(f"--device {device_arg}: no such GPU; this machine has {count}")
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether the device multiplies bf16 natively: an Ampere or newer GPU; a CPU with
    AVX512-BF16 or AMX (elsewhere CPU autocast to bf16 runs, but emulated and slower)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's probes
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


PROBE_SHAPE = (32, 32, 384)  # (B, T, H): 32 sentences of 32 tokens at MiniLM's width
BF16_WINS = 0.9  # auto takes bf16 on a CPU when its layer step takes at most 90% of float32's


class StandInLayer(nn.TransformerEncoderLayer):
    """torch's encoder layer shaped as BERT's (post-LN, heads 64 wide, a 4H feed-forward with
    exact GELU, dropout 0.1), called as bert.py's BertLayer: (x (B, T, H), additive mask
    (B, 1, 1, T)). The probe's layer where the caller gives none of its own."""

    def __init__(self, hidden: int):
        super().__init__(hidden, max(1, hidden // 64), 4 * hidden, 0.1, "gelu", batch_first=True)

    def forward(self, x, mask):
        return super().forward(x, src_key_padding_mask=mask[:, 0, 0] < 0)  # (B, T): padded


def layer_times(shape=PROBE_SHAPE, make_layer=StandInLayer, repeats: int = 5) -> dict:
    """Seconds of one training forward and backward of an encoder layer (attention,
    feed-forward, LayerNorm, dropout) on the CPU at shape (B, T, H), half its rows padded to
    half length, in float32 ('fp32') and under bf16 autocast ('bf16'): each the best of
    `repeats`, the two taken in turns after a warm-up of each, so that the machine's drift
    touches both alike. make_layer(H) -> the layer, called as bert.py's BertLayer; the
    global generators are left as they were."""
    B, T, H = shape
    times = {"fp32": [], "bf16": []}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = make_layer(H).train()
        x = torch.randn(B, T, H, requires_grad=True)
        keep = torch.ones(B, T)
        keep[B // 2 :, T // 2 :] = 0.0
        mask = (1.0 - keep[:, None, None, :]) * torch.finfo(torch.float32).min  # (B, 1, 1, T)
        for _ in range(repeats + 1):
            for name, times_of in times.items():
                t0 = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                    y = layer(x, mask)  # (B, T, H)
                y.float().square().mean().backward()
                times_of.append(time.perf_counter() - t0)
                layer.zero_grad(set_to_none=True)
                x.grad = None
    return {name: min(t[1:]) for name, t in times.items()}  # t[0]: the warm-up


def pick_precision(device: torch.device, precision: str, measure=layer_times) -> tuple[str, str]:
    """('fp32' | 'bf16' | 'fp16', why) for --precision on this device. On a CPU with bf16 dot
    products, auto measures (`measure() -> {'fp32': seconds, 'bf16': seconds}`) and takes
    bf16 only when it is faster by the margin BF16_WINS (float32 when the probe cannot run);
    elsewhere bf16 is emulated: float32, unmeasured. A GPU with bf16 takes it, one without
    fp16."""
    if precision not in PRECISIONS:
        raise SystemExit(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision, "as asked"
    if device.type == "cuda":
        if native_bf16(device):
            return "bf16", "auto: this GPU multiplies bf16 natively"
        return "fp16", "auto: this GPU has no native bf16, so fp16 with a gradient scaler"
    if not native_bf16(device):
        return "fp32", "auto: this CPU has no native bf16 dot products"
    try:
        ms = {p: 1000 * seconds for p, seconds in measure().items()}
    except Exception as e:  # e.g. an exercise's open body: the run stops where it is used
        return "fp32", f"auto: float32, unmeasured (the probe's layer raised {type(e).__name__})"
    name = "bf16" if ms["bf16"] <= BF16_WINS * ms["fp32"] else "fp32"  # a tie keeps float32
    return name, (
        f"auto: {name} on this CPU (an encoder layer's forward and backward: bf16 "
        f"{ms['bf16']:.1f} ms, float32 {ms['fp32']:.1f} ms; bf16 needs at most "
        f"{BF16_WINS:.0%} of float32's time)"
    )


def compile_layers(bert):
    """torch.compile each encoder layer (--compile). Compiled dropout draws eager's masks
    from the global generator, so SMART's replayed masks and a resumed run's draws stay
    what they are without compile."""
    torch._inductor.config.fallback_random = True
    for layer in bert.bert_layers:
        layer.compile(dynamic=True)
    return bert


OPTIMIZER_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def eager_optimizers() -> None:
    """Let these methods of torch.optim.Optimizer run as written. torch wraps them to keep
    torch.compile from tracing into them, and the wrapper imports torch._dynamo at their
    first call: 3 s of every run's start on a 2-core CPU. No run here compiles its
    optimizer (--compile compiles the encoder's layers), so there is nothing to keep out;
    the update is the same either way."""
    for name in OPTIMIZER_WRAPPED:
        method = getattr(torch.optim.Optimizer, name)
        written = getattr(method, "__wrapped__", None)  # none where torch stops wrapping it
        if written is not None:
            written.__dict__.setdefault("__dynamo_disable", written)  # what the wrapper calls


def make_runtime(
    device_arg: str, precision: str = "auto", timeout_minutes=30.0, probe=layer_times
) -> Runtime:
    """The device and precision (pick_precision; auto on a CPU measures both with `probe`,
    e.g. layer_times of the run's own layer at its shape, and every process takes the main
    one's pick); under torchrun (WORLD_SIZE > 1) also joins the process group: nccl on GPUs (one per process,
    LOCAL_RANK), gloo on the CPU; a process that waits for the others longer than
    timeout_minutes stops with an error."""
    device = pick_device(device_arg)
    rank, world = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", local_gpu())
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=timedelta(minutes=timeout_minutes))
            # left to the interpreter's exit, gloo's threads can abort the process
            # ("terminate called without an active exception") after a finished run
            atexit.register(leave_group)
        rank = dist.get_rank()
        if rank != 0:  # the main process prints; the others train alongside, silently
            sys.stdout = open(os.devnull, "w")  # for the rest of the process
    name, why = pick_precision(device, precision, probe)
    if world > 1 and precision == "auto":  # every process takes the main one's measurement
        name, why = from_main((name, why), Runtime(device, None, None, rank, world))
    # float16's narrow range needs the loss scaled so small gradients do not underflow
    scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")
    return Runtime(device, AUTOCAST[name], scaler, rank, world, why)


def local_gpu() -> int:
    """This process's GPU under torchrun: LOCAL_RANK, which must name a GPU of the machine."""
    local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local >= count:
        raise SystemExit(
            f"torchrun started {os.environ.get('LOCAL_WORLD_SIZE', local + 1)} processes on a "
            f"machine with {count} GPU(s): use --nproc_per_node {count}, or --device cpu"
        )
    return local


def leave_group() -> None:
    """Destroy the process group if it is still there (at exit)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def split_batch(batch: dict, n: int) -> list[dict]:
    """A batch cut into at most `n` micro-batches of consecutive examples, for gradient
    accumulation: sentences (B, T) and sentence tuples (K, B, T) are cut along B; labels
    (B,) and ids along their only dimension. The last micro-batch may be smaller."""
    B = batch["input_ids"].shape[-2]
    size = -(-B // n)  # ceil(B / n)

    def cut(value, rows):
        if isinstance(value, torch.Tensor) and value.dim() == 3:
            return value[:, rows].contiguous()  # (K, b, T)
        return value[rows]

    return [{k: cut(v, slice(i, i + size)) for k, v in batch.items()} for i in range(0, B, size)]


def my_pieces(batch: dict, rt: Runtime, accumulate: int = 1) -> list[tuple[dict, float]]:
    """This process's micro-batches of a global batch, each with its share of the batch: the
    batch is cut into `world` shards (this process takes shard `rank`, maybe none when the
    batch is smaller than the world), each shard into `accumulate` micro-batches. Losses
    weighted by the shares and gradients summed over processes give the batch's gradient."""
    B = batch["input_ids"].shape[-2]
    shards = split_batch(batch, rt.world)
    if rt.rank >= len(shards):
        return []
    micro = split_batch(shards[rt.rank], accumulate)
    return [(m, m["input_ids"].shape[-2] / B) for m in micro]


def even_pieces(batch: dict, rt: Runtime, accumulate: int = 1) -> bool:
    """True when my_pieces gives every process the same number of micro-batches of this
    global batch, none left out: then every process makes the same gather calls, and
    in-batch objectives can see the whole batch (gather_rows). Cut as split_batch cuts:
    chunks of ceil(B / n)."""
    B = batch["input_ids"].shape[-2]
    shard = -(-B // rt.world)
    shards = [min(shard, B - start) for start in range(0, B, shard)]  # rows per process
    return len(shards) == rt.world and len({-(-n // -(-n // accumulate)) for n in shards}) == 1


def gather_rows(tensors: list[torch.Tensor], rt: Runtime) -> tuple[list[torch.Tensor], float]:
    """Every process's rows of each tensor, in rank order: (n, ...) here -> (N, ...), so an
    in-batch objective compares the whole batch's examples as one process would (SimCSE's
    code gathers for the same reason). Returns the gathered tensors and the weight of a
    loss on them, N / (world * n).

    The gather keeps gradients: its backward sums, into each process's own rows, the
    gradients of every process's loss. Every process computes the same loss L; weighted by
    N / (world * n) and then by its share n / B (train_step), the processes' losses sum to
    (N / B) L and their summed gradients are (N / B) dL: the batch's, when N = B.
    """
    if rt.world == 1:
        return tensors, 1.0
    n = tensors[0].size(0)
    sizes = [torch.zeros(1, dtype=torch.long, device=rt.device) for _ in range(rt.world)]
    dist.all_gather(sizes, torch.tensor([n], device=rt.device))
    sizes = [int(k) for k in sizes]
    out = []
    for t in tensors:
        padded = torch.cat([t, t.new_zeros(max(sizes) - n, *t.shape[1:])])  # equal shapes
        out.append(torch.cat([got[:k] for got, k in zip(all_gather(padded), sizes, strict=True)]))
    return out, sum(sizes) / (rt.world * n)


def same_start(model: nn.Module, rt: Runtime) -> None:
    """The main process's weights on every process, as DDP makes sure too."""
    if rt.world > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def own_generators(rt: Runtime) -> None:
    """Give every process but the main one global generators of its own, so that dropout
    masks and SMART's noise differ between the processes' shards as they would between a
    batch's examples in one process; the main process keeps the stream one process would
    draw. Data order, loss weights and PCGrad's order come from explicit generators that
    stay shared. Called wherever the generators are set: at the start and on a resume."""
    if rt.world == 1 or rt.main:
        return
    base = int(torch.randint(0, 2**62, ()).item())  # the same on every process, here
    torch.manual_seed(base + rt.rank)  # also seeds every CUDA device's generator


def sum_over_processes(tensor: torch.Tensor, rt: Runtime) -> torch.Tensor:
    """In place: the sum of this tensor over the processes (itself alone without torchrun)."""
    if rt.world > 1:
        dist.all_reduce(tensor)
    return tensor


def sum_gradients(params: list, rt: Runtime) -> None:
    """Sum every gradient over the processes (what DistributedDataParallel does, in one
    flat buffer). A parameter gets one where any process has one; zeros stand in for the
    others, so every process sends the same shapes."""
    if rt.world == 1:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=rt.device)
    has = sum_over_processes(has, rt)
    used = [p for p, n in zip(params, has.tolist(), strict=True) if n > 0]
    if not used:
        return
    flat = torch.cat(
        [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in used]
    )  # (P,)
    flat = sum_over_processes(flat, rt)
    for p, g in zip(used, flat.split([p.numel() for p in used]), strict=True):
        p.grad = g.view_as(p).clone()  # (P,) -> each parameter's shape


def from_main(value, rt: Runtime):
    """The main process's value of a Python object, on every process."""
    if rt.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_process(flags: list[bool], rt: Runtime) -> list[bool]:
    """Each flag true on any process: the same verdict everywhere (e.g. stop, save)."""
    if rt.world == 1:
        return flags
    summed = sum_over_processes(torch.tensor(flags, dtype=torch.float32, device=rt.device), rt)
    return [x > 0 for x in summed.tolist()]


@dataclass
class Piece:
    """One task's micro-batch on this process, with its share of the task's global batch."""

    task: str
    batch: dict
    share: float


def micro_batches(step_batches, rt: Runtime, accumulate: int = 1) -> tuple[list[list[Piece]], bool]:
    """This process's pieces of a step's global batches [(task, batch), ...], cut for
    accumulation: micro-batch k of every task that has one, in the step's order. Also
    whether in-batch objectives may gather the whole batch from the processes (each has
    its even share of every batch: gather_rows)."""
    mine = [
        [Piece(task, m, share) for m, share in my_pieces(batch, rt, accumulate)]
        for task, batch in step_batches
    ]
    micro = [[p[k] for p in mine if k < len(p)] for k in range(max(map(len, mine)))]
    even = all(even_pieces(batch, rt, accumulate) for _, batch in step_batches)
    return micro, rt.world > 1 and even


def to_device(batch: dict, device: torch.device | str) -> dict:
    """Move every tensor of a batch to device; other values (ids) stay as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def shares(step_batches, rt: Runtime, accumulate: int = 1) -> tuple[list[tuple], bool]:
    """This process's pieces of a step's global batches, each on the device: [(task, batch,
    its share of the task's global batch)], micro-batch k of every task before k + 1; and
    whether in-batch objectives gather the whole batch (micro_batches)."""
    if rt.world == 1 and accumulate == 1:  # one process, no accumulation: each batch whole
        return [(task, to_device(batch, rt.device), 1.0) for task, batch in step_batches], False
    micro, gather = micro_batches(step_batches, rt, accumulate)
    pieces = [(p.task, to_device(p.batch, rt.device), p.share) for k in micro for p in k]
    return pieces, gather
