"""The CS224n handout's AdamW check, run by its command: python optimizer_test.py

From seed 0 (numpy's default_rng, torch.manual_seed), fit Linear(3, 2, bias=False) to
[x0 + x1, -x2], x ~ U[0, 1)^3, with our AdamW(lr=1e-3, weight_decay=1e-4, correct_bias=True) on
the summed squared error for 1000 steps; compare the weight, under the handout's tolerance, with
its optimizer_test.npy (handout_folders says where it is looked for); where there is none,
with torch.optim.AdamW on the same recipe. Exit status 1 on a failure or open exercise.
"""

import argparse
import os
from pathlib import Path

import numpy as np
import torch

from optimizer import AdamW

HERE = Path(__file__).resolve().parent
NPY = "optimizer_test.npy"
LR, WEIGHT_DECAY, STEPS = 1e-3, 1e-4, 1000  # the handout's recipe
# the handout's: allclose(expected, ours), i.e. |ours - expected| <= ATOL + RTOL * |ours|
ATOL, RTOL = 1e-6, 1e-4
TOLERANCE = f"atol {ATOL:.0e}, rtol {RTOL:.0e}"
NO_NPY = f"the handout's {NPY} was not found (put it in this folder)"


def fit(optimizer_class, **options) -> torch.Tensor:
    """The handout's recipe with optimizer_class(params, lr, weight_decay, **options);
    returns the (2, 3) weight it ends at."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)  # the layer's initial weight
    model = torch.nn.Linear(3, 2, bias=False)
    optimizer = optimizer_class(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, **options)
    for _ in range(STEPS):
        optimizer.zero_grad()
        x = torch.tensor(rng.uniform(size=3), dtype=torch.float32)  # (3,)
        y = torch.stack([x[0] + x[1], -x[2]])  # (2,)
        ((y - model(x)) ** 2).sum().backward()
        optimizer.step()
    return model.weight.detach()


def handout_folders() -> list[Path]:
    """Where the handout's reference files may lie: the working folder, this one,
    $MINBERT_REFERENCE, the data folder (lab/fetch.py puts them there), ../shared/reference."""
    named = [os.environ.get("MINBERT_REFERENCE"), os.environ.get("MINBERT_DATA") or "data"]
    return [Path.cwd(), HERE, *(Path(f) for f in named if f), HERE.parent / "shared" / "reference"]


def reference() -> tuple[torch.Tensor, str]:
    """The weight to compare with and where it came from: the handout's file, else torch's."""
    path = next((f / NPY for f in handout_folders() if (f / NPY).is_file()), None)
    if path is None:
        w = fit(torch.optim.AdamW, betas=(0.9, 0.999), eps=1e-6)
        return w, f"torch.optim.AdamW on the same recipe; {NO_NPY}"
    try:
        w = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: not a .npy array ({e})") from None
    if w.shape != (2, 3) or w.dtype.kind != "f":
        raise SystemExit(f"{path}: {w.dtype} {w.shape}; expected the handout's 2 x 3 floats")
    return torch.from_numpy(w).float(), str(path.resolve())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--foreach", action="store_true", help="test AdamW(foreach=True), the vectorised update"
    )
    args = parser.parse_args(argv)
    ours = f"AdamW(foreach={args.foreach}), {STEPS} steps, {TOLERANCE}"
    try:
        got = fit(AdamW, correct_bias=True, foreach=args.foreach)
    except NotImplementedError as e:  # a handout's open exercise: its message names it
        if not str(e).startswith("exercise adamw"):
            raise
        name = str(e).split(":")[0].removeprefix("exercise ")  # as exercises.py names it
        raise SystemExit(
            f"Optimizer test not run: {e} (python exercises.py check {name})"
        ) from None
    want, source = reference()
    if torch.allclose(want, got, atol=ATOL, rtol=RTOL):  # the handout's order: rtol x |got|
        largest = (got - want).abs().max().item()
        print(f"Optimizer test passed: {ours}: largest difference {largest:.1e} against {source}")
        return
    # Name the entry furthest over its allowed difference
    g, w = got.numpy(), want.numpy()
    allowed = ATOL + RTOL * np.abs(g)
    i, j = np.unravel_index(np.argmax(np.abs(g - w) / allowed), w.shape)  # a nan comes first
    raise SystemExit(
        f"Optimizer test failed: {ours}: largest difference {abs(g[i, j] - w[i, j]):.1e} "
        f"at weight[{i}, {j}] ({g[i, j]:.7f}, expected {w[i, j]:.7f}, allowed {allowed[i, j]:.1e}) "
        f"against {source}"
    )


if __name__ == "__main__":
    main()
