"""The distillation term's pull at step 0 on MiniLM, for docs/forgetting.md, section 4.

At the loaded weights, with dropout on, it prints the norm of the encoder's gradient from
the SST loss itself and from --distill 30's term: as trainer.distillation_term computes it (the
frozen copy runs the step's own dropout masks), and as it was computed before commit
6cdc37e (the copy in eval mode, on the first sentences). One batch: the first 16 SST
training sentences, the SST head drawn after torch.manual_seed(0), in float32 and bf16.

Run from the repository root (well under a minute on a 2-core CPU):

    python docs/scripts/distill_step0.py [--data_dir DATA]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from smart_rs import sst_batch  # noqa: E402  (docs/scripts, this file's folder)

import simcse  # noqa: E402
import trainer  # noqa: E402
from commands import command
from engine import runtime  # noqa: E402
from evaluation import MULTITASK  # noqa: E402
from presets import Stage  # noqa: E402
from settings import ModelConfig, OptimConfig  # noqa: E402
from smart import RngSnapshot  # noqa: E402
from trainer import StepContext  # noqa: E402

W = 30.0  # the defended preset's --distill
DISTILLED = Stage(("sst",), 1e-5, 16)  # a stage that trains the encoder: distillation pulls


def eval_copy_term(model, batch, same, ctx):
    """The term before 6cdc37e: the frozen copy in eval mode (no dropout)."""
    with torch.no_grad():
        z0 = ctx.reference.eval().sentences(batch)  # (B, H)
    return lambda z: simcse.similarity_distillation(z.float(), z0.float())


def encoder_grad_norm(model, batch, rt, term) -> float:
    """Norm of the encoder's gradient of term(z, same) for the batch's embeddings z."""
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks for every term
    same = RngSnapshot(rt.device)  # the generators before the pass, as train_step keeps them
    with rt.autocast():
        z = model.sentences(batch)  # (B, H)
        loss = term(z, same)
    loss.backward()
    grads = [p.grad.flatten() for p in model.bert.parameters() if p.grad is not None]
    return torch.cat(grads).norm().item() if grads else 0.0


def main(argv=None):
    batch = sst_batch(argv)
    batch = {k: v for k, v in batch.items() if torch.is_tensor(v)}
    torch.manual_seed(0)
    model = command.model_factory(ModelConfig(bert="minilm"), MULTITASK)().train()
    rt, reference = runtime.make_runtime("cpu", "fp32"), trainer.frozen_copy(model)
    ctx = StepContext(rt, OptimConfig(distill=W), reference=reference)
    terms = {
        "SST loss (cross-entropy)": lambda z, same: F.cross_entropy(
            model.readout("sst", batch, z).float(), batch["labels"]
        ),
        "distillation, copy with the step's masks (now)": lambda z, same: trainer.distillation_term(
            model, DISTILLED, trainer.Clean("sst", batch, z, rng=same), ctx
        ),
        "distillation, copy in eval mode (before 6cdc37e)": lambda z, same: (
            W * eval_copy_term(model, batch, same, ctx)(z)
        ),
    }
    print("| encoder gradient of | float32 | bf16 |")
    print("| --- | ---: | ---: |")
    for name, term in terms.items():
        norms = [
            encoder_grad_norm(model, batch, runtime.make_runtime("cpu", p), term)
            for p in ("fp32", "bf16")
        ]
        print(f"| {name} | " + " | ".join(f"{n:.2f}" for n in norms) + " |")


if __name__ == "__main__":
    main()
