"""A trained run's kept model as a Hugging Face folder with its model card, and the Hub.

    python -m lab.export RUN_DIR                          # RUN_DIR/export
    python -m lab.export RUN_DIR --push_to_hub you/name   # and upload it (private)

The folder holds the encoder in Hugging Face's format (config.json, model.safetensors: our
parameter names are BertModel's; vocab.txt, tokenizer_config.json), the task heads in
heads.safetensors, with mean pooling sentence-transformers' files too, and a card
(README.md) with its forgetting table and its dev scores in the Hub's model-index format.
`--bert RUN_DIR/export` loads it here, `transformers.BertModel.from_pretrained` and
`SentenceTransformer` there. `--push_to_hub` uploads it with huggingface_hub.
"""

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from safetensors.torch import save

import config
import evaluation
import multitask_classifier as mt
import runtime
from checkpoint import atomic_write, read_rows, write_tensors
from config import RunConfig
from evaluation import MULTITASK
from runtime import make_runtime
from tokenizer import BertTokenizer


def export(cfg: RunConfig, run_dir: Path, model, info: dict):
    """The best model as a Hugging Face (and sentence-transformers) folder with its card."""
    out = run_dir / "export"
    card = model_card(cfg, out, read_rows(run_dir), info["row"], model.pooling)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    model_folder(model, tokenizer, out, card, cfg.data.max_length)
    print(f"exported {out}: load it with --bert {out}")
    return out


def model_folder(model, tokenizer, out: Path, card: str, max_length: int) -> None:
    """The encoder in Hugging Face's format (config.json, model.safetensors: our parameter
    names are BertModel's; vocab.txt and tokenizer_config.json), the task heads in
    heads.safetensors, the model card README.md, and with mean pooling sentence-transformers'
    files too. `--bert OUT` loads it here, transformers.BertModel.from_pretrained and
    SentenceTransformer(OUT) there."""
    out.mkdir(parents=True, exist_ok=True)
    hf_config = {"model_type": "bert", "architectures": ["BertModel"]}
    hf_config |= model.bert.config.to_dict()
    atomic_write(json.dumps(hf_config, indent=1), out / "config.json")
    atomic_write(Path(tokenizer.vocab_file).read_bytes(), out / "vocab.txt")
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": tokenizer.do_lower_case,
    }
    atomic_write(
        json.dumps(tokenizer_config | {"model_max_length": max_length}),
        out / "tokenizer_config.json",
    )
    encoder = {k: v.detach().cpu().contiguous() for k, v in model.bert.state_dict().items()}
    atomic_write(save(encoder, metadata={"format": "pt"}), out / "model.safetensors")
    heads = {k: v.detach().cpu().contiguous() for k, v in model.heads.state_dict().items()}
    write_tensors(heads, {"config": model.config()}, out / "heads.safetensors")
    if model.pooling == "mean":  # sentence-transformers pools the last hidden states itself
        write_sentence_transformers(out, model.bert.config.hidden_size, max_length)
    atomic_write(card, out / "README.md")


def write_sentence_transformers(out: Path, hidden: int, max_length: int) -> None:
    """sentence-transformers' layout over a Hugging Face folder: the Transformer module at
    the folder itself, then masked mean pooling (our `mean` pooling), cosine similarity."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    atomic_write(json.dumps(modules, indent=1), out / "modules.json")
    settings = {"max_seq_length": max_length, "do_lower_case": False}  # the tokenizer cases
    atomic_write(json.dumps(settings), out / "sentence_bert_config.json")
    atomic_write(
        json.dumps({"similarity_fn_name": "cosine"}), out / "config_sentence_transformers.json"
    )
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}
    (out / "1_Pooling").mkdir(exist_ok=True)
    atomic_write(json.dumps(pooling, indent=1), out / "1_Pooling" / "config.json")


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


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        prog=config.prog(),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="a finished run folder (its kept model)")
    parser.add_argument(
        "--push_to_hub",
        metavar="REPO",
        help="upload the export to this Hub repository (private; made if missing)",
    )
    args = parser.parse_args(argv)
    cfg, model, info = mt.kept_model(args.run_dir, make_runtime("cpu", "fp32"))
    out = export(cfg, args.run_dir, model, info)
    if args.push_to_hub:
        print(f"uploaded: {push(out, args.push_to_hub)}")
    return out


if __name__ == "__main__":
    runtime.run_cli(main)
