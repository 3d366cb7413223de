"""An ensemble: the best models of several run folders, their outputs averaged.

    python -m lab.ensemble runs/demo-a runs/demo-b runs/demo-c --out runs/ensemble

Each member predicts with its own settings (checkpoint, tokenizer, max length, pairs
siamese or cross-encoded, pooling), and what is averaged is what each head means: SST's
class probabilities, QQP's paraphrase probability, STS's score. The average is scored on
the dev sets beside each member; its dev and test predictions are written in the CS224n
format under OUT/predictions. A member whose QQP is read out by a cosine cut has no
probability to average and is refused, as are members scored on different dev examples.
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import batches
import datasets as data
import evaluation
from commands import cli, command
from commands.outputs import format_table, prediction_path, write_predictions
from engine import runtime
from engine.runtime import make_runtime
from evaluation import MULTITASK, TASKS, TaskResult
from tokenizer import BertTokenizer

MEANING = {  # a head's output -> what is averaged
    "classification": lambda out: out.softmax(-1),  # (B, C) class probabilities
    "binary": torch.sigmoid,  # (B,) the probability of the positive class
    "regression": lambda out: out.float(),  # (B,) the score itself
}
DECIDE = {  # the averaged output -> a prediction
    "classification": lambda p: p.argmax(-1),
    "binary": lambda p: (p > 0.5).long(),
    "regression": lambda p: p,
}


def member_outputs(run_dir: Path, rt, splits=("dev", "test"), data_dir=None) -> dict:
    """{(task, split): (ids, averaged-kind outputs, labels or None)} of a run's best model,
    on its own data folder or `data_dir`."""
    cfg = command.load_run_config(str(run_dir))
    model, _ = command.best_model(cfg, run_dir, rt)
    if "para" in model.cosine:
        raise SystemExit(
            f"{run_dir}: QQP is read out by a cosine cut ({cfg.multitask.para_loss}), which "
            "gives no probability to average; ensemble members need QQP's classifier head"
        )
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    data_dir = data_dir or cfg.data.data_dir
    data_cfg = replace(
        cfg.data, test_predictions="test" in splits, heldout_size=0, data_dir=data_dir
    )
    task_data = data.load_task_data(
        data_cfg, tokenizer, MULTITASK, cfg.seed, (), cfg.multitask.cross_encode
    )
    outputs = {}
    model.eval()
    with torch.no_grad(), rt.autocast():
        for task in MULTITASK:
            for split in splits:
                loader = batches.make_loader(getattr(task_data[task], split), 128, shuffle=False)
                outputs[task, split] = predict_all(model, task, loader, rt)
    return outputs


def predict_all(model, task: str, loader, rt) -> tuple[list, torch.Tensor, torch.Tensor | None]:
    """(ids, outputs as MEANING makes them, labels or None) of one split."""
    ids, outs, labels = [], [], []
    for batch in loader:
        batch = runtime.to_device(batch, rt.device)
        outs.append(MEANING[TASKS[task].kind](model.predict(task, batch).float()).cpu())
        ids += batch["ids"]
        if "labels" in batch:
            labels.append(batch["labels"].cpu())
    return ids, torch.cat(outs), torch.cat(labels) if labels else None


def average(members: dict[str, dict]) -> dict:
    """The members' outputs averaged, {(task, split): (ids, mean, labels)} in the first
    member's order (a member batches by its own lengths, so orders differ); members must
    have predicted the same examples."""
    (first, reference), *others = members.items()
    out = {}
    for key, (ids, value, labels) in reference.items():
        aligned = [value]
        for name, outputs in others:
            their_ids, their_value, _ = outputs[key]
            if sorted(their_ids) != sorted(ids):
                task, split = key
                raise SystemExit(
                    f"{name} predicted other {TASKS[task].title} {split} examples than {first} "
                    "(another --dev_size or data folder?); ensemble runs of the same data"
                )
            at = {id_: i for i, id_ in enumerate(their_ids)}
            aligned.append(their_value[[at[id_] for id_ in ids]])
        out[key] = (ids, torch.stack(aligned).mean(0), labels)
    return out


def scored(outputs: dict, split: str = "dev") -> dict[str, TaskResult]:
    """TaskResults (metrics, ids, predictions) of outputs on a split."""
    results = {}
    for task in MULTITASK:
        ids, value, labels = outputs[task, split]
        kind = TASKS[task].kind
        preds = DECIDE[kind](value).numpy()
        metrics = evaluation.RULES[kind][1](labels.numpy(), preds) if labels is not None else {}
        results[task] = TaskResult(metrics, ids, preds.tolist())
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=cli.prog(), description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (their best models)")
    parser.add_argument("--out", type=Path, default=Path("runs/ensemble"), help="output folder")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--no_test_predictions", action="store_true", help="dev only")
    parser.add_argument("--data_dir", help="the data folder, if not the runs' own (moved)")
    args = parser.parse_args(argv)
    rt = make_runtime(args.device, "fp32")  # averaged probabilities: no rounding to bf16
    splits = ("dev",) if args.no_test_predictions else ("dev", "test")
    members = {str(run): member_outputs(run, rt, splits, args.data_dir) for run in args.runs}
    mean = average(members)
    rows = []
    for i, (name, outputs) in enumerate(members.items(), start=1):
        print(f"member {i}: {name}")
        rows.append({"stage": f"member {i}"} | evaluation.score_row(scored(outputs), MULTITASK))
    rows.append({"stage": "ensemble"} | evaluation.score_row(scored(mean), MULTITASK))
    print(format_table(rows, MULTITASK))
    for split in splits:
        for task, res in scored(mean, split).items():
            path = prediction_path(args.out / "predictions", task, split)
            write_predictions(path, task, res.ids, res.preds)
    print(f"predictions of the ensemble: {args.out / 'predictions'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run_cli(main))
