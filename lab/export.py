"""A trained run's kept model as a Hugging Face folder with its model card, and the Hub.

    python -m lab.export RUN_DIR                          # RUN_DIR/export
    python -m lab.export RUN_DIR --push_to_hub you/name   # and upload it (private)

The folder holds the encoder in Hugging Face's format (config.json, model.safetensors: our
parameter names mapped to BertModel's; vocab.txt, tokenizer_config.json), the task heads in
heads.safetensors, with mean pooling sentence-transformers' files too, and a card
(README.md) with its forgetting table and its dev scores in the Hub's model-index format,
on the CS224n handout's own dev files (named as such, with their row counts: no Hub data
set has those splits). `--bert RUN_DIR/export` loads it here,
`transformers.BertModel.from_pretrained` there, and with mean pooling `SentenceTransformer`
(only then does the card name sentence-transformers: without its modules.json,
SentenceTransformer would mean-pool a --pooling cls encoder). `--push_to_hub` uploads it
with huggingface_hub.
"""

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from safetensors.torch import save

import datasets as data
from base_bert import ours_to_hf
from commands import cli, command, flags, outputs
from engine.checkpoint import atomic_write, read_rows, write_tensors
from engine.runtime import make_runtime
from evaluation import MULTITASK
from presets import PRESETS
from settings import RunConfig
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
    names mapped to BertModel's; vocab.txt and tokenizer_config.json), the task heads in
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
    state = model.bert.state_dict()
    encoder = {  # by Hugging Face's names (base_bert.HF_NAMES), BERT's own weights only
        ours_to_hf(k): v.detach().cpu().contiguous() for k, v in state.items() if ours_to_hf(k)
    }
    if left := [k for k in state if not ours_to_hf(k)]:  # weights bert.py adds to BERT's
        print(f"not exported (Hugging Face's BertModel has no such weight): {', '.join(left)}")
    atomic_write(save(encoder, metadata={"format": "pt"}), out / "model.safetensors")
    heads = {k: v.detach().cpu().contiguous() for k, v in model.heads.state_dict().items()}
    write_tensors(heads, {"config": model.checkpoint_config()}, out / "heads.safetensors")
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


# The scores are on the CS224n handout's own dev files, which no Hub data set holds (GLUE's
# QQP validation has 40,430 rows, the handout's Quora dev 20,214; its STS dev is its own cut
# of STS-B): a result's dataset type is the file's name, which no Hub repository id can be.
ACCURACY, STS_METRICS = {"accuracy": "accuracy"}, {"pearson": "pearsonr", "spearman": "spearmanr"}
CARD_TASKS = {  # task: card title, the Hub's task type, our metric -> the Hub's
    "sst": ("SST-5", "text-classification", ACCURACY),
    "para": ("Quora Question Pairs", "text-classification", ACCURACY),
    "sts": ("STS-B", "sentence-similarity", STS_METRICS),
}
HUB_BASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
SNLI = "stanfordnlp/snli"  # snli-train.csv: SNLI 1.0's training pairs, as the Hub's copy has


def dev_rows(cfg: RunConfig) -> dict:
    """Task -> (its dev file's name, rows the run scored, rows in the file); the counts are
    None where the file is not here to read (the run's --data_dir, else the default)."""
    folder = data.data_dir(cfg.data.data_dir)
    counts = {}
    for task in CARD_TASKS:
        name = data.task_file(folder, task, "dev").name
        try:  # read as the run read it: the same rows skipped
            total = len(data.read_task(folder, task, "dev", cfg.data.strict))
        except (OSError, data.DataError):
            counts[task] = (name, None, None)
            continue
        counts[task] = (name, min(cfg.data.dev_size or total, total), total)  # --dev_size
    return counts


def trained_on_snli(cfg: RunConfig, best: dict) -> bool:
    """Whether a contrastive stage on SNLI came before the kept stage (or was it)."""
    stages = PRESETS[cfg.preset].plans_of(cfg)[""][: best["index"] + 1]
    return any(s.kind == data.CONTRASTIVE and s.contrastive.simcse_data == "snli" for s in stages)


def card_metadata(cfg: RunConfig, name: str, best: dict, dev: dict, pooling: str) -> str:
    """The card's YAML header: library, licence, base model, the Hub data sets that trained
    it (SNLI at most) and the kept model's dev scores in the Hub's model-index format (what
    the Hub shows as evaluation results). sentence-transformers only with mean pooling: the
    export writes its modules.json then; without one, SentenceTransformer mean-pools."""
    base = HUB_BASES.get(cfg.model.bert, cfg.model.bert)
    if pooling == "mean":
        lines = ["library_name: sentence-transformers", "pipeline_tag: sentence-similarity"]
        tags = ["sentence-transformers", "sentence-similarity", "minbert"]
    else:  # the sentence embedding is BertModel's pooler_output
        lines = ["library_name: transformers", "pipeline_tag: feature-extraction"]
        tags = ["minbert"]
    lines += [] if Path(base).exists() else [f"base_model: {base}"]  # a local folder: none
    lines += ["language: en", "license: apache-2.0"]
    lines += ["datasets:", f"- {SNLI}"] if trained_on_snli(cfg, best) else []
    lines += ["tags:", *(f"- {t}" for t in tags)]
    lines += ["model-index:", f"- name: {json.dumps(name)}", "  results:"]  # quoted: any name
    for task, (title, kind, metrics) in CARD_TASKS.items():
        if task in best:
            lines += model_index_result(title, kind, metrics, best[task], dev[task])
    return "---\n" + "\n".join(lines) + "\n---\n\n"


def rows_counted(scored: int | None, total: int | None) -> str:
    """'12 of 16 rows' where --dev_size sampled the file, '16 rows' where it did not, ''
    where the file was not here to count."""
    if total is None:
        return ""
    return f"{scored:,} of {total:,} rows" if scored < total else f"{total:,} rows"


def model_index_result(title: str, kind: str, metrics: dict, scores: dict, dev: tuple) -> list:
    """One task's model-index entry: the handout's dev file as the data set, split dev."""
    file, scored, total = dev
    counted = rows_counted(scored, total)
    dataset = f"CS224n {title} dev" + (f" ({counted})" if counted else "")
    lines = ["  - task:", f"      type: {kind}", f"      name: {title}", "    dataset:"]
    lines += [f"      name: {json.dumps(dataset)}", f"      type: {json.dumps(f'cs224n:{file}')}"]
    lines += ["      split: dev", "    metrics:"]
    for ours, theirs in metrics.items():
        if ours in scores:
            value = round(float(scores[ours]), 4)
            lines += [f"    - type: {theirs}", f"      value: {value}", f"      name: dev {ours}"]
    return lines


def data_prose(cfg: RunConfig, dev: dict, snli: bool) -> str:
    """The card's paragraph on the data: the handout's files, with each dev file's rows."""
    counts = "; ".join(
        f"{file}: {rows_counted(n, total) or 'not here to count'}"
        for file, n, total in dev.values()
    )
    sampled = (
        f", a fixed random sample (--dev_size {cfg.data.dev_size})" if cfg.data.dev_size else ""
    )
    return (
        "## Data\n\nTrained on the CS224n default final project's train files "
        f"(github.com/gpoesia/minbert-default-final-project){' and SNLI 1.0' if snli else ''}. "
        f"Scored on its dev files, read from `{data.data_dir(cfg.data.data_dir)}`: the "
        f"handout's own splits, not any Hub data set's. Rows scored{sampled}: {counts}.\n\n"
    )


def model_card(cfg: RunConfig, out: Path, rows: list, best: dict, pooling: str) -> str:
    """README.md of an export: metadata, how to load it, its data, forgetting table, config."""
    loaders = f"transformers.BertModel.from_pretrained('{out}')  # the encoder"
    if pooling == "mean":
        loaders = f"SentenceTransformer('{out}')  # mean-pooled embeddings\n" + loaders
    else:
        loaders += "\n# --pooling cls: its pooler_output (SentenceTransformer would mean-pool)"
    scores = {t: best[t] for t in MULTITASK if t in best}
    name = f"{cfg.preset}-{Path(cfg.run_dir).name}"
    dev = dev_rows(cfg)
    return (
        card_metadata(cfg, name, best, dev, pooling)
        + f"# {cfg.preset}: {Path(cfg.run_dir).name}\n\n"
        f"Trained from `{cfg.model.bert}` with `--preset {cfg.preset}` (torch "
        f"{torch.__version__}) on CS224n's SST-5, Quora and STS-B. Kept stage: {best['stage']}, "
        f"dev overall {best['overall']:.4f}: `{json.dumps(scores)}`. STS is scored by "
        "Pearson r, as CS224n's overall score is, and by Spearman's rho.\n\n"
        f"## Loading it\n\n```python\n{loaders}\n```\n\nHere: `--bert {out}`; the task "
        "heads are in `heads.safetensors`.\n\n"
        + data_prose(cfg, dev, trained_on_snli(cfg, best))
        + "## Every stage's dev scores\n\n```\n"
        + outputs.format_table(rows, MULTITASK, best["index"])
        + "\n```\n\n## Config\n\n```json\n"
        + json.dumps(flags.to_dict(cfg), indent=1)
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
        prog=cli.prog(),
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
    command.sentence_bert(command.load_run_config(args.run_dir), str(args.run_dir))
    cfg, model, info = command.kept_model(args.run_dir, make_runtime("cpu", "fp32"))
    out = export(cfg, args.run_dir, model, info)
    if args.push_to_hub:
        print(f"uploaded: {push(out, args.push_to_hub)}")
    return out


if __name__ == "__main__":
    cli.run_cli(main)
