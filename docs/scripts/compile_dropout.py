"""What --compile gains or costs on this CPU, with dropout's masks and without.

MiniLM's encoder (embedding, six layers) at 32 x 64 tokens under bf16 autocast, a forward
and a backward per step in train mode, eager against compiled layers
(runtime.compile_layers: compiled dropout draws eager's masks), at the model's
dropout of 0.1 and at 0. It prints each one's median over 6 steps after 2 warm-ups.

Run from the repository root (about a minute on a 2-core CPU, compiling included):

    python docs/scripts/compile_dropout.py
"""

import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

from bert import BertModel  # noqa: E402
from engine.runtime import compile_layers, fast_dropout  # noqa: E402


def step_ms(model, ids, mask, repeats=6, warmup=2) -> float:
    """Median milliseconds of a bf16 forward and backward of the encoder."""
    times = []
    for _ in range(warmup + repeats):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.encode(model.embed(ids), mask)["last_hidden_state"]  # (B, T, H)
        out.float().pow(2).mean().backward()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[warmup:])


def main():
    torch.manual_seed(0)
    ids = torch.randint(1000, 20000, (32, 64))  # (B, T) word pieces of the vocabulary
    mask = torch.ones_like(ids)
    print("| dropout | eager (ms) | compiled (ms) | compiled / eager |")
    print("| --- | ---: | ---: | ---: |")
    for p in (0.1, 0.0):
        eager = BertModel.from_pretrained(
            "minilm", hidden_dropout_prob=p, attention_probs_dropout_prob=p
        )
        eager = fast_dropout(eager).train()  # the dropout a run's model draws
        compiled = compile_layers(copy.deepcopy(eager))
        step_ms(compiled, ids, mask, repeats=1)  # compiles
        a, b = step_ms(eager, ids, mask), step_ms(compiled, ids, mask)
        print(f"| {p:g} | {a:.0f} | {b:.0f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
