"""SMART's R_s on MiniLM's SST head, for the table in docs/forgetting.md, section 1.

For each ascent (the paper's, with shared or own dropout masks; the reference code's, with
own masks) it prints R_s and the median over tokens of the final perturbation's largest
coordinate, with dropout on and off. One batch: the first 16 SST training sentences,
float32, one ascent step, the SST head drawn after torch.manual_seed(0). R_s is computed
by trainer.smart_term, as a training step computes it (lambda_s = 1, mu = 0).

Run from the repository root (under a minute on a 2-core CPU):

    python docs/scripts/smart_rs.py [--data_dir DATA]
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

import batches  # noqa: E402
import datasets as data  # noqa: E402
import trainer  # noqa: E402
from commands import command
from engine import runtime  # noqa: E402
from evaluation import MULTITASK  # noqa: E402
from presets import Stage  # noqa: E402
from settings import DataConfig, ModelConfig, OptimConfig  # noqa: E402
from smart import RngSnapshot, SmartConfig  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402
from trainer import StepContext  # noqa: E402

ASCENTS = {  # row name -> SmartConfig settings
    "paper, shared masks": dict(dropout="shared"),
    "paper, own masks (thesis)": dict(dropout="independent"),
    "reference, own masks": dict(dropout="independent", variant="reference"),
}


def measure(model, batch, cfg: SmartConfig, rt) -> tuple[float, float]:
    """(R_s, median over real tokens of the final perturbation's largest coordinate)."""
    seen = []

    def recording(f, embeds, *args, **kwargs):  # keeps what each pass of f was given
        def f_seen(e):
            seen.append(e.detach())
            return f(e)

        return smart_loss(f_seen, embeds, *args, **kwargs)

    smart_loss, trainer.smart_loss = trainer.smart_loss, recording
    stage = Stage(("sst",), 1e-5, len(batch["labels"]), smart=cfg)
    try:
        torch.manual_seed(0)
        float32 = trainer.added_terms(stage, OptimConfig(), rt)["sst"].float32
        with rt.autocast(float32):  # as train_step
            draws = RngSnapshot(rt.device)
            embeds = model.embed(batch)  # (B, T, H)
            out = model("sst", batch, embeds)
            ctx = StepContext(rt)  # a step's context: no teacher
            clean = trainer.Clean("sst", batch, None, embeds, out, draws)
            r_s = trainer.smart_term(model, stage, clean, ctx)
    finally:
        trainer.smart_loss = smart_loss
    # the last pass is f(embeds + noise) with the final noise (both ascents end so)
    noise = seen[-1].float() - embeds.detach().float()  # (B, T, H)
    largest = noise.abs().amax(dim=-1)[batch["attention_mask"].bool()]  # (real tokens,)
    return r_s.item(), statistics.median(largest.tolist())


def sst_batch(argv=None) -> dict:
    """The first 16 SST training sentences as one batch; argv: --data_dir (this script's and
    the other docs/scripts that import it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=None, help="default $MINBERT_DATA, else data/")
    args = parser.parse_args(argv)
    tok = BertTokenizer.from_pretrained("minilm")
    cfg = DataConfig(args.data_dir, train_size=16, train_first=True, dev_size=1)
    cfg.test_predictions = False
    task_data = data.load_task_data(cfg, tok, ("sst",), 0)
    return next(iter(batches.make_loader(task_data["sst"].train, 16, shuffle=False)))


def main(argv=None):
    batch = sst_batch(argv)
    torch.manual_seed(0)
    model = command.model_factory(ModelConfig(bert="minilm"), MULTITASK)()
    rt = runtime.make_runtime("cpu", "fp32")
    print("| ascent | R_s, dropout on | perturbation | R_s, dropout off | perturbation |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, settings in ASCENTS.items():
        cells = []
        for dropout_on in (True, False):
            model.train(dropout_on)
            r_s, size = measure(model, batch, SmartConfig(lambda_s=1, mu=0, **settings), rt)
            cells += [f"{r_s:.2g}", f"{size:.2g}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
