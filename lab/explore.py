"""See inside a model: what its attention heads look at, and a run's report page.

    python -m lab.explore attention RUN_DIR "a sentence" [--pair "a second sentence"] [--layer 6]
    python -m lab.explore report RUN_DIR
    printf 'a gripping film\nHow do I learn Python?\tWhat is the best way?\n' |
      python -m lab.explore label RUN_DIR

attention draws RUN_DIR/attention-layerL.png: for each head of that layer (default: the
last), a heatmap of the attention probabilities over the sentence's word pieces (or the
pair's, encoded together as [CLS] a [SEP] b [SEP]), the model the run started from above
the model it kept. Row i of a heatmap says where token i looks; each row sums to 1.

report writes RUN_DIR/report.html, one file with its pictures and script inline (no
network): the dev scores after every stage with the kept stage marked; from the run's
dev predictions, the kept model's SST-5 confusion matrix, its STS predictions against gold
(Pearson and Spearman) and the examples furthest from gold; from the models themselves,
QQP's outputs by gold label with the cut, a PCA map of the SST dev sentences' embeddings
(untouched beside kept: forgetting you can see), and an attention explorer over a few
dev examples of each task (pick the example, the layer and the head).

label reads lines from standard input and prints the kept model's labels for each: a
sentence gets its SST-5 class, 'sentence<TAB>sentence' a paraphrase probability and a 0-5
similarity.
"""

import argparse
import base64
import html
import io
import json
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

import evaluation
from batches import make_loader
from bert import BertModel
from commands import cli, command
from commands.outputs import format_table, prediction_path, read_predictions
from datasets import (
    DataError,
    PairDataset,
    PairExample,
    SentenceDataset,
    SentenceExample,
    data_dir,
    read_task,
    subset,
)
from engine import runtime
from engine.checkpoint import BEST, atomic_write
from engine.runtime import make_runtime
from lab import plots
from tokenizer import BertTokenizer

WORST = 8  # errors listed per task
EXPLORED = 8  # dev examples per task in the attention explorer
EXPLORED_TOKENS = 32  # the longest sequence it shows (attention grows with its square)
PAIRS = ("para", "sts")  # what a typed pair of sentences is labelled with


def attention_maps(bert: BertModel, tokenizer, text: str, pair: str | None = None):
    """(word pieces, probabilities (L, nh, n, n)) of one sentence or pair, on the CPU."""
    enc = tokenizer(text, pair, max_length=bert.config.max_position_embeddings)
    ids, types = enc["input_ids"], enc["token_type_ids"]  # (1, n) each
    with torch.no_grad():
        with bert.token_types(types):
            embeds = bert.embed(ids)  # (1, n, H)
        out = bert.encode(embeds, enc["attention_mask"], output_attentions=True)
    probs = torch.stack(out["attentions"])[:, 0]  # (L, 1, nh, n, n) -> (L, nh, n, n)
    return tokenizer.convert_ids_to_tokens(ids[0].tolist()), probs.float()


def load(run_dir: Path) -> tuple:
    """(the run's config, its tokenizer, {'untouched': the model it started from, 'kept':
    the one it kept}): SentenceBERTs in eval mode on the CPU, with the run's attention
    (the hand-written one there; it returns its probabilities). The untouched model's heads
    are fresh, and nothing here reads them."""
    cfg = command.load_run_config(str(run_dir))
    kept, _ = command.best_model(cfg, run_dir, make_runtime("cpu", "fp32"))
    models = {"untouched": command.run_model(cfg)().eval(), "kept": kept}
    return cfg, BertTokenizer.from_pretrained(cfg.model.bert), models


def draw_attention(args, parser) -> Path:
    _, tokenizer, models = load(args.run_dir)
    layers = models["kept"].bert.config.num_hidden_layers
    layer = args.layer or layers
    if not 1 <= layer <= layers:
        parser.error(f"--layer {layer}: this model has layers 1 to {layers}")
    maps = {}
    for name, model in models.items():
        tokens, maps[name] = attention_maps(model.bert, tokenizer, args.text, args.pair)
    out = args.out or args.run_dir / f"attention-layer{layer}.png"
    plots.attention_figure(tokens, maps, layer - 1).savefig(out, dpi=110)
    return out


# ---------------------------------------------------------------------------------------
# The report page


def dev_examples(cfg) -> dict[str, list]:
    """Each task's dev examples that the run scored (its --dev_size sample, drawn as the
    run drew it: a small run's page is small), read once for the whole page."""
    folder = data_dir(cfg.data.data_dir)
    dev = {task: read_task(folder, task, "dev") for task in evaluation.MULTITASK}
    return {task: subset(rows, cfg.data.dev_size, 1.0, cfg.seed) for task, rows in dev.items()}


def dev_predictions(run_dir: Path, dev: dict) -> dict[str, list[tuple]]:
    """{task: [(dev example, the kept model's prediction), ...]} of SST and STS, from the
    run's predictions/ (what the page's confusion, scatter and worst errors read)."""
    out = {}
    for task in ("sst", "sts"):
        path = prediction_path(run_dir / "predictions", task, "dev")
        if path.is_file():
            gold = {e.id: e for e in dev[task]}
            ids, preds = read_predictions(path)
            out[task] = [(gold[i], p) for i, p in zip(ids, preds, strict=True) if i in gold]
    return out


def outputs(model, task: str, dataset) -> dict[str, np.ndarray]:
    """{'ids', 'out': the task's raw output, 'z': the first sentences' pooled embeddings}
    of every example, one forward each, in eval mode, sorted by id."""
    columns = {"ids": [], "out": [], "z": []}
    with torch.no_grad():
        for batch in make_loader(dataset, 64, shuffle=False):
            z = model.sentences(batch)  # (N, H): N = B, or 2B for siamese pairs
            columns["ids"] += batch["ids"]
            columns["out"].append(model.readout(task, batch, z).float())  # model.predict's
            columns["z"].append(z[: len(batch["ids"])].float())  # (B, H)
    order = np.argsort(columns["ids"])  # batches come bucketed by length
    return {
        "ids": np.asarray(columns["ids"])[order],
        "out": torch.cat(columns["out"]).numpy()[order],
        "z": torch.cat(columns["z"]).numpy()[order],
    }


def model_views(cfg, tokenizer, models: dict, dev: dict, sample: int = 2000) -> dict:
    """What the report computes with the models (load's): the kept model's QQP outputs with
    their gold labels and cut, and both models' SST sentence embeddings in 2-D (PCA), on at
    most `sample` dev examples of each."""
    length, kept = cfg.data.max_length, models["kept"]
    cross = "para" in cfg.multitask.cross_encode
    para = PairDataset(dev["para"][:sample], tokenizer, length, cross_encode=cross)
    qqp = outputs(kept, "para", para)
    sst = SentenceDataset(dev["sst"][:sample], tokenizer, length)
    embedded = {name: outputs(m, "sst", sst) for name, m in models.items()}
    gold = {e.id: e.label for task in ("para", "sst") for e in dev[task]}
    cosine = "para" in kept.cosine  # a cut on a similarity, not a logit
    return {
        "qqp": (
            qqp["out"] if cosine else 1 / (1 + np.exp(-qqp["out"])),
            [gold[i] for i in qqp["ids"]],
            0.0 if cosine else 0.5,
        ),
        "sst": (
            {name: pca_2d(o["z"]) for name, o in embedded.items()},
            [gold[i] for i in embedded["kept"]["ids"]],
        ),
    }


def pca_2d(z: np.ndarray) -> np.ndarray:
    """(N, H) -> (N, 2): the centred embeddings on their two main directions."""
    centred = z - z.mean(axis=0)
    _, _, directions = np.linalg.svd(centred, full_matrices=False)  # (H, H), rows by variance
    return centred @ directions[:2].T


def explorer_data(tokenizer, models: dict, dev: dict) -> dict:
    """The attention explorer's examples: the first EXPLORED dev examples of each task that
    fit EXPLORED_TOKENS word pieces, their tokens, and both models' attention as bytes
    (probability x 255, base64), (L, nh, n, n) in row-major order."""
    examples = []
    for task in evaluation.MULTITASK:
        pairs = [
            (e.sentence, None) if task == "sst" else (e.sentence1, e.sentence2) for e in dev[task]
        ]
        fits = (
            t
            for t in pairs
            if len(tokenizer(*t, return_tensors=None)["input_ids"]) <= EXPLORED_TOKENS
        )
        for texts in islice(fits, EXPLORED):
            shown = {
                "task": evaluation.TASKS[task].title,
                "text": " | ".join(t for t in texts if t),
            }
            for name, model in models.items():
                tokens, probs = attention_maps(model.bert, tokenizer, *texts)
                levels = (probs * 255).round().to(torch.uint8).numpy().tobytes()
                shown[name] = base64.b64encode(levels).decode()
            examples.append(shown | {"tokens": tokens})
    bert = models["kept"].bert.config
    return {
        "layers": bert.num_hidden_layers,
        "heads": bert.num_attention_heads,
        "examples": examples,
    }


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
        shown = f"{pred:.2f}" if task == "sts" else pred  # a score, or a class
        items.append(f"<li>gold {example.label:g}, predicted {shown}: {html.escape(text)}</li>")
    return f"<ol>{''.join(items)}</ol>"


def section(name: str, title: str, *content: str) -> str:
    """One part of the page, id'd so that a link or a screenshot can find it."""
    return f'<section id="{name}"><h2>{title}</h2>{"".join(content)}</section>'


def stage_sections(run_dir: Path) -> list[str]:
    """The dev scores after every stage: the figure and the table, the kept stage marked."""
    rows = plots.scored_rows(run_dir)
    tasks = [t for t in evaluation.MULTITASK if t in rows[0]]
    table = format_table(rows, tasks, evaluation.kept_stage(rows))
    figure = picture(plots.forgetting_figure(rows, run_dir.resolve().name))
    return [
        section(
            "stages", "Dev scores after every stage", figure, f"<pre>{html.escape(table)}</pre>"
        )
    ]


def prediction_sections(predicted: dict) -> list[str]:
    """SST's confusion and STS's scatter, from the kept model's dev predictions."""
    parts = []
    if "sst" in predicted:
        title = "SST-5: the kept model's confusion"
        parts.append(section("confusion", title, confusion_table(predicted["sst"])))
    if "sts" in predicted:
        gold, pred = zip(*((e.label, p) for e, p in predicted["sts"]), strict=True)
        r, rho = evaluation.pearson_r(gold, pred), evaluation.spearman_rho(gold, pred)
        title = f"Pearson {r:.3f}, Spearman {rho:.3f}"
        note = (
            f"<p>{title} over {len(gold)} dev pairs. The overall score uses Pearson, as CS224n "
            "does; MTEB and sentence-transformers report Spearman.</p>"
        )
        figure = picture(plots.sts_scatter_figure(list(gold), list(pred), title))
        parts.append(section("sts", "STS: predicted against gold", figure, note))
    return parts


def model_sections(cfg, tokenizer, models: dict, dev: dict) -> list[str]:
    """What the models compute: QQP's outputs, the SST map, the attention explorer."""
    views = model_views(cfg, tokenizer, models, dev)
    scores, labels, cut = views["qqp"]
    maps, sst_labels = views["sst"]
    data = json.dumps(explorer_data(tokenizer, models, dev)).replace("</", "<\\/")  # no </script>
    return [
        section(
            "qqp",
            f"QQP: the kept model's output on {len(labels)} dev pairs, by gold label",
            picture(plots.by_label_figure(scores, labels, cut)),
        ),
        section(
            "embeddings",
            "SST dev sentences, untouched and kept (PCA)",
            picture(plots.embedding_maps_figure(maps, sst_labels)),
        ),
        section(
            "explorer",
            "Attention explorer: untouched (left) and kept (right)",
            EXPLORER,
            f'<script id="attention" type="application/json">{data}</script>',
            f"<script>{EXPLORER_JS}</script>",
        ),
    ]


def report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report page of a finished run; returns its path."""
    name = html.escape(run_dir.resolve().name)
    cfg, tokenizer, models = load(run_dir)
    dev = dev_examples(cfg)
    predicted = dev_predictions(run_dir, dev)
    parts = [f"<h1>{name}</h1>", *stage_sections(run_dir), *prediction_sections(predicted)]
    parts += model_sections(cfg, tokenizer, models, dev)
    for task in ("sst", "sts"):
        if task in predicted:
            title = f"{evaluation.TASKS[task].title}: furthest from gold"
            parts.append(section(f"worst-{task}", title, worst(task, predicted[task])))
    head = f'<meta charset="utf-8"><title>{name}</title><style>{STYLE}</style>'
    body = "\n".join(parts)
    out = out or run_dir / "report.html"
    atomic_write(f"<!doctype html><html><head>{head}</head><body>{body}</body></html>", out)
    return out


def inline(page: Path, height: int = 900) -> str:
    """The report page as a notebook's output shows it (IPython.display.HTML): in a frame of
    its own, so that its ids and script stay apart from the notebook's."""
    frame = f"width:100%;height:{height}px;border:0"
    return f'<iframe srcdoc="{html.escape(page.read_text())}" style="{frame}"></iframe>'


STYLE = "body{font-family:sans-serif;max-width:60em;margin:auto} img{max-width:100%} td,th{padding:.2em .6em;text-align:right}"


EXPLORER = """<p><label>example <select id="example"></select></label>
<label>layer <select id="layer"></select></label> <label>head <select id="head"></select></label></p>
<p id="text"></p><canvas id="untouched" width="420" height="420"></canvas>
<canvas id="kept" width="420" height="420"></canvas>"""

EXPLORER_JS = """
const data = JSON.parse(document.getElementById("attention").textContent);
const pick = (id) => document.getElementById(id);
function fill(id, labels) {
  labels.forEach((label, i) => pick(id).add(new Option(label, i)));
}
fill("example", data.examples.map((e, i) => `${i + 1}. ${e.task}: ${e.text.slice(0, 60)}`));
fill("layer", [...Array(data.layers).keys()].map((i) => i + 1));
fill("head", [...Array(data.heads).keys()].map((i) => i + 1));
pick("layer").value = data.layers - 1;
function draw() {
  const e = data.examples[pick("example").value], n = e.tokens.length;
  const layer = +pick("layer").value, head = +pick("head").value;
  pick("text").textContent = e.text;
  for (const name of ["untouched", "kept"]) {
    const bytes = Uint8Array.from(atob(e[name]), (c) => c.charCodeAt(0));
    const start = (layer * data.heads + head) * n * n;  // (L, nh, n, n), row-major
    const ctx = pick(name).getContext("2d"), margin = 90, cell = (420 - margin) / n;
    ctx.clearRect(0, 0, 420, 420);
    ctx.font = `${Math.min(11, cell)}px sans-serif`;
    for (let i = 0; i < n; i++) {
      ctx.fillStyle = "black";
      ctx.textAlign = "right";
      ctx.fillText(e.tokens[i], margin - 4, margin + (i + 0.8) * cell);
      ctx.save();
      ctx.translate(margin + (i + 0.8) * cell, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(e.tokens[i], 0, 0);
      ctx.restore();
      for (let j = 0; j < n; j++) {  // row i: where token i looks
        ctx.fillStyle = `rgba(31, 119, 180, ${bytes[start + i * n + j] / 255})`;
        ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
      }
    }
  }
}
for (const id of ["example", "layer", "head"]) pick(id).addEventListener("change", draw);
draw();
"""


def input_lines(stream) -> Iterator[str]:
    """The lines of a text stream (stdin); bytes that are not UTF-8 stop with a
    one-line error (a stream decodes in blocks, so it counts the lines read before)."""
    if stream.isatty():  # typed by hand: say what is expected, or the prompt looks stuck
        print("type a sentence, or two separated by a tab; Ctrl-D ends", file=sys.stderr)
    read = 0
    try:
        for line in stream:
            read += 1
            yield line
    except UnicodeDecodeError as e:
        raise DataError(
            f"input after {read} good line(s): not UTF-8 text ({e.reason}); convert it"
        ) from None


def split_input_line(line: str, number: int) -> tuple[str, str]:
    """(a, b) of a line to label: a sentence (b is ""), or two separated by one tab; anything
    else (a header row, an empty side) stops with the line's number."""
    parts = line.split("\t")
    expected = "expected a sentence, or two separated by one tab"
    if len(parts) > 2:
        raise DataError(f"input line {number}: {len(parts)} tab-separated fields; {expected}")
    if len(parts) == 2 and not all(p.strip() for p in parts):
        raise DataError(f"input line {number}: an empty side of the tab; {expected}")
    return parts[0], parts[1] if len(parts) == 2 else ""


def label(cfg, model, rt, lines) -> None:
    """Print the kept model's labels for each line as it comes: a sentence gets its SST-5
    class, two separated by a tab a paraphrase probability and a similarity (blank lines
    are skipped). Each pair task is read as it was trained: siamese or cross-encoded."""
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    for n, line in enumerate(x.strip("\r\n ") for x in lines):
        a, b = split_input_line(line, n + 1)
        if b:
            pair, batches = [PairExample(str(n), a, b, None)], {}
            for cross in {t in cfg.multitask.cross_encode for t in PAIRS}:
                dataset = PairDataset(pair, tokenizer, cfg.data.max_length, cross_encode=cross)
                batches[cross] = runtime.to_device(dataset.collate([0]), rt.device)
            with torch.no_grad():
                p, score = (model(t, batches[t in cfg.multitask.cross_encode]) for t in PAIRS)
            if "para" in model.cosine:  # a cosine read-out has a cut, not a probability
                how = "cos" if model.siamese == "cosine" else "-d"
                para = f"paraphrase {'yes' if p.item() > 0 else 'no'} ({how} - cut {p.item():+.3f})"
            else:
                para = f"paraphrase {torch.sigmoid(p).item():.3f}"
            print(f"{para}\tsimilarity {score.item():.2f}\t{line}", flush=True)
        elif a:
            example = SentenceExample(str(n), a, None)
            batch = SentenceDataset([example], tokenizer, cfg.data.max_length).collate([0])
            with torch.no_grad():
                probs = model("sst", runtime.to_device(batch, rt.device)).softmax(-1)[0]
            sentiment = f"sentiment {probs.argmax().item()} (p {probs.max().item():.2f})"
            print(f"{sentiment}\t{line}", flush=True)


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        prog=cli.prog(),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    tag = commands.add_parser("label", help="label the lines of standard input")
    tag.add_argument("run_dir", type=Path, help=f"a finished run folder (has {BEST})")
    args = parser.parse_args(argv)
    cfg = command.load_run_config(args.run_dir)
    command.one_model(cfg, str(args.run_dir))
    command.sentence_bert(cfg, str(args.run_dir))
    if not (args.run_dir / BEST).is_file():
        parser.error(f"{args.run_dir}: no {BEST} there; is it a finished run folder?")
    if args.command == "label":
        rt = make_runtime("cpu", "fp32")
        model, _ = command.best_model(cfg, args.run_dir, rt)
        return label(cfg, model, rt, input_lines(sys.stdin))
    out = (
        draw_attention(args, look)
        if args.command == "attention"
        else report(args.run_dir, args.out)
    )
    print(out)
    return out


if __name__ == "__main__":
    cli.run_cli(main)
