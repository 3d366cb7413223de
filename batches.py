"""Batches: a tokenized data set (datasets.py) cut into batches of similar lengths, so
little compute goes to padding (`LengthBucketSampler`, `make_loader`); a stage's share of a
training set (`fraction_loader`, `subset_loader`); several tasks' loaders as one stream of
steps (`MultiTaskBatches`: all tasks at once, or round robin)."""

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Sampler, Subset

from datasets import PairDataset, SentenceDataset


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of similar lengths, so little compute goes to padding.

    shuffle=True: each epoch, shuffle all indices, cut them into chunks of
    `batches_per_bucket` batches, sort each chunk by length and cut it into batches, then
    shuffle the batch order. Batches stay random at the scale of the data set while padding
    is that of a sorted order. shuffle=False: one length-sorted pass, longest first (an
    out-of-memory error shows at once). Every index appears exactly once per epoch; the
    order depends only on `generator` (the global torch RNG when None).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
        batches_per_bucket: int = 50,
    ):
        if batch_size < 1 or batches_per_bucket < 1:
            raise ValueError(
                f"batch_size ({batch_size}) and batches_per_bucket ({batches_per_bucket}) "
                "must be at least 1"
            )
        self.lengths, self.batch_size, self.shuffle = list(lengths), batch_size, shuffle
        self.generator, self.batches_per_bucket = generator, batches_per_bucket

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def _sorted_batches(self, indices: list[int]) -> list[list[int]]:
        indices = sorted(indices, key=lambda i: -self.lengths[i])  # stable: ties keep order
        return [indices[j : j + self.batch_size] for j in range(0, len(indices), self.batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self.lengths)
        if not self.shuffle:
            yield from self._sorted_batches(list(range(n)))
            return
        generator = self.generator
        if generator is None:  # as torch's RandomSampler: draw a seed from the global RNG
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        order = torch.randperm(n, generator=generator).tolist()
        # A chunk is a whole number of batches, so only the epoch's last batch can be short.
        chunk = self.batch_size * self.batches_per_bucket
        batches = []
        for start in range(0, n, chunk):
            batches += self._sorted_batches(order[start : start + chunk])
        for b in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[b]


def make_loader(
    dataset: SentenceDataset | PairDataset,
    batch_size: int,
    shuffle: bool,
    generator: torch.Generator | None = None,
    num_workers: int = 0,
) -> DataLoader:
    """A DataLoader over a tokenized dataset with length-bucketed batches. An unshuffled
    (scoring) loader gets a generator of its own for the worker seed that every DataLoader
    pass draws, so scoring leaves the global generators, hence training, untouched."""
    sampler = LengthBucketSampler(dataset.lengths, batch_size, shuffle, generator)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=dataset.collate,
        num_workers=num_workers,
        generator=None if shuffle else torch.Generator(),
    )


def standardized_indices(n: int, size: int, generator: torch.Generator) -> list[int]:
    """`size` indices into a data set of n: a random sample when size <= n, else whole
    shuffled passes repeated and topped up (Broadhurst & Maffezzoli standardize each task
    to the same number of examples this way)."""
    if n < 1 or size < 1:
        raise ValueError(f"need a non-empty data set and size >= 1, got n={n}, size={size}")
    passes = [torch.randperm(n, generator=generator) for _ in range(math.ceil(size / n))]
    return torch.cat(passes)[:size].tolist()


MIXINGS = ("simultaneous", "round_robin")  # MultiTaskBatches' modes
ORDERS = ("fixed", "random")  # round-robin task order in each cycle


class MultiTaskBatches:
    """Batches of several tasks per epoch, without `zip` (which stops at the shortest).

    mode='simultaneous': each step is one batch of every task, [(task, batch), ...].
    mode='round_robin': each step is one batch of one task, [(task, batch)], the tasks taking
    turns. order='fixed' keeps the loaders' order; 'random' draws it afresh each cycle (in
    a simultaneous step: the order of its batches).
    Either way an epoch ends when the task with the most batches has been through all of
    them exactly once; the others start over (new shuffle) whenever they run out.
    """

    def __init__(
        self,
        loaders: dict,
        mode: str = "simultaneous",
        order: str = "fixed",
        generator: torch.Generator | None = None,
    ):
        if mode not in MIXINGS or order not in ORDERS:
            raise ValueError(
                f"mode must be 'simultaneous' or 'round_robin' and order 'fixed' or 'random', "
                f"got {mode!r}, {order!r}"
            )
        self.loaders, self.mode, self.order, self.generator = loaders, mode, order, generator
        self.cycles = max(len(loader) for loader in loaders.values())

    def __len__(self) -> int:
        return self.cycles * (1 if self.mode == "simultaneous" else len(self.loaders))

    def _next(self, iters: dict, task: str):
        try:
            return next(iters[task])
        except StopIteration:  # a smaller task: start it over
            iters[task] = iter(self.loaders[task])
            return next(iters[task])

    def __iter__(self) -> Iterator[list]:
        tasks = list(self.loaders)
        iters = {t: iter(self.loaders[t]) for t in tasks}
        for _ in range(self.cycles):
            if self.order == "random":
                tasks = [tasks[i] for i in torch.randperm(len(tasks), generator=self.generator)]
            steps = [tasks] if self.mode == "simultaneous" else [[t] for t in tasks]
            for step in steps:
                yield [(t, self._next(iters, t)) for t in step]


def subset_loader(dataset, keep: list[int], batch_size: int, generator) -> DataLoader:
    """Shuffled, length-bucketed batches over dataset[keep] (keep may repeat indices)."""
    lengths = [dataset.lengths[i] for i in keep]
    sampler = LengthBucketSampler(lengths, batch_size, shuffle=True, generator=generator)
    return DataLoader(Subset(dataset, keep), batch_sampler=sampler, collate_fn=dataset.collate)


def fraction_loader(dataset, fraction: float, batch_size: int, generator) -> DataLoader:
    """Batches over a fresh random `fraction` of the data."""
    n = len(dataset)
    keep = torch.randperm(n, generator=generator)[: max(1, round(fraction * n))].tolist()
    return subset_loader(dataset, keep, batch_size, generator)
