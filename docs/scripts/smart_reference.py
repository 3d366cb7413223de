"""--smart_variant reference against SmartPerturbation of SMART's reference code.

On the tiny BERT of tests/smart_models.py (eval mode: no dropout) and one batch, for each
kind of head, R_s's gradient on every parameter is computed twice from the same noise: by
smart.reference_regularizer, and by grader/mtdnn_smart.py, a step-by-step transcription of
namisan/mt-dnn's computation. It prints the ratio of the two gradients' norms and their
largest difference; with --both_sides, the loss is smart.divergence instead (both outputs
differentiated in both KL terms, what this variant took before): twice the reference's
gradient for the class heads.

Run from the repository root (seconds):

    python docs/scripts/smart_reference.py [--both_sides]
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "grader")]

import torch  # noqa: E402

import smart  # noqa: E402
from mtdnn_smart import smart_r_s  # noqa: E402
from smart_models import TinyClassifier, batch  # noqa: E402


def gradient(model, loss_of, embed_ids) -> torch.Tensor:
    """All parameters' gradients of loss_of(embedding output), flattened, from seed 7."""
    model.zero_grad()
    torch.manual_seed(7)
    loss_of(model.bert.embed(embed_ids)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def compare(kind: str, cfg) -> tuple[float, float]:
    """(|ours| / |mt-dnn's|, the largest difference) of R_s's gradients for one head."""
    model = TinyClassifier(n_out=3 if kind == "classification" else 1).eval()
    ids, mask = batch()

    def ours(embeds):  # (B, 3) class logits, else (B,)
        out = model.head_on(embeds, mask)
        return out if kind == "classification" else out.squeeze(-1)

    def theirs(embeds):  # a binary head's two logits for mt-dnn: (0, x)
        out = ours(embeds)
        return torch.stack([torch.zeros_like(out), out], -1) if kind == "binary" else out

    a = gradient(model, lambda e: smart.reference_regularizer(ours, e, ours(e), kind, cfg), ids)
    regression = kind == "regression"
    b = gradient(model, lambda e: smart_r_s(theirs, e, theirs(e), regression, 1e-3, 1e-3), ids)
    return (a.norm() / b.norm()).item(), (a - b).abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--both_sides", action="store_true", help="the loss before the fix")
    args = parser.parse_args()
    if args.both_sides:
        smart.reference_divergence = lambda clean, adv, kind: smart.divergence(adv, clean, kind)
    cfg = smart.SmartConfig(sigma=1e-3, eta=1e-3, dropout="independent", variant="reference")
    print(f"{'head':15} {'|ours| / |mt-dnn|':>18} {'max |difference|':>17}")
    for kind in ("classification", "binary", "regression"):
        ratio, difference = compare(kind, cfg)
        print(f"{kind:15} {ratio:>18.4f} {difference:>17.2e}")


if __name__ == "__main__":
    main()
