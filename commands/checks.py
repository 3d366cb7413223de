"""What a run's flags cannot do, refused before the run folder is made: `check_run` (the
settings and the stages, loading nothing), then `check_model` (the model's files) and
`check_loading` (the packages and the device a run needs). Each refusal is one line naming
the flag.
"""

from base_bert import load_config, missing_files, resolve_model_dir
from commands.flags import refuse
from datasets import CONTRASTIVE, CONTRASTIVE_SOURCES
from losses import loss_of
from presets import PRESETS, Plans, Stage, loss_choices
from settings import ModelConfig, OptimConfig, RunConfig
from simcse import OBJECTIVES


def check_run(cfg: RunConfig, plans: Plans) -> None:
    """Combinations of flags that cannot work, from the config and its stages alone."""
    check_settings(cfg)
    check_plans(cfg, plans)


def check_loading(cfg: RunConfig, device) -> None:
    """What the run will load or run on besides the checkpoint (check_model, first):
    TensorBoard, --compile's device."""
    check_tensorboard(cfg)
    check_compile(cfg.device.compile, device)


def check_losses(cfg: RunConfig):
    """--para_loss / --sts_loss against SMART, cross-encoding and the siamese read-out."""
    euclidean = cfg.model.siamese == "euclidean"
    for task, loss in loss_choices(cfg).items():
        flag, pair = f"--{task}_loss {loss}", loss_of(task, loss).pair
        refuse(
            pair and cfg.smart.enabled,
            f"{flag} works on sentence embeddings, which "
            "SMART cannot perturb through a head; use it without --smart",
        )
        refuse(
            pair and task in cfg.multitask.cross_encode,
            f"{flag} needs siamese "
            f"sentence embeddings; it cannot be used with --cross_encode {task}",
        )
        refuse(
            loss_of(task, loss).cosine and euclidean,
            f"{flag} trains a cosine, and --siamese "
            "euclidean reads the pair by d = ||u - v||: use --siamese cosine, or "
            "--para_loss distance_margin and --sts_loss mse|l1",
        )
        refuse(
            pair and not loss_of(task, loss).cosine and not euclidean,
            f"{flag} trains d = ||u - v||, which only --siamese euclidean reads out; add it",
        )


def check_settings(cfg: RunConfig):
    """Combinations of flags that cannot work, read from the config alone."""
    check_losses(cfg)
    m = cfg.multitask
    refuse(
        m.mixing == "round_robin" and m.weighting != "equal",
        f"--weighting {m.weighting} "
        "combines the losses of one step, and a round-robin step has one task: use it "
        "with --mixing simultaneous",
    )
    refuse(
        cfg.data.dev_size == 1, "--dev_size 1 cannot be scored (a Pearson r needs 2); use 0 or >= 2"
    )


def check_tensorboard(cfg: RunConfig):
    """--tensorboard needs the package, which training itself never imports."""
    if cfg.tensorboard:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise SystemExit(
                "--tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None


def check_model(cfg: RunConfig):
    """The checkpoint's config, read before any data: what it cannot do stops the run now;
    returns it."""
    model_dir = resolve_model_dir(cfg.model.bert)
    missing = missing_files(model_dir)
    refuse(
        bool(missing),
        f"--bert {cfg.model.bert}: {model_dir} has no {' and no '.join(missing)}; a "
        "Hugging Face BERT folder holds config.json, vocab.txt and the weights",
    )
    config = load_config(model_dir)
    if cfg.data.max_length > config.max_position_embeddings:
        raise SystemExit(
            f"--max_length {cfg.data.max_length} is longer than the "
            f"{config.max_position_embeddings} positions of {cfg.model.bert} "
            "(max_position_embeddings in its config.json)"
        )
    return config


def check_compile(compile: bool, device) -> None:
    """--compile is for GPUs (the H100's compiled step took 0.94 of eager's). On this
    project's CPU compiled layers trained slower than eager, 1.04 x without dropout and
    1.05-1.13 x with it (docs/precision.md), so there it stops before anything runs."""
    if compile and device.type != "cuda":
        raise SystemExit(
            "--compile: on the CPU compiled layers train slower than eager (docs/precision.md); "
            "use it with --device cuda, or leave it out"
        )


def check_plans(cfg: RunConfig, plans: Plans):
    """What only the stages tell, refused before the run folder is made."""
    stages = plans.stages()
    check_frozen(cfg, stages)
    check_handout_model(cfg, stages)
    name = f"--preset {cfg.preset}"
    refuse(
        cfg.smart.enabled and not any(s.smart.active for s in stages),
        f"--smart changes "
        f"no stage of {name}: it regularizes single-task stages (thesis, sequential, "
        "individual)",
    )
    trains = [s for s in stages if s.trains_encoder_on_tasks]
    refuse(
        cfg.simcse.simcse_weight > 0 and not any(s.contrastive for s in trains),
        f"--simcse_weight adds to task losses that train the encoder; no stage of {name} has one",
    )
    refuse(
        cfg.optim.distill > 0 and not trains,
        f"--distill pulls task stages that train the encoder; no stage of {name} has one",
    )
    check_update(stages, cfg.optim)
    for s in (s for s in stages if s.kind == CONTRASTIVE):
        objective, source = s.contrastive.simcse_loss, s.contrastive.simcse_data
        need, has = OBJECTIVES[objective][0], CONTRASTIVE_SOURCES[source]
        refuse(
            need > has,
            f"--simcse_loss {objective} needs {need} sentences per example "
            f"and --simcse_data {source} has {has}: use --simcse_data snli",
        )


def check_handout_model(cfg: RunConfig, stages: list[Stage]):
    """The handout's MultitaskBERT is read through its predict_* alone: its heads and
    embeddings are its own, its losses the handout's, and no sentence embedding of it
    reaches SMART, SimCSE or distillation."""
    if not PRESETS[cfg.preset].handout_model:
        return
    model = cfg.model
    sbert_only = {
        "--pooling": model.pooling != ModelConfig.pooling,
        # the handout's frozen option sets concat, for this project's presets
        "--pair_head": model.pair_head != ModelConfig.pair_head and not model.freeze_encoder,
        "--siamese": model.siamese != ModelConfig.siamese,
        "--cross_encode": bool(cfg.multitask.cross_encode),
        "--para_loss or --sts_loss": any(s.losses for s in stages),
        "--smart": any(s.smart.active for s in stages),
        "--simcse_weight": any(s.contrastive for s in stages),
        "--distill": cfg.optim.distill > 0,
        "--heldout_size": cfg.data.heldout_size > 0,  # read off its sentence embeddings
        "--head_lr_scale": cfg.optim.head_lr_scale != OptimConfig.head_lr_scale,
    }
    if typed := [flag for flag, on in sbert_only.items() if on]:
        raise SystemExit(
            f"{typed[0]}: preset {cfg.preset} trains multitask_classifier.py's MultitaskBERT "
            "through its predict_* (your design, the handout's losses); this flag is "
            "sbert.py's SentenceBERT's: pick one of this project's presets"
        )


def check_frozen(cfg: RunConfig, stages: list[Stage]):
    """--freeze_encoder trains the heads only: no contrastive stage, no PCGrad (it projects
    the encoder's gradients, and a frozen encoder has none), and STS needs a head."""
    if not cfg.model.freeze_encoder:
        return
    refuse(
        any(s.weighting == "pcgrad" and s.freeze_encoder for s in stages),
        f"--weighting pcgrad projects the encoder's gradients, and --freeze_encoder (the "
        f"handout's --option pretrain) leaves it none; preset {cfg.preset} weights by pcgrad: "
        "use --weighting equal or random, or leave out --freeze_encoder",
    )
    refuse(
        any(s.kind == CONTRASTIVE for s in stages),
        f"--freeze_encoder (the handout's --option pretrain) trains the heads only; preset "
        f"{cfg.preset} also trains the encoder contrastively",
    )
    sbert = not PRESETS[cfg.preset].handout_model  # the handout's model has its own heads
    refuse(
        sbert and cfg.model.pair_head == "sbert" and any("sts" in s.tasks for s in stages),
        "--freeze_encoder: STS's output is the cosine, with no head to train on a frozen "
        "encoder; add --pair_head concat (a head on [u, v])",
    )


def check_update(stages: list[Stage], optim: OptimConfig):
    """What the update's tools (accumulation, L2-SP, PCGrad) cannot do with these stages."""
    pcgrad = any(s.weighting == "pcgrad" for s in stages)
    refuse(
        pcgrad and (optim.accumulate > 1 or optim.l2sp > 0),
        "--weighting pcgrad takes "
        "each task's whole-batch gradient and would project the L2-SP pull: use it "
        "without --accumulate and --l2sp",
    )
    in_batch = [s.name for s in stages if in_batch_stage(s, optim)]
    first = in_batch[0] if in_batch else ""
    refuse(
        optim.accumulate > 1 and in_batch,
        f"--accumulate {optim.accumulate}: stage "
        f"'{first}' compares each example with the others of its batch, so "
        "micro-batches would change its loss; use 1",
    )


def in_batch_stage(s: Stage, optim) -> bool:
    """A stage whose loss compares each example with the others of its batch."""
    return (
        s.kind == CONTRASTIVE
        or any(loss_of(t, name).in_batch for t, name in s.losses.items())
        or bool(s.contrastive and s.contrastive.simcse_weight > 0)  # a SimCSE term's negatives
        or optim.distill > 0  # a task batch's cosines, distilled
    )
