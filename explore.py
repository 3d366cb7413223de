"""See inside a model: what its attention heads look at, and a run's report page.

    python explore.py attention RUN_DIR "a sentence" [--pair "a second sentence"] [--layer 6]
    python explore.py report RUN_DIR

attention draws RUN_DIR/attention-layerL.png: for each head of that layer (default: the
last), a heatmap of the attention probabilities over the sentence's word pieces (or the
pair's, encoded together as [CLS] a [SEP] b [SEP]), the model the run started from above
the model it kept. Row i of a heatmap says where token i looks; each row sums to 1.

report writes RUN_DIR/report.html, one file with its pictures inline (no network): the dev
scores after every stage with the kept stage marked, the kept model's SST-5 confusion
matrix, its STS predictions against gold (Pearson and Spearman), and the dev examples it
got most wrong, read from the run's predictions/ and the dev files.
"""

import argparse
import base64
import html
import io
from pathlib import Path

import numpy as np
import torch

import config
import evaluation
import multitask_classifier as mt
import plots
from bert import BertModel
from checkpoint import BEST, atomic_write
from datasets import data_dir, read_task
from runtime import make_runtime
from tokenizer import BertTokenizer

WORST = 8  # errors listed per task


def attention_maps(bert: BertModel, tokenizer, text: str, pair: str | None = None):
    """(word pieces, probabilities (L, nh, n, n)) of one sentence or pair, on the CPU."""
    enc = tokenizer(text, pair, max_length=bert.config.max_position_embeddings)
    ids, types = enc["input_ids"], enc["token_type_ids"]  # (1, n) each
    with torch.no_grad():
        out = bert.encode(bert.embed(ids, types), enc["attention_mask"], output_attentions=True)
    probs = torch.stack(out["attentions"])[:, 0]  # (L, 1, nh, n, n) -> (L, nh, n, n)
    return tokenizer.convert_ids_to_tokens(ids[0].tolist()), probs.float()


def untouched_and_kept(run_dir: Path) -> dict[str, BertModel]:
    """The encoder a run started from and the one it kept (best.safetensors), in eval mode
    with the hand-written attention (the one that returns its probabilities)."""
    cfg = mt.load_run_config(str(run_dir))
    model, _ = mt.best_model(cfg, run_dir, make_runtime("cpu", "fp32"))
    untouched = BertModel.from_pretrained(cfg.model.bert).eval()
    return {"untouched": untouched, "kept": model.bert.eval()}


def draw_attention(args, parser) -> Path:
    models = untouched_and_kept(args.run_dir)
    layers = models["kept"].config.num_hidden_layers
    layer = args.layer or layers
    if not 1 <= layer <= layers:
        parser.error(f"--layer {layer}: this model has layers 1 to {layers}")
    tokenizer = BertTokenizer.from_pretrained(mt.load_run_config(str(args.run_dir)).model.bert)
    maps = {}
    for name, bert in models.items():
        tokens, maps[name] = attention_maps(bert, tokenizer, args.text, args.pair)
    out = args.out or args.run_dir / f"attention-layer{layer}.png"
    plots.attention_figure(tokens, maps, layer - 1).savefig(out, dpi=110)
    return out


# ---------------------------------------------------------------------------------------
# The report page


def dev_predictions(run_dir: Path) -> dict[str, list[tuple]]:
    """{task: [(dev example, the kept model's prediction), ...]} from RUN_DIR/predictions."""
    cfg = mt.load_run_config(str(run_dir))
    out = {}
    for task in evaluation.MULTITASK:
        path = evaluation.prediction_path(run_dir / "predictions", task, "dev")
        if path.is_file():
            gold = {e.id: e for e in read_task(data_dir(cfg.data.data_dir), task, "dev")}
            ids, preds = evaluation.read_predictions(path)
            out[task] = [(gold[i], p) for i, p in zip(ids, preds, strict=True) if i in gold]
    return out


def picture(fig) -> str:
    """A matplotlib Figure as an inline <img>."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="" src="data:image/png;base64,{data}">'


def confusion_table(pairs: list[tuple]) -> str:
    """SST-5's confusion matrix as an HTML table, each cell shaded by its row's share."""
    counts = np.zeros((5, 5), dtype=int)  # (gold, predicted)
    for example, pred in pairs:
        counts[example.label, pred] += 1
    head = "".join(f"<th>{c}</th>" for c in range(5))
    rows = []
    for g in range(5):
        share = counts[g] / max(counts[g].sum(), 1)
        cells = "".join(
            f'<td style="background: rgba(31, 119, 180, {s:.2f})">{n}</td>'
            for n, s in zip(counts[g], share, strict=True)
        )
        rows.append(f"<tr><th>{g}</th>{cells}</tr>")
    return f"<table><tr><th>gold \\ predicted</th>{head}</tr>{''.join(rows)}</table>"


def worst(task: str, pairs: list[tuple]) -> str:
    """The WORST examples furthest from gold, as text."""
    far = sorted(pairs, key=lambda ep: -abs(ep[1] - ep[0].label))[:WORST]
    items = []
    for example, pred in far:
        text = example.sentence if task == "sst" else f"{example.sentence1} | {example.sentence2}"
        said = (
            f"gold {example.label:g}, predicted {pred:.2f}"
            if task == "sts"
            else (f"gold {example.label}, predicted {pred}")
        )
        items.append(f"<li>{said}: {html.escape(text)}</li>")
    return f"<ol>{''.join(items)}</ol>"


def report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report page of a finished run; returns its path."""
    rows = plots.scored_rows(run_dir)
    parts = [
        f"<h1>{html.escape(run_dir.resolve().name)}</h1>",
        "<h2>Dev scores after every stage</h2>",
        picture(plots.forgetting_figure(rows, run_dir.resolve().name)),
    ]
    tasks = [t for t in evaluation.MULTITASK if t in rows[0]]
    table = evaluation.format_table(rows, tasks, evaluation.kept_stage(rows))
    parts.append(f"<pre>{html.escape(table)}</pre>")
    predicted = dev_predictions(run_dir)
    if "sst" in predicted:
        parts += ["<h2>SST-5: the kept model's confusion</h2>", confusion_table(predicted["sst"])]
    if "sts" in predicted:
        gold = [e.label for e, _ in predicted["sts"]]
        pred = [p for _, p in predicted["sts"]]
        r, rho = evaluation.pearson_r(gold, pred), evaluation.spearman_rho(gold, pred)
        title = f"Pearson {r:.3f}, Spearman {rho:.3f}"
        parts += [
            "<h2>STS: predicted against gold</h2>",
            picture(plots.sts_scatter_figure(gold, pred, title)),
            f"<p>{title} over {len(gold)} dev pairs. The overall score uses Pearson, as CS224n "
            "does; MTEB and sentence-transformers report Spearman.</p>",
        ]
    for task in ("sst", "sts"):
        if task in predicted:
            parts += [
                f"<h2>{evaluation.TASKS[task].title}: furthest from gold</h2>",
                worst(task, predicted[task]),
            ]
    body = "\n".join(parts)
    page = f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(run_dir.name)}</title><style>{STYLE}</style></head><body>{body}</body></html>'
    out = out or run_dir / "report.html"
    atomic_write(page, out)
    return out


STYLE = "body{font-family:sans-serif;max-width:60em;margin:auto} img{max-width:100%} td,th{padding:.2em .6em;text-align:right}"


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    look = commands.add_parser("attention", help="draw a sentence's attention, before and after")
    look.add_argument("run_dir", type=Path, help=f"a finished run folder (has {BEST})")
    look.add_argument("text", help="the sentence to look at")
    look.add_argument("--pair", help="a second sentence, encoded with the first")
    look.add_argument("--layer", type=int, help="1 to the model's layers (default: the last)")
    look.add_argument("--out", type=Path, help="the PNG (default: RUN_DIR/attention-layerL.png)")
    page = commands.add_parser("report", help="write the run's report page")
    page.add_argument("run_dir", type=Path, help=f"a finished run folder (has {BEST})")
    page.add_argument("--out", type=Path, help="the HTML file (default: RUN_DIR/report.html)")
    args = parser.parse_args(argv)
    if not (args.run_dir / BEST).is_file():
        parser.error(f"{args.run_dir}: no {BEST} there; is it a finished run folder?")
    out = (
        draw_attention(args, look)
        if args.command == "attention"
        else report(args.run_dir, args.out)
    )
    print(out)
    return out


if __name__ == "__main__":
    config.run_cli(main)
