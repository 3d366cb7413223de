"""What a thesis run leaves on Google Drive, for docs/colab.md.

Runs colab.ipynb twice on the tiny BERT and tiny data, one loop of the thesis schedule
(4 stages), each in a kernel process of its own with tests/drive_audit logging every file
operation: once with the run folder on a stand-in Drive (the notebook's default there:
--no_stage_checkpoints, a checkpoint every CHECKPOINT_MINUTES = 30), once on the local disk
(a checkpoint after every stage). It prints what each wrote and replaced, splits a state
file into its parts, and scales those parts to bert-base-uncased's parameter count (the
model built on the meta device: no weights needed).

Run from the repository root (about half a minute):

    python docs/scripts/drive_bytes.py
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from base_bert import BertConfig, load_config  # noqa: E402
from bert import BertModel  # noqa: E402
from conftest import tiny_bert_config, write_tiny_checkpoint, write_tiny_data  # noqa: E402
from engine import checkpoint  # noqa: E402
from notebook_kernel import drive_charges, kernel  # noqa: E402
from sbert import SentenceBERT  # noqa: E402

THESIS_STAGES, CHECKPOINT_MINUTES = 31, 60
GB = 1e9


def tiny_runs(folder: Path) -> dict:
    """{'drive' | 'disk': (writes, bytes replaced)} of the tiny thesis schedule."""
    bert = write_tiny_checkpoint(folder / "tiny-bert", tiny_bert_config())
    write_tiny_data(folder / "data")
    found = {}
    for where, parameters in (("drive", ""), ("disk", "USE_DRIVE = False")):
        log = folder / f"{where}.log"
        if kernel(bert, folder, folder / where, parameters, log).wait():
            raise SystemExit(f"the notebook failed: {folder / where}.out")
        found[where] = drive_charges(log)
    return found


def parts(state: Path) -> dict:
    """Bytes of a state file by part: model, optimizer, rng, the rest (header, JSON)."""
    tensors, _ = checkpoint.read_tensors(state)
    sizes = {"model": 0, "optimizer": 0, "rng": 0}
    for name, t in tensors.items():
        sizes[name.split(".")[0]] += t.numel() * t.element_size()
    sizes["rest"] = state.stat().st_size - sum(sizes.values())
    return sizes


def model_bytes(config: BertConfig) -> tuple[int, int]:
    """(weights, AdamW's two moments) in bytes, float32, of the thesis model on `config`;
    the pooler gets no gradient (mean pooling), so AdamW keeps no moments for it."""
    with torch.device("meta"):
        named = dict(SentenceBERT(BertModel(config)).named_parameters())
    params = sum(p.numel() for p in named.values())
    pooler = sum(p.numel() for name, p in named.items() if name.startswith("bert.pooler_dense"))
    return 4 * params, 8 * (params - pooler)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = tiny_runs(folder)
        tiny = parts(folder / "drive" / "minbert" / "run" / checkpoint.STATE)
        tiny_config = load_config(folder / "tiny-bert")  # its vocabulary: the tiny data's words
    print("tiny thesis schedule (1 loop, 4 stages):")
    print(f"  {'run folder':10} {'state writes':>12} {'best writes':>11} {'bytes replaced':>14}")
    for where, (writes, replaced) in runs.items():
        counts = (len(writes[checkpoint.STATE]), len(writes[checkpoint.BEST]))
        print(f"  {where:10} {counts[0]:>12} {counts[1]:>11} {replaced:>14,}")
    print(f"  a state file: {tiny} bytes")
    sizes = {
        name: model_bytes(config)
        for name, config in (("tiny", tiny_config), ("base", BertConfig()))
    }
    assert sizes["tiny"][:2] == (tiny["model"], tiny["optimizer"]), "the state's parts changed"
    params, optimizer = sizes["base"][0] // 4, sizes["base"][1]
    state = 4 * params + optimizer + tiny["rng"] + tiny["rest"]
    best = 4 * params
    print(f"bert-base-uncased, thesis heads: {params:,} parameters")
    print(f"  state.safetensors {state / GB:.2f} GB, best.safetensors {best / GB:.2f} GB")
    every_stage = (THESIS_STAGES - 1) * state
    print(
        f"  a checkpoint after each of the {THESIS_STAGES} stages replaces "
        f"{every_stage / GB:.1f} GB of states, plus {best / GB:.2f} GB per new best model"
    )
    per_hour = 60 / CHECKPOINT_MINUTES * (state + best)
    print(
        f"  every {CHECKPOINT_MINUTES} minutes: at most {per_hour / GB:.2f} GB replaced per "
        "hour of training (a state and a best model per checkpoint)"
    )


if __name__ == "__main__":
    main()
