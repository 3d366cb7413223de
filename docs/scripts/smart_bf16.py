"""What bf16 changes in SMART's R_s, for docs/precision.md.

The setting of docs/scripts/smart_rs.py (MiniLM's SST head drawn after torch.manual_seed(0),
the first 16 SST training sentences, one ascent step, dropout on): each ascent's R_s with
its passes in float32, and under bf16 autocast as a training step runs them
(trainer.added_terms: float32 for the paper's ascent with shared masks, bf16 otherwise).

Run from the repository root (under a minute on a 2-core CPU):

    python docs/scripts/smart_bf16.py [--data_dir DATA]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402
from smart_rs import ASCENTS, measure, sst_batch  # noqa: E402  (docs/scripts, this folder)

from commands import command
from engine import runtime  # noqa: E402
from evaluation import MULTITASK  # noqa: E402
from settings import ModelConfig  # noqa: E402
from smart import SmartConfig, passes_in_float32  # noqa: E402


def main(argv=None):
    batch = sst_batch(argv)
    torch.manual_seed(0)
    model = command.model_factory(ModelConfig(bert="minilm"), MULTITASK)().train()
    fp32, bf16 = (runtime.make_runtime("cpu", p) for p in ("fp32", "bf16"))
    print("| ascent | passes under bf16 | R_s, float32 | R_s, bf16 step | bf16 / float32 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, settings in ASCENTS.items():
        cfg = SmartConfig(lambda_s=1, mu=0, **settings)
        r32, r16 = (measure(model, batch, cfg, rt)[0] for rt in (fp32, bf16))
        passes = "float32" if passes_in_float32(cfg, bf16.amp_dtype) else "bf16"
        print(f"| {name} | {passes} | {r32:.3g} | {r16:.3g} | {r16 / r32:.4f} |")


if __name__ == "__main__":
    main()
