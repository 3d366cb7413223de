"""See inside a model: what its attention heads look at, the untouched model beside a
run's kept one.

    python explore.py RUN_DIR "a sentence" [--pair "a second sentence"] [--layer 6]

draws RUN_DIR/attention-layerL.png: for each head of that layer (default: the last), a
heatmap of the attention probabilities over the sentence's word pieces (or the pair's,
encoded together as [CLS] a [SEP] b [SEP]), one row for the model the run started from and
one for the model it kept. Row i of a heatmap says where token i looks; each row sums to 1.
"""

import argparse
from pathlib import Path

import torch

import config
import multitask_classifier as mt
from bert import BertModel
from checkpoint import BEST
from plots import attention_figure
from runtime import make_runtime
from tokenizer import BertTokenizer


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


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help=f"a finished run folder (has {BEST})")
    parser.add_argument("text", help="the sentence to look at")
    parser.add_argument("--pair", help="a second sentence, encoded with the first")
    parser.add_argument("--layer", type=int, help="1 to the model's layers (default: the last)")
    parser.add_argument("--out", type=Path, help="the PNG (default: RUN_DIR/attention-layerL.png)")
    args = parser.parse_args(argv)
    if not (args.run_dir / BEST).is_file():
        parser.error(f"{args.run_dir}: no {BEST} there; is it a finished run folder?")
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
    attention_figure(tokens, maps, layer - 1).savefig(out, dpi=110)
    print(out)
    return out


if __name__ == "__main__":
    config.run_cli(main)
