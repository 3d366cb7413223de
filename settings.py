"""The run's settings: small dataclasses whose fields are the command line.

Every setting is one field, written once with its default, its help text and its allowed
values (`option`), in the group a student looks for: data, model, optimizer, schedule,
multitask, SMART, SimCSE, device; `RunConfig` holds them all. A setting's flag is
--field (`--lr` sets `optim.lr`); `python multitask_classifier.py --show` prints what a
preset sets.

The commands turn these classes into flags and back (commands/flags.py: each setting's
flag and range check, a run's config.json; commands/cli.py: argparse, a preset's
overrides under the flags the user typed).
"""

from dataclasses import dataclass, field

from batches import MIXINGS, ORDERS
from datasets import CONTRASTIVE_SOURCES
from engine.runtime import PRECISIONS
from evaluation import TASKS
from losses import TASK_LOSSES
from optimizer import DECAYS, WEIGHTINGS
from simcse import DISTANCES, OBJECTIVES
from smart import DROPOUT, VARIANTS, SmartConfig


def loss_help(task: str) -> str:
    """The --<task>_loss help: every choice with its words, the default first."""
    items = [f"{name} ({loss.help})" for name, loss in TASK_LOSSES[task].items()]
    return f"{TASKS[task].title} loss: {items[0]}, the default; or " + ", ".join(items[1:])


def option(default, help: str, **meta):
    """A config field: its default, its --help line, and optional checks for the parser.

    meta: choices, minimum (inclusive), positive (> 0), maximum (inclusive), type (when not
    the default's; str for None), metavar, flag (the option string when it is not --<name>, e.g. '--no_amp').
    """
    meta = {"help": help} | meta
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    """data"""

    data_dir: str | None = option(None, "CS224n data folder (default $MINBERT_DATA, else data/)")
    train_size: int = option(0, "use this many training examples per task (0: all)", minimum=0)
    train_share: float = option(
        1.0,
        "then keep this share of each training set (report presets: --scale)",
        positive=True,
        maximum=1,
    )
    train_first: bool = option(
        False, "--train_size takes each training file's first rows, not a random sample"
    )
    dev_size: int = option(0, "score this many dev/test examples per task (0: all)", minimum=0)
    fit_minutes: float = option(
        0.0,
        "time a few training steps here first, then shrink --train_size and --dev_size by one "
        "factor (never grow them) so that training and scoring take about this many minutes; "
        "the run folder's config keeps the sizes chosen (0: off; a typed size turns it off)",
        minimum=0,
    )
    split_dev: bool = option(
        False,
        "also score each half of every dev set (cut by a hash of the ids) after each stage, "
        "and print how much choosing the kept stage on dev flatters it: the stage chosen on "
        "one half, scored on the other",
    )
    max_length: int = option(128, "truncate sentences to this many tokens", minimum=3)
    eval_batch_size: int = option(128, "evaluation batch size", minimum=1)
    strict: bool = option(False, "stop at the first bad data row instead of skipping it")
    heldout_size: int = option(
        0,
        "after every stage also score the encoder on this many SNLI dev pairs no preset "
        "trains on (cosine AUC of entailment over contradiction): what it knew and keeps "
        "(0: off)",
        minimum=0,
    )
    test_predictions: bool = option(True, "skip test-set predictions", flag="--no_test_predictions")


@dataclass
class ModelConfig:
    """model"""

    bert: str = option("bert-base-uncased", "checkpoint folder, 'minilm' (embedded) or a hub name")
    freeze_encoder: bool = option(
        False, "train the heads only, every stage (the handout's --option pretrain)"
    )
    pooling: str = option(
        "mean", "sentence embedding: masked mean or BERT's pooled [CLS]", choices=("mean", "cls")
    )
    dropout: float = option(
        0.1, "dropout on the sentence embedding before each head", minimum=0, maximum=1
    )
    attention: str = option(
        "auto",
        "bert.py's attention (manual), torch's fused SDPA, or auto: SDPA on a GPU where a probe "
        "at start finds it equal to bert.py's (an edited attention always runs), else bert.py's",
        choices=("auto", "manual", "sdpa"),
    )
    pair_head: str = option(
        "sbert",
        "siamese heads: QQP on [u, v, |u - v|] and STS the cosine (Sentence-BERT), or "
        "a Linear on [u, v] for both, where their loss trains a head (Broadhurst & Maffezzoli)",
        choices=("sbert", "concat"),
    )
    siamese: str = option(
        "cosine",
        "how siamese pair tasks without a head compare u and v: cosine, or "
        "d = ||u - v|| (Auslin et al.: STS outputs d, QQP is d above a fit threshold)",
        choices=DISTANCES,
    )


@dataclass
class OptimConfig:
    """optimization (AdamW)"""

    lr: float = option(1e-5, "AdamW learning rate", positive=True)
    weight_decay: float = option(0.0, "AdamW decoupled weight decay", minimum=0)
    batch_size: int = option(32, "training batch size", minimum=1)
    foreach_adamw: bool = option(False, "AdamW's multi-tensor fast path")
    warmup: float = option(
        0.0,
        "share of each stage's steps over which the lr rises linearly from 0",
        minimum=0,
        maximum=1,
    )
    decay: str = option(
        "constant",
        "lr after the warmup: constant, or linear decay over the stage",
        choices=DECAYS,
    )
    head_lr_scale: float = option(
        1.0,
        "task heads learn at this multiple of the stage's lr (a fresh head barely moves "
        "at an encoder's lr)",
        positive=True,
    )
    max_grad_norm: float = option(
        0.0,
        "clip the gradient to this global L2 norm before each update (0: no clipping)",
        minimum=0,
    )
    accumulate: int = option(
        1,
        "cut each batch into this many micro-batches: the same gradient as the whole "
        "batch, less memory",
        minimum=1,
    )
    l2sp: float = option(
        0.0,
        "L2-SP weight alpha: add alpha/2 * ||w - w_pretrained||^2 over the encoder "
        "(Li et al. 2018), a pull back toward what it knew",
        minimum=0,
    )
    distill: float = option(
        0.0,
        "add this weight times the mean squared gap between the cosines of a task "
        "batch's sentences (a pair's first) and those the untouched encoder gives them "
        "(relational distillation): embeddings may move but keep their similarities; costs "
        "a forward of the frozen encoder per batch",
        minimum=0,
    )


@dataclass
class ScheduleConfig:
    """schedule (the thesis's presets)"""

    loops: int = option(10, "thesis presets: loops of STS -> SST -> a share of QQP", minimum=0)
    para_fraction: float = option(
        0.03, "thesis presets: share of QQP per loop", positive=True, maximum=1
    )
    loop_decay: str = option(
        "none",
        "thesis presets: 'linear' runs loop i of L at lr x (L - i + 1) / L, so that later "
        "loops move the encoder less; 'none': every loop at the same lr, as the thesis",
        choices=("none", "linear"),
    )
    sequential_epochs: tuple = option(
        (3, 10, 10), "sequential preset: epochs per task", minimum=1, metavar=("QQP", "STS", "SST")
    )
    individual_epochs: int = option(
        3, "individual and frozen-encoder presets: epochs per task", minimum=1
    )
    head_lr: float = option(1e-3, "lr of the heads on a frozen encoder", positive=True)
    patience: int = option(
        0,
        "stop the schedule after this many stages without a new best model (0: run "
        "everything); a task stage of several epochs is then scored after each, keeps its "
        "best epoch and stops after this many without a new best (SimCSE's keep choosing by "
        "STS); a stopped run is finished: the kept model, its predictions",
        minimum=0,
    )
    scale: float = option(
        1.0,
        "report presets: keep this share of each training set (--train_share) and of "
        "their examples per task and epochs (at least one): the same method, at a size a CPU "
        "can run",
        positive=True,
        maximum=1,
    )


@dataclass
class MultitaskConfig:
    """multitask training and loss options (CS224n reports)"""

    mixing: str = option(
        "simultaneous",
        "multitask preset: a batch of every task per step, or tasks taking turns",
        choices=MIXINGS,
    )
    weighting: str = option(
        "equal",
        "simultaneous: equal weights, random weights (Lin et al. 2022) or PCGrad",
        choices=WEIGHTINGS,
    )
    order: str = option(
        "fixed",
        "task order: fixed, or drawn afresh each cycle (round-robin turns; the "
        "batches of a simultaneous step)",
        choices=ORDERS,
    )
    examples_per_task: int = option(
        0, "multitask: sample or repeat each task's data to this many (0: as is)", minimum=0
    )
    multitask_epochs: int = option(3, "multitask preset: epochs", minimum=1)
    para_loss: str | None = option(None, loss_help("para"), choices=tuple(TASK_LOSSES["para"]))
    sts_loss: str | None = option(None, loss_help("sts"), choices=tuple(TASK_LOSSES["sts"]))
    cross_encode: list = option(
        [],
        "encode these pair tasks as one [CLS] a [SEP] b [SEP] sequence (Auslin et al.)",
        choices=("para", "sts"),
    )


# SMART's flags: the per-task weights and what a run may change. SMART's settings, their
# defaults and the rules between them are smart.SmartConfig's: for_task only picks them.
@dataclass
class SmartFlags:
    """SMART (Jiang et al., 2020), with the thesis's per-task weights (section 4.2.1)"""

    enabled: bool = option(
        False, "add lambda_s * R_s + mu * D_Breg to every task's loss", flag="--smart"
    )
    lambda_sst: float = option(10.0, "smoothness weight for SST", minimum=0)
    lambda_para: float = option(SmartConfig.lambda_s, "smoothness weight for QQP", minimum=0)
    lambda_sts: float = option(SmartConfig.lambda_s, "smoothness weight for STS", minimum=0)
    mu: float = option(SmartConfig.mu, "Bregman proximal point weight", minimum=0)
    smart_batch_size: int = option(
        8,
        "batch size of SMART stages (the thesis's memory limit); a typed --batch_size sets it",
        minimum=1,
    )
    smart_dropout: str = option(
        SmartConfig.dropout,
        "dropout masks of SMART's passes: the clean pass's (shared: R_s is the perturbation's "
        "effect, as in the paper) or their own (independent: the thesis's code, i.e. R-Drop)",
        choices=DROPOUT,
    )
    smart_variant: str = option(
        SmartConfig.variant,
        "R_s's ascent: as the paper states it (paper: noise kept in an epsilon ball) or as "
        "SMART's code runs it (reference: per-token normalized step, no ball, every pass its "
        "own dropout masks, so --smart_dropout does not apply)",
        choices=VARIANTS,
    )
    smart_epsilon: float = option(
        SmartConfig.epsilon,
        "radius of the perturbation (infinity norm; initial noise = radius, ascent step = "
        "100 x radius, the paper's 1e-5 / 1e-3 ratio)",
        positive=True,
    )

    def for_task(self, task: str) -> SmartConfig:
        """SMART's settings for a stage of `task` (SmartConfig.at_radius); both weights 0
        when SMART is off."""
        if not self.enabled:
            return SmartConfig.off()
        lambdas = {"sst": self.lambda_sst, "para": self.lambda_para, "sts": self.lambda_sts}
        return SmartConfig.at_radius(
            self.smart_epsilon,
            self.smart_variant,
            lambda_s=lambdas[task],
            mu=self.mu,
            dropout=self.smart_dropout,
        )


@dataclass
class SimCSEConfig:
    """SimCSE (Gao et al., 2021) and other contrastive stages"""

    simcse_loss: str = option("sup", "objective", choices=tuple(OBJECTIVES))
    simcse_data: str = option(
        "snli",
        "SNLI triplets (premise, entailment, contradiction), Quora duplicate pairs or SST "
        "sentences (one sentence: two dropout views)",
        choices=tuple(CONTRASTIVE_SOURCES),
    )
    simcse_epochs: int = option(3, "epochs, best kept by STS dev r", minimum=1)
    simcse_lr: float = option(1e-5, "learning rate (thesis code)", positive=True)
    simcse_batch_size: int = option(8, "batch, i.e. in-batch negatives (thesis: 8)", minimum=2)
    temperature: float = option(0.05, "similarity temperature", positive=True)
    simcse_weight: float = option(
        0.0,
        "add this weight x unsupervised SimCSE of each training batch's sentences (two "
        "dropout views) to its task loss (Sicurello's BERT_simCSE; 0: off)",
        minimum=0,
    )


@dataclass
class DeviceConfig:
    """device"""

    device: str = option("auto", "'auto' (CUDA if present), 'cpu' or 'cuda'")
    precision: str = option(
        "auto",
        "number format of training and scoring: auto is bf16 autocast where the device "
        "multiplies bf16 natively (Ampere GPUs, CPUs with AVX512-BF16), fp16 autocast with a "
        "gradient scaler on other GPUs (a T4), float32 elsewhere; any of them can be forced, "
        "fp16 on the CPU too (slow there, but the T4's code path)",
        choices=PRECISIONS,
    )
    amp: bool = option(True, "the same as --precision fp32 (an older flag)", flag="--no_amp")
    compile: bool = option(False, "torch.compile the encoder layers (CUDA only: slower on a CPU)")
    dist_timeout: float = option(
        30.0,
        "under torchrun: minutes a process waits for the others (a crashed or stalled one) "
        "before it stops with an error",
        positive=True,
    )

    @property
    def resolved_precision(self) -> str:
        """--precision, where --no_amp asks for float32."""
        return "fp32" if not self.amp and self.precision == "auto" else self.precision


@dataclass
class RunConfig:
    """what to run"""

    preset: str = option("thesis", "named experiment (listed below)")
    seed: int = option(
        11711, "seed for data order, subsets and dropout", minimum=0, maximum=2**32 - 1
    )
    run_dir: str | None = option(None, "output folder; unset: runs/<preset>-<time>")
    predictions_dir: str | None = option(None, "also copy the kept model's predictions here")
    checkpoint_minutes: float = option(
        10.0,
        "also save a resumable checkpoint inside a stage this often, in minutes (0: only "
        "between stages); Ctrl-C and SIGTERM save one too",
        minimum=0,
    )
    stage_checkpoints: bool = option(
        True,
        "save only every --checkpoint_minutes (stage ends included) and at the end, not "
        "after every stage: on Google Drive every replaced checkpoint stays in the bin for "
        "30 days (docs/colab.md)",
        flag="--no_stage_checkpoints",
    )
    tensorboard: bool = option(
        False,
        "write each step's loss, lr, gradient norm, examples/s and each stage's dev scores "
        "to RUN_DIR/tensorboard as the run goes (needs: pip install tensorboard)",
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    multitask: MultitaskConfig = field(default_factory=MultitaskConfig)
    smart: SmartFlags = field(default_factory=SmartFlags)
    simcse: SimCSEConfig = field(default_factory=SimCSEConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
