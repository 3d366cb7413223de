"""Single-task sentiment classification: the thesis's Phase 1 (CS224n handout part 1).

SST-5 (5 classes) or CFIMDB (2 classes) with a linear head on the pooled sentence:
- `--option last-linear-layer`: BERT frozen, only the head learns (lr 1e-3);
- `--option finetune`: every parameter learns (lr 1e-5).
It is the multitask code with one task: the same model class, the same training loop
(multitask_classifier.run_plan) and the same evaluation, scored on that task's dev set.

    python classifier.py --task sst --option finetune
"""

import argparse
import time
from pathlib import Path

import torch

import multitask_classifier as mt
from tokenizer import BertTokenizer

DEFAULT_LR = {"last-linear-layer": 1e-3, "finetune": 1e-5}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Sentiment classification with a frozen or fine-tuned BERT.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--task", choices=("sst", "cfimdb"), default="sst", help="data set")
    p.add_argument(
        "--option",
        choices=tuple(DEFAULT_LR),
        default="finetune",
        help="last-linear-layer: BERT frozen, train the head; finetune: train everything",
    )
    p.add_argument("--bert", default="minilm", help="checkpoint folder, 'minilm' or a hub name")
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="sentence vector")
    p.add_argument("--dropout", type=float, default=0.3, help="dropout before the head")
    p.add_argument("--lr", type=float, default=None, help="default: 1e-3 frozen, 1e-5 finetune")
    p.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    p.add_argument("--batch_size", type=int, default=16, help="training batch size")
    p.add_argument("--eval_batch_size", type=int, default=128, help="evaluation batch size")
    p.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--max_length", type=int, default=128, help="truncate to this many tokens")
    p.add_argument("--train_size", type=int, default=0, help="training examples (0: all)")
    p.add_argument("--dev_size", type=int, default=0, help="dev/test examples (0: all)")
    p.add_argument("--data_dir", default=None, help="data folder ($MINBERT_DATA, else data/)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad data row")
    p.add_argument(
        "--run_dir", default=None, help="output folder (default runs/<task>-<option>-<time>)"
    )
    p.add_argument("--seed", type=int, default=11711, help="random seed")
    p.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
    p.add_argument("--no_amp", dest="amp", action="store_false", help="float32 on GPU")
    p.add_argument(
        "--attention", choices=("manual", "sdpa"), default="manual", help="attention kernel"
    )
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        raise SystemExit("--epochs and --batch_size must be at least 1")
    args.lr = args.lr if args.lr is not None else DEFAULT_LR[args.option]
    # fields the shared runner reads, fixed for this single-task driver
    args.compile, args.foreach_adamw, args.test_predictions = False, False, True
    args.cross_encode = []
    run_dir = Path(
        args.run_dir or f"runs/{args.task}-{args.option}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    torch.manual_seed(args.seed)
    rt = mt.make_runtime(args.device, args.amp)
    tokenizer = BertTokenizer.from_pretrained(args.bert)
    tasks = (args.task,)
    task_data = mt.load_task_data(args, tokenizer, tasks)
    frozen = args.option == "last-linear-layer"
    make_model = mt.model_factory(args, tasks)
    stages = [  # one stage per epoch, so each epoch gets a row and a chance to be kept
        mt.Stage(
            args.task,
            lr=args.lr,
            batch_size=args.batch_size,
            name=f"epoch {e + 1}",
            freeze_encoder=frozen,
        )  # fmt: skip
        for e in range(args.epochs)
    ]
    print(f"{args.task} {args.option}: {args.bert} on {rt.device}, lr {args.lr}")
    t0 = time.time()
    model, rows, best = mt.run_plan(
        stages, make_model, task_data, args, run_dir, tasks, rt, score_train=True
    )
    mt.finish(model, rows, best, task_data, args, run_dir, tasks, rt, time.time() - t0)
    return rows, best


if __name__ == "__main__":
    main()
