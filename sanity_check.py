"""One offline command that says whether the hand-written pieces are right.

    python sanity_check.py        (make check runs it after the lesson's tests)

Compares, line by line with the largest difference:
- our tokenizer against ids that Hugging Face's BertTokenizer produced for fixed sentences;
- our BERT (hand-written attention, and the SDPA path) against Hugging Face BertModel
  outputs for the embedded all-MiniLM-L6-v2 checkpoint;
- our AdamW against torch.optim.AdamW on the CS224n recipe, and against the handout's
  stored reference (optimizer_test.npy) when that file is found;
- with --handout, our BERT on bert-base-uncased (downloaded once) against the handout's own
  sanity_check.data, as the handout's sanity_check.py compares them.
`python -m lab.fetch` puts the handout's two files beside the data. Our stored outputs come from
tests/make_sanity_reference.py. Exit status 1 on any failure.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from base_bert import load_config, resolve_model_dir
from bert import BertModel
from optimizer import AdamW
from optimizer_test import fit, handout_folders
from tokenizer import BertTokenizer

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "tests" / "reference" / "sanity_reference.npz"
HANDOUT_REFERENCE = "optimizer_test.npy"
HANDOUT_BERT = "sanity_check.data"  # bert-base-uncased's outputs on the ids below, torch.save'd
HANDOUT_IDS = [[101, 7592, 2088, 102, 0, 0, 0, 0], [101, 7592, 15756, 2897, 2005, 17953, 2361, 102]]
HANDOUT_ATOL, HANDOUT_RTOL = 1e-5, 1e-3  # the handout's sanity_check.py
BERT_ATOL = 1e-5
ADAM_ATOL, ADAM_RTOL = 1e-6, 1e-4  # the CS224n handout's tolerances
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Un café crème, s'il vous plaît!",
    "unbelievably, tokenization of 東京 works 🙂",
    "",
]
PAIRS = [
    ("How do I learn Python?", "What is the best way to learn Python?"),
    ("A man plays a guitar.", "A woman slices an onion."),
]


def find_handout_reference(arg, name: str = HANDOUT_REFERENCE):
    """--reference (the file or its folder; one that is not there stops), else the first of
    optimizer_test.handout_folders that holds the file `name`, else None."""
    if arg:
        path = Path(arg) / name if Path(arg).is_dir() else Path(arg)
        if not path.is_file() or path.name != name:
            raise SystemExit(f"--reference {arg}: no {name} there")
        return path
    return next((f / name for f in handout_folders() if (f / name).is_file()), None)


def handout_bert_diffs(bert: BertModel, path: Path) -> dict[str, float]:
    """The largest |ours - handout| of last_hidden_state (padding zeroed) and pooler_output
    on the handout's two sentences, scaled as allclose does: <= 1 passes."""
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)  # tensors only
    except Exception as e:  # a pickle that is more than tensors, or not a torch file
        raise SystemExit(f"{path}: not the handout's sanity_check.data ({e})") from None
    ids = torch.tensor(HANDOUT_IDS)  # (2, 8)
    mask = (ids != 0).long()
    with torch.no_grad():
        out = bert.eval()(ids, mask)
    diffs = {}
    for key in ("last_hidden_state", "pooler_output"):
        ours, theirs = out[key], stored[key].float()
        if key == "last_hidden_state":
            ours, theirs = ours * mask[..., None], theirs * mask[..., None]  # (2, 8, H)
        diffs[key] = (
            ((ours - theirs).abs() / (HANDOUT_ATOL + HANDOUT_RTOL * theirs.abs())).max().item()
        )
    return diffs


def read_handout_reference(path: Path) -> np.ndarray:
    """The handout's weights after its recipe: a 2 x 3 float array, nothing else."""
    try:
        w_ref = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: not a .npy array ({e})") from None
    if w_ref.shape != (2, 3) or w_ref.dtype.kind != "f":
        raise SystemExit(
            f"{path}: {w_ref.dtype} {w_ref.shape}; expected the handout's 2 x 3 floats"
        )
    return w_ref


def tokenizer_checks(args, ref):
    """Our tokenizer's ids against the stored ones."""
    tok = BertTokenizer.from_pretrained(args.bert)
    a, b = zip(*PAIRS, strict=True)
    for name, enc in (("single", tok(SENTENCES)), ("pair", tok(list(a), list(b)))):
        diffs = [np.abs(enc[k].numpy() - ref[f"{name}_{k}"]).max() for k in enc]
        yield f"tokenizer ids, {name} sentences", max(diffs) == 0, max(diffs), "exact"


def bert_checks(args, ref):
    """Our BERT, both attention paths, on the stored ids (not our tokenizer's: a wrong
    tokenizer fails its own check only) against the stored outputs."""
    pair = {k: torch.from_numpy(ref[f"pair_{k}"]) for k in ("input_ids", "attention_mask")}
    types, keep = torch.from_numpy(ref["pair_token_type_ids"]), ref["pair_attention_mask"] == 1
    for attention in ("manual", "sdpa"):
        model = BertModel.from_pretrained(args.bert, attention=attention).eval()
        with torch.no_grad():
            out = model(pair["input_ids"], pair["attention_mask"], types)
        d_hidden = np.abs(out["last_hidden_state"].numpy() - ref["last_hidden_state"])[keep].max()
        d_pool = np.abs(out["pooler_output"].numpy() - ref["pooler_output"]).max()
        yield f"BERT last_hidden_state ({attention})", d_hidden <= BERT_ATOL, d_hidden, BERT_ATOL
        yield f"BERT pooler_output ({attention})", d_pool <= BERT_ATOL, d_pool, BERT_ATOL


def checks(args):
    """Yield (name, ok, max_diff, detail, exercises) for each check. A group of checks
    that hits an open exercise of a handout (exercises.py) fails alone, naming it."""
    ref = np.load(REFERENCE)
    BertTokenizer.from_pretrained(args.bert)  # first: a folder without vocab.txt stops
    hidden, stored = load_config(resolve_model_dir(args.bert)).hidden_size, ref["pooler_output"]
    if hidden != stored.shape[-1]:
        raise SystemExit(
            f"--bert {args.bert}: hidden size {hidden}; the stored outputs are "
            f"all-MiniLM-L6-v2's ({stored.shape[-1]}), the only checkpoint this check runs on"
        )
    groups = [
        ("tokenizer", tokenizer_checks(args, ref), ("wordpiece",)),
        ("BERT", bert_checks(args, ref), ("embeddings", "attention", "layer")),
        ("AdamW", adamw_checks(args), ("adamw",)),
        ("bert-base", handout_bert_check(args), ("embeddings", "attention", "layer")),
    ]
    for group, rows, exercises in groups:
        try:
            for row in rows:
                yield *row, exercises
        except NotImplementedError as e:  # a handout's open exercise: its message names it
            yield group, False, None, str(e), exercises


def adamw_checks(args):
    """AdamW against torch's, and against the handout's optimizer_test.npy when found."""

    w = fit(AdamW, eps=1e-6).numpy()  # the handout's recipe (optimizer_test.py)
    w_torch = fit(torch.optim.AdamW, eps=1e-6).numpy()
    d = np.abs(w - w_torch).max()
    ok = np.allclose(w, w_torch, atol=ADAM_ATOL, rtol=ADAM_RTOL)
    yield "AdamW vs torch.optim.AdamW (1000 steps)", ok, d, f"atol {ADAM_ATOL}, rtol {ADAM_RTOL}"
    path = find_handout_reference(args.reference)
    if path is None:
        yield "AdamW vs handout optimizer_test.npy", None, None, "file not found, skipped"
    else:
        w_ref = read_handout_reference(path)
        ok = np.allclose(w, w_ref, atol=ADAM_ATOL, rtol=ADAM_RTOL)
        yield "AdamW vs handout optimizer_test.npy", ok, np.abs(w - w_ref).max(), str(path)


def handout_bert_check(args):
    """With --handout and the handout's sanity_check.data found: bert-base-uncased vs it."""
    path = find_handout_reference(None, HANDOUT_BERT)
    if not args.handout or path is None:
        why = "needs --handout" if path else f"no {HANDOUT_BERT} (python -m lab.fetch)"
        yield f"BERT vs handout {HANDOUT_BERT}", None, None, f"{why}, skipped"
        return
    bert = BertModel.from_pretrained("bert-base-uncased")
    for key, d in handout_bert_diffs(bert, path).items():
        yield f"bert-base {key} vs handout", d <= 1, d, f"atol {HANDOUT_ATOL}, rtol {HANDOUT_RTOL}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bert", default="minilm", help="checkpoint the reference was made with")
    parser.add_argument(
        "--reference",
        default=None,
        help="the handout's optimizer_test.npy, or its folder "
        "(default: $MINBERT_REFERENCE, the data folder, then ../shared/reference)",
    )
    parser.add_argument(
        "--handout",
        action="store_true",
        help=f"also check bert-base-uncased (downloaded once) against the handout's {HANDOUT_BERT}",
    )
    args = parser.parse_args(argv)
    start, failed, named = time.time(), 0, set()
    for name, ok, diff, detail, exercises in checks(args):
        verdict = "SKIP" if ok is None else ("OK" if ok else "NOT OK")
        failed += ok is not None and not ok  # ok may be a numpy bool
        diff_text = "" if diff is None else f"max diff {float(diff):.2e}"
        print(f"{verdict:7s} {name:45s} {diff_text:18s} ({detail})")
        if ok is not None and not ok and exercises not in named:  # once per group
            named.add(exercises)
            print(f"{'':7s} graded piece by piece: python exercises.py check {' '.join(exercises)}")
    took = time.time() - start
    print(f"\n{'ALL CHECKS PASSED' if not failed else f'{failed} CHECK(S) FAILED'} in {took:.1f}s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":  # one line for a slip in the paths (commands/cli.py)
    from commands.cli import run_cli

    run_cli(main)
