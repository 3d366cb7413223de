"""A trained run's best model put to use: prediction files, labels, an exported folder.

- `rewrite_predictions` (--predict RUN): score each best model on dev again and rewrite its
  prediction files in the handout's format;
- `label` (--label RUN): labels for sentences typed or piped in, one per line;
- `export` (--export RUN): the model as a Hugging Face and sentence-transformers folder
  (checkpoint.export_model_folder) with a model card holding its forgetting table.

multitask_classifier.py loads the models and calls these.
"""

import json
from pathlib import Path

import torch

import checkpoint
import config
import datasets as data
import evaluation
from config import RunConfig
from evaluation import MULTITASK
from runfolder import write_predictions
from tokenizer import BertTokenizer


def rewrite_predictions(cfg: RunConfig, best_models):
    """best_models: (runfolder.Run, model, checkpoint info) of each sub-run, loaded as
    needed: each scored on dev, its prediction files written again."""
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    cross = cfg.multitask.cross_encode
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, set(), cross)
    for run, model, info in best_models:
        print(evaluation.table_header(run.eval_tasks))
        run.show({"stage": f"best: {info['row']['stage']}"} | run.evaluate(model, task_data))
        out_dir = write_predictions(model, task_data, run, cfg.data.test_predictions)
        print(f"predictions: {out_dir}")


def export(cfg: RunConfig, run_dir: Path, model, info: dict):
    """The best model as a Hugging Face (and sentence-transformers) folder with its card."""
    out = run_dir / "export"
    card = model_card(cfg, out, checkpoint.read_rows(run_dir), info["row"], model.pooling)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    checkpoint.export_model_folder(model, tokenizer, out, card, cfg.data.max_length)
    print(f"exported {out}: load it with --bert {out}")


def model_card(cfg: RunConfig, out: Path, rows: list, best: dict, pooling: str) -> str:
    """README.md of an export: metadata, how to load it, its forgetting table and config."""
    loaders = f"transformers.BertModel.from_pretrained('{out}')  # the encoder"
    if pooling == "mean":
        loaders = f"SentenceTransformer('{out}')  # mean-pooled embeddings\n" + loaders
    scores = {t: best[t] for t in MULTITASK if t in best}
    return (
        "---\nlibrary_name: sentence-transformers\npipeline_tag: sentence-similarity\n"
        f"base_model: {cfg.model.bert}\nlanguage: en\ntags:\n- sentence-transformers\n"
        "- sentence-similarity\n- minbert\n---\n\n"
        f"# {cfg.preset}: {Path(cfg.run_dir).name}\n\n"
        f"Trained from `{cfg.model.bert}` with `--preset {cfg.preset}` (torch "
        f"{torch.__version__}) on SST-5, Quora and STS-B. Kept stage: {best['stage']}, "
        f"dev overall {best['overall']:.4f}: `{json.dumps(scores)}`.\n\n"
        f"## Loading it\n\n```python\n{loaders}\n```\n\nHere: `--bert {out}`; the task "
        "heads are in `heads.safetensors`.\n\n## Every stage's dev scores\n\n```\n"
        + evaluation.format_table(rows, MULTITASK, best["index"])
        + "\n```\n\n## Config\n\n```json\n"
        + json.dumps(config.to_dict(cfg), indent=1)
        + "\n```\n"
    )


def label(cfg: RunConfig, model, rt, lines):
    """--label: print the model's labels for each input line as it comes: a sentence, or
    two separated by a tab (blank lines are skipped)."""
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    for n, line in enumerate(x.strip("\r\n ") for x in lines):
        a, b = data.split_input_line(line, n + 1)
        if b:
            pair, batches = [data.PairExample(str(n), a, b, None)], {}
            for cross in {t in cfg.multitask.cross_encode for t in ("para", "sts")}:
                dataset = data.PairDataset(pair, tokenizer, cfg.data.max_length, cross_encode=cross)
                batches[cross] = evaluation.to_device(dataset.collate([0]), rt.device)
            with torch.no_grad():  # each task as it was trained: siamese or cross-encoded
                p, score = (
                    model(t, batches[t in cfg.multitask.cross_encode]) for t in ("para", "sts")
                )
            if "para" in model.cosine:  # a cosine read-out has a cut, not a probability
                how = "cos" if model.siamese == "cosine" else "-d"
                para = f"paraphrase {'yes' if p.item() > 0 else 'no'} ({how} - cut {p.item():+.3f})"
            else:
                para = f"paraphrase {torch.sigmoid(p).item():.3f}"
            print(f"{para}\tsimilarity {score.item():.2f}\t{line}", flush=True)
        elif a:
            example = data.SentenceExample(str(n), a, None)
            batch = data.SentenceDataset([example], tokenizer, cfg.data.max_length).collate([0])
            with torch.no_grad():
                probs = model("sst", evaluation.to_device(batch, rt.device)).softmax(-1)[0]
            sentiment = f"sentiment {probs.argmax().item()} (p {probs.max().item():.2f})"
            print(f"{sentiment}\t{line}", flush=True)
