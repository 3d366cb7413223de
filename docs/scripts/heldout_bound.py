"""What bounds the held-out AUC, from a finished run folder, for docs/demo.md.

Three measurements on the run's models: the untouched encoder (the run's --bert as
loaded), the kept model (RUN/best.safetensors) and the last model (RUN/state.safetensors,
the model after the run's last stage).

- wiseft: encoders on the straight line from the untouched weights (alpha 0) to the last
  model's (alpha 1), the last model's heads kept (WiSE-FT), each scored as a stage is
  (the run's dev sets and held-out pairs, cosine cuts fit again): SST, QQP, STS and the
  held-out AUC, and what it lost against alpha 0.
- reset: the last model with one part of its encoder set back to its loaded values (the
  embeddings, each layer, or one kind of weight in every layer), scored the same way.
- bootstrap: the held-out AUC on every entailment and contradiction pair of snli-dev.csv
  (SNLI 1.0's test split) instead of the run's --heldout_size, the untouched encoder's
  minus the kept and the last model's, with a 95% interval from a paired bootstrap
  (1,000 resamples of the pairs, numpy seed 0).

Scoring runs at the run's precision on --device (default: the run's); wiseft and reset
score the model 4 and 16 times, as the run scored each stage. On a run folder of
`--preset demo --train_size 64 --dev_size 64 --heldout_size 64`, on a 2-core CPU that
another run shared, wiseft and reset took 3 minutes and bootstrap about 7.

    python docs/scripts/heldout_bound.py RUN [--only wiseft reset bootstrap]
        [--alphas 0 0.25 0.5 1] [--device cpu] [--data_dir DATA]
"""

import argparse
import copy
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import torch  # noqa: E402

import datasets as data  # noqa: E402
import evaluation  # noqa: E402
import sbert  # noqa: E402
from commands import command
from engine import checkpoint  # noqa: E402
from engine.runtime import make_runtime  # noqa: E402
from evaluation import MULTITASK  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402

KINDS = (  # a weight in every layer, by its name inside the layer
    "self_attention.query",
    "self_attention.key",
    "self_attention.value",
    "attention_dense",
    "attention_layer_norm",
    "interm_dense",
    "out_dense",
    "out_layer_norm",
)
EMBEDDINGS = ("word_embedding.", "pos_embedding.", "tk_type_embedding.", "embed_layer_norm.")


class Runs:
    """A run folder's config, its three models and its scored data, loaded once."""

    def __init__(self, run_dir: Path, device: str | None, data_dir: str | None):
        cfg = command.load_run_config(str(run_dir))
        if data_dir:
            cfg = replace(cfg, data=replace(cfg.data, data_dir=data_dir))
        if not cfg.data.heldout_size:
            raise SystemExit(f"{run_dir}: run without --heldout_size; nothing held out to score")
        self.cfg, self.run_dir = cfg, run_dir
        self.rt = make_runtime(device or cfg.device.device, cfg.device.resolved_precision)
        self.untouched = command.run_model(cfg)().to(self.rt.device).eval()
        self.kept, _ = command.best_model(cfg, run_dir, self.rt)
        self.last = command.run_model(cfg)().to(self.rt.device).eval()
        checkpoint.load_model(self.last, run_dir / checkpoint.STATE)
        self.tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
        self._task_data = None

    def task_data(self) -> dict:
        """The run's dev sets and held-out pairs (and the training pairs of cosine cuts)."""
        if self._task_data is None:
            cfg = self.cfg
            self._task_data = data.load_task_data(
                replace(cfg.data, test_predictions=False),
                self.tokenizer,
                MULTITASK,
                cfg.seed,
                set(sbert.cosine_tasks(cfg)),  # their cuts are fit on training pairs
                cfg.multitask.cross_encode,
            )
        return self._task_data

    def score(self, model) -> dict:
        """The model's row as a stage's: dev scores and the held-out AUC."""
        return command.sub_run(self.cfg, self.run_dir, "", self.rt).score(model, self.task_data())


def encoder_mix(base, top, alpha: float, keys=None):
    """A copy of top whose encoder weights (those in keys; all by default) are
    (1 - alpha) * base's + alpha * top's."""
    model, theirs = copy.deepcopy(top), base.bert.state_dict()
    state = model.bert.state_dict()
    for k in keys if keys is not None else state:
        if state[k].is_floating_point():
            state[k].copy_(torch.lerp(theirs[k], state[k], alpha))
    return model


def cells(row: dict) -> list[str]:
    return [f"{evaluation.main_score(row, t):.3f}" for t in MULTITASK] + [f"{row['heldout']:.4f}"]


def wiseft(runs: Runs, alphas) -> None:
    pairs = runs.task_data()[data.HELDOUT].dev  # the run's held-out pairs
    start = evaluation.roc_auc(  # the untouched encoder's held-out AUC
        *evaluation.pair_scores(runs.untouched, pairs, runs.rt, runs.cfg.data.eval_batch_size)
    )
    print("| alpha | SST acc | QQP acc | STS r | held-out AUC | held-out lost |")
    print("| --- | --- | --- | --- | --- | --- |")
    for alpha in alphas:
        row = runs.score(encoder_mix(runs.untouched, runs.last, alpha))
        print(f"| {alpha:g} | " + " | ".join(cells(row)) + f" | {start - row['heldout']:.4f} |")


def reset(runs: Runs) -> None:
    keys = list(runs.last.bert.state_dict())
    n_layers = runs.last.bert.config.num_hidden_layers
    parts = {"nothing (the last model)": []}
    parts["embeddings"] = [k for k in keys if k.startswith(EMBEDDINGS)]
    for i in range(n_layers):
        parts[f"layer {i}"] = [k for k in keys if k.startswith(f"bert_layers.{i}.")]
    for kind in KINDS:
        names = [f"bert_layers.{i}.{kind}." for i in range(n_layers)]
        parts[f"{kind}, every layer"] = [k for k in keys if k.startswith(tuple(names))]
    print("| reset to the loaded values | SST acc | QQP acc | STS r | held-out AUC |")
    print("| --- | --- | --- | --- | --- |")
    for name, part in parts.items():
        row = runs.score(encoder_mix(runs.untouched, runs.last, 0.0, part))
        print(f"| {name} | " + " | ".join(cells(row)) + " |")


def bootstrap(runs: Runs, resamples: int = 1000) -> None:
    pairs = data.load_heldout(replace(runs.cfg.data, heldout_size=0), runs.tokenizer, 0).dev
    batch = runs.cfg.data.eval_batch_size
    scored = {
        name: evaluation.pair_scores(model, pairs, runs.rt, batch)
        for name, model in (("untouched", runs.untouched), ("kept", runs.kept), ("last", runs.last))
    }
    (base, labels), rng = scored.pop("untouched"), np.random.default_rng(0)
    draws = [rng.integers(0, len(labels), len(labels)) for _ in range(resamples)]
    base_auc = evaluation.roc_auc(base, labels)
    base_aucs = np.array([evaluation.roc_auc(base[i], labels[i]) for i in draws])
    print(f"held-out AUC on all {len(labels)} pairs: untouched {base_auc:.4f}")
    print("| model | AUC | lost | 95% interval |")
    print("| --- | --- | --- | --- |")
    for name, (scores, _) in scored.items():
        auc = evaluation.roc_auc(scores, labels)
        lost = base_aucs - [evaluation.roc_auc(scores[i], labels[i]) for i in draws]
        low, high = np.percentile(lost, [2.5, 97.5])
        print(f"| {name} | {auc:.4f} | {base_auc - auc:.4f} | {low:.4f} to {high:.4f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished run folder")
    parser.add_argument("--only", nargs="+", choices=("wiseft", "reset", "bootstrap"))
    parser.add_argument("--alphas", nargs="+", type=float, default=[0, 0.25, 0.5, 1])
    parser.add_argument("--device", default=None, help="default: the run's")
    parser.add_argument("--data_dir", default=None, help="default: the run's")
    args = parser.parse_args(argv)
    runs = Runs(args.run_dir, args.device, args.data_dir)
    only = args.only or ("wiseft", "reset", "bootstrap")
    if "wiseft" in only:
        wiseft(runs, args.alphas)
    if "reset" in only:
        reset(runs)
    if "bootstrap" in only:
        bootstrap(runs)


if __name__ == "__main__":
    main()
