"""A trained run's best model put to use: prediction files, labels, an exported folder.

- `rewrite_predictions` (--predict RUN): score each best model on dev again and rewrite its
  prediction files in the handout's format;
- `label` (--label RUN): labels for sentences typed or piped in, one per line;
- `export` (--export RUN): the model as a Hugging Face and sentence-transformers folder
  (checkpoint.export_model_folder) with a model card holding its forgetting table and its
  scores in the Hub's model-index format; `push` (--push_to_hub REPO) uploads it.

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
    return out


# Each task's Hub dataset, card title and pipeline; the scores are on the CS224n dev splits
ACCURACY, STS_METRICS = {"accuracy": "accuracy"}, {"pearson": "pearsonr", "spearman": "spearmanr"}
HUB_TASKS = {  # task: Hub dataset (its config), card title, pipeline, our metric -> the Hub's
    "sst": ("SetFit/sst5", None, "SST-5", "text-classification", ACCURACY),
    "para": ("nyu-mll/glue", "qqp", "Quora Question Pairs", "text-classification", ACCURACY),
    "sts": ("sentence-transformers/stsb", None, "STS-B", "sentence-similarity", STS_METRICS),
}
HUB_BASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}


def card_metadata(cfg: RunConfig, name: str, rows: list, best: dict) -> str:
    """The card's YAML header: licence, datasets, base model and the kept model's dev
    scores in the Hub's model-index format (what the Hub shows as evaluation results)."""
    base = HUB_BASES.get(cfg.model.bert, cfg.model.bert)
    datasets = [hub for hub, *_ in HUB_TASKS.values()]  # the Hub's ids of the handout's data
    if any(r.get("kind") == "contrastive" for r in rows):
        datasets.append("stanfordnlp/snli")
    lines = ["library_name: sentence-transformers", "pipeline_tag: sentence-similarity"]
    lines += [] if Path(base).exists() else [f"base_model: {base}"]  # a local folder: none
    lines += ["language: en", "license: apache-2.0", "datasets:", *(f"- {d}" for d in datasets)]
    lines += ["tags:", "- sentence-transformers", "- sentence-similarity", "- minbert"]
    lines += ["model-index:", f"- name: {json.dumps(name)}", "  results:"]  # quoted: any name
    for task, (hub, subset, title, kind, metrics) in HUB_TASKS.items():
        if task not in best:
            continue
        lines += ["  - task:", f"      type: {kind}", f"      name: {title}", "    dataset:"]
        lines += [f"      name: {title} (CS224n dev)", f"      type: {hub}", "      split: dev"]
        lines += [f"      config: {subset}"] if subset else []
        lines.append("    metrics:")
        for ours, theirs in metrics.items():
            if ours in best[task]:
                value = round(float(best[task][ours]), 4)
                lines += [
                    f"    - type: {theirs}",
                    f"      value: {value}",
                    f"      name: dev {ours}",
                ]
    return "---\n" + "\n".join(lines) + "\n---\n\n"


def model_card(cfg: RunConfig, out: Path, rows: list, best: dict, pooling: str) -> str:
    """README.md of an export: metadata, how to load it, its forgetting table and config."""
    loaders = f"transformers.BertModel.from_pretrained('{out}')  # the encoder"
    if pooling == "mean":
        loaders = f"SentenceTransformer('{out}')  # mean-pooled embeddings\n" + loaders
    scores = {t: best[t] for t in MULTITASK if t in best}
    name = f"{cfg.preset}-{Path(cfg.run_dir).name}"
    return (
        card_metadata(cfg, name, rows, best) + f"# {cfg.preset}: {Path(cfg.run_dir).name}\n\n"
        f"Trained from `{cfg.model.bert}` with `--preset {cfg.preset}` (torch "
        f"{torch.__version__}) on SST-5, Quora and STS-B. Kept stage: {best['stage']}, "
        f"dev overall {best['overall']:.4f}: `{json.dumps(scores)}`. STS is scored by "
        "Pearson r, as CS224n's overall score is, and by Spearman's rho.\n\n"
        f"## Loading it\n\n```python\n{loaders}\n```\n\nHere: `--bert {out}`; the task "
        "heads are in `heads.safetensors`.\n\n## Every stage's dev scores\n\n```\n"
        + evaluation.format_table(rows, MULTITASK, best["index"])
        + "\n```\n\n## Config\n\n```json\n"
        + json.dumps(config.to_dict(cfg), indent=1)
        + "\n```\n"
    )


def push(folder: Path, repo: str) -> str:
    """--push_to_hub: upload an export folder to a private Hub repository (made if it is
    missing) with huggingface_hub; the token from the usual places (HF_TOKEN, `hf auth
    login`), the Hub from HF_ENDPOINT if set. Returns the commit's address."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    if not get_token():
        raise SystemExit("--push_to_hub: no Hugging Face token; `hf auth login` or set HF_TOKEN")
    api = HfApi()
    try:
        api.create_repo(repo, private=True, exist_ok=True)
        done = api.upload_folder(repo_id=repo, folder_path=folder, commit_message="minBERT export")
    except (HfHubHTTPError, ValueError) as e:  # ValueError: the Hub refused the card
        raise SystemExit(f"--push_to_hub {repo}: the Hub said {e}") from None
    return done.commit_url


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
