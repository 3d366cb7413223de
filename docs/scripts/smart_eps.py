"""SMART's R_s over the ball's radius epsilon, for docs/forgetting.md, section 1.

The paper's ascent on the setting of docs/scripts/smart_rs.py (MiniLM's SST head drawn
after torch.manual_seed(0), the first 16 SST training sentences, one ascent step, dropout
on), with the ball's radius epsilon at 1e-5 (the paper's), 1e-3 and 1e-1 and the paper's
ratios kept: the initial noise's sigma = epsilon, the ascent's step eta = 100 epsilon. It
prints R_s with each pass's own dropout masks (the thesis's), and with shared masks in
float32 and under bf16 autocast (where trainer.added_terms runs the shared-mask passes in
float32 when sigma or epsilon is below bf16's resolution, about 8e-3).

Run from the repository root (about a minute on a 2-core CPU):

    python docs/scripts/smart_eps.py [--data_dir DATA]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402
from smart_rs import measure, sst_batch  # noqa: E402  (docs/scripts, this file's folder)

from commands import command
from engine import runtime  # noqa: E402
from evaluation import MULTITASK  # noqa: E402
from settings import ModelConfig  # noqa: E402
from smart import SmartConfig  # noqa: E402

COLUMNS = {  # column -> (dropout masks, precision)
    "own masks (thesis)": ("independent", "fp32"),
    "shared masks, float32": ("shared", "fp32"),
    "shared masks, bf16 autocast": ("shared", "bf16"),
}


def main(argv=None):
    batch = sst_batch(argv)
    torch.manual_seed(0)
    model = command.model_factory(ModelConfig(bert="minilm"), MULTITASK)().train()
    print("| epsilon | " + " | ".join(COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(COLUMNS))
    for epsilon in (1e-5, 1e-3, 1e-1):
        cells = []
        for dropout, precision in COLUMNS.values():
            scaled = dict(sigma=epsilon, eta=100 * epsilon, epsilon=epsilon)  # the paper's ratios
            smart = SmartConfig(lambda_s=1, mu=0, dropout=dropout, **scaled)
            r_s, _ = measure(model, batch, smart, runtime.make_runtime("cpu", precision))
            cells.append(f"{r_s:.2g}")
        print(f"| {epsilon:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
