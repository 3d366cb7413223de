"""What the bench counts besides time (lab/bench.py's): a training step's FLOPs, which turn
its time into a rate, and the share of a batching's tokens that are real, not padding."""

from collections.abc import Iterable, Sequence

import torch

from base_bert import BertConfig


def padding_efficiency(batches: Iterable[Sequence[int]]) -> float:
    """Real / padded tokens when each batch is padded to its longest sequence.

    batches: the sequence lengths of each batch; [[2, 4]] -> 6 / 8 = 0.75.
    """
    real = padded = 0
    for lengths in batches:
        real, padded = real + sum(lengths), padded + len(lengths) * max(lengths, default=0)
    if padded == 0:
        raise ValueError("padding_efficiency: no tokens in the batches")
    return real / padded


def random_batches(n: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffled indices 0..n-1 cut into batches: a plain DataLoader(shuffle=True)."""
    order = torch.randperm(n, generator=generator).tolist()
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def train_step_flops(config: BertConfig, B: int, T: int) -> float:
    """FLOPs of a training step: 6 x non-embedding parameters x tokens (forward 2, backward
    4 per weight and token) plus attention's two (T x T) products, 12 x layers x B x T^2 x H."""
    L, H, inter = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    per_layer = 4 * H * H + 2 * H * inter  # q, k, v, output; the FFN's two (biases aside)
    return 6 * L * per_layer * B * T + 12 * L * B * T * T * H
