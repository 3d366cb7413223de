"""Data: the CS224n default final project files, read once, tokenized once, batched by length.

Reference: the CS224n "minBERT" default final project handout (Stanford, 2023-2024), whose
`datasets.py` reads each tab-separated file with `csv.DictReader`; we parse the same way so
that every sentence is the handout's, minus the lowercasing, which our uncased tokenizer does.
SNLI (Bowman et al., 2015) is read for supervised SimCSE (Gao et al., 2021).

Bad rows (wrong column count, empty or out-of-range label, empty text) are never misread:
the engine's tolerant reader (engine/tsv.py) skips them with one warning per file
naming their lines, or with strict=True stops at the first with a DataError; a test row
is never skipped, since every leaderboard id needs a prediction.

`load_task_data` reads and tokenizes every split a run needs, once; `fraction_loader` and
`subset_loader` batch a stage's share of a training set. lab/fetch.py (`make data`) fetches
the files that are missing (FILE_STEMS names them), then checks every one.
"""

import copy
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from engine.tsv import DataError, label_parser, read_table
from evaluation import TASKS

SPLITS = ("train", "dev", "test")  # 'test': the unlabeled *-test-student.csv files
FILE_STEMS = {task: spec.files for task, spec in TASKS.items()} | {"snli": "snli"}
# The splits each task has: SNLI has no test file.
_TASK_SPLITS = {task: SPLITS[:2] if task == "snli" else SPLITS for task in FILE_STEMS}
TOKENIZE_CHUNK = 4096  # texts per tokenizer call: a progress bar moves between calls


# ---------------------------------------------------------------------------------------
# Files


def data_dir(arg: str | None = None) -> Path:
    """The data folder: the --data_dir argument, else $MINBERT_DATA, else data/."""
    return Path(arg or os.environ.get("MINBERT_DATA") or "data")


def task_file(folder: str | Path, task: str, split: str) -> Path:
    """Path of one task's split, e.g. ('sst', 'test') -> ids-sst-test-student.csv."""
    if task not in FILE_STEMS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(FILE_STEMS)}")
    allowed = _TASK_SPLITS[task]
    if split not in allowed:
        raise ValueError(f"unknown split {split!r} for {task!r}; expected one of {allowed}")
    suffix = "test-student" if split == "test" else split
    return Path(folder) / f"{FILE_STEMS[task]}-{suffix}.csv"


def expected_files() -> list[str]:
    """Names of every file the project reads."""
    return [task_file(".", task, split).name for task in FILE_STEMS for split in _TASK_SPLITS[task]]


# ---------------------------------------------------------------------------------------
# Readers


@dataclass(frozen=True)
class SentenceExample:
    id: str
    sentence: str
    label: int | None  # class index; None in test-student files


@dataclass(frozen=True)
class PairExample:
    id: str
    sentence1: str
    sentence2: str
    label: float | None  # 0/1 (para, an int) or a 0-5 score (sts); None in test-student files


@dataclass(frozen=True)
class NLIExample:
    premise: str
    hypothesis: str
    label: int | None  # 0 entailment, 1 neutral, 2 contradiction


def space_punctuation(s: str) -> str:
    """The handout's preprocess_string for pair sentences, without its lowercasing: BERT's
    basic tokenizer splits on punctuation anyway, so this changes no token ids; it keeps our
    text identical to the handout's."""
    for p in ".?,'":
        s = s.replace(p, " " + p)
    return " ".join(s.split())


def read_sentiment(
    path: str | Path, num_labels: int, strict: bool = False
) -> list[SentenceExample]:
    """SST (num_labels=5) or CFIMDB (num_labels=2): `<index> id sentence sentiment`."""
    parse = label_parser(0, num_labels - 1, integer=True)
    rows = read_table(path, ("id", "sentence"), "sentiment", parse, strict)
    return [SentenceExample(id_, sentence, label) for (id_, sentence), label in rows]


def read_pairs(path: str | Path, kind: str, strict: bool = False) -> list[PairExample]:
    """Quora (kind='binary', is_duplicate 0/1) or STS (kind='score', similarity 0-5)."""
    if kind == "binary":
        label_column, parse = "is_duplicate", label_parser(0, 1, integer=True)
    elif kind == "score":
        label_column, parse = "similarity", label_parser(0.0, 5.0)
    else:
        raise ValueError(f"unknown pair kind {kind!r}; expected 'binary' or 'score'")
    rows = read_table(path, ("id", "sentence1", "sentence2"), label_column, parse, strict)
    return [
        PairExample(id_, space_punctuation(s1), space_punctuation(s2), label)
        for (id_, s1, s2), label in rows
    ]


def read_snli(path: str | Path, strict: bool = False) -> list[NLIExample]:
    """SNLI pairs: `premise hypothesis label` with 0 entailment, 1 neutral, 2 contradiction."""
    rows = read_table(
        path, ("premise", "hypothesis"), "label", label_parser(0, 2, integer=True), strict
    )
    return [NLIExample(premise, hypothesis, label) for (premise, hypothesis), label in rows]


def read_task(folder: str | Path, task: str, split: str, strict: bool = False) -> list:
    """Examples of one task's split, with the reader and label range that task needs."""
    path = task_file(folder, task, split)
    if task in ("sst", "cfimdb"):
        return read_sentiment(path, 5 if task == "sst" else 2, strict)
    if task in ("para", "sts"):
        return read_pairs(path, "binary" if task == "para" else "score", strict)
    return read_snli(path, strict)


# ---------------------------------------------------------------------------------------
# Tokenized datasets and batching


def _labels(examples: Sequence, dtype: torch.dtype) -> torch.Tensor | None:
    """All labels as one tensor, or None when the examples are unlabeled."""
    labels = [e.label for e in examples]
    if all(label is None for label in labels):
        return None
    if any(label is None for label in labels):
        raise ValueError("some examples have labels and some do not; expected one or the other")
    return torch.tensor(labels, dtype=dtype)


def pad(seqs: Sequence[Sequence[int]], value: int, length: int) -> torch.Tensor:
    """Right-pad ragged id lists to `length`: (B, length) long."""
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def _encode(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int) -> tuple:
    """Ragged (token ids, token types), no padding, truncated to max_length; in chunks, with
    a progress bar once it takes over 2 seconds (the handout's 141,506 Quora pairs)."""
    ids, types = [], []
    with tqdm(total=len(texts), desc="tokenizing", unit=" texts", leave=False, delay=2) as bar:
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = slice(start, start + TOKENIZE_CHUNK)
            enc = tokenizer(
                texts[chunk],
                text_pair=pairs[chunk] if pairs else None,
                padding=False,
                truncation=True,
                max_length=max_length,
                return_tensors=None,
            )
            ids += enc["input_ids"]
            types += enc["token_type_ids"]
            bar.update(len(texts[chunk]))
    return ids, types


class _Tokenized(Dataset):
    """Token ids made once at construction, padded per batch by `collate`.

    An item is just its index: collate reads the stored ragged lists, so nothing is copied
    per example. `columns` are K lists of texts. joint: one sequence per example (two
    columns as a pair), input_ids a list and batches (B, T); else each column tokenized
    alone, input_ids a K-tuple and batches (K, B, T) padded to one T.
    """

    def __init__(self, tokenizer, max_length: int, columns: list, labels, ids, joint: bool):
        if joint:
            pairs = columns[1] if len(columns) == 2 else None
            self.input_ids, self.token_type_ids = _encode(tokenizer, columns[0], pairs, max_length)
            self.lengths = [len(x) for x in self.input_ids]
        else:
            self.input_ids = tuple(_encode(tokenizer, c, None, max_length)[0] for c in columns)
            # The padded T is set by the longest sentence of each example.
            self.lengths = [max(len(col[i]) for col in self.input_ids) for i in range(len(ids))]
        self.joint, self.labels, self.ids = joint, labels, ids
        self.pad_id = tokenizer.pad_token_id

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> int:
        return i

    def collate(self, indices: list[int]) -> dict:
        """A batch padded to its longest sequence; labels (B,) when labeled, ids list[str]."""
        columns = [self.input_ids] if self.joint else self.input_ids
        seqs = [[col[i] for i in indices] for col in columns]  # K lists of B id lists
        T = max(len(s) for side in seqs for s in side)
        ids = torch.stack([pad(side, self.pad_id, T) for side in seqs])  # (K, B, T)
        lengths = torch.tensor([[len(s) for s in side] for side in seqs])  # (K, B)
        mask = (torch.arange(T) < lengths[..., None]).long()  # (K, B, T): 1 on real tokens
        if self.joint:  # one sequence per example (K = 1), with its own token types
            ids, mask = ids[0], mask[0]  # (B, T)
            types = pad([self.token_type_ids[i] for i in indices], 0, T)  # (B, T)
        else:
            types = torch.zeros_like(ids)  # (K, B, T): a sentence tokenized alone is segment A
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        if self.labels is not None:
            batch["labels"] = self.labels[indices]  # (B,)
        batch["ids"] = [self.ids[i] for i in indices]
        return batch


def head(dataset: _Tokenized, n: int) -> _Tokenized:
    """The first n examples of a tokenized dataset, sharing its token lists (an item is
    its index: the shorter ids and lengths are the whole change)."""
    if n >= len(dataset):
        return dataset
    out = copy.copy(dataset)
    out.ids, out.lengths = dataset.ids[:n], dataset.lengths[:n]
    return out


class SentenceDataset(_Tokenized):
    """One sentence per example (sst, cfimdb); labels are long class indices.

    Batch: input_ids, attention_mask, token_type_ids (B, T) long; labels (B,) long when
    labeled; ids list[str].
    """

    def __init__(self, examples: Sequence[SentenceExample], tokenizer, max_length: int = 128):
        columns = [[e.sentence for e in examples]]
        labels, ids = _labels(examples, torch.long), [e.id for e in examples]
        super().__init__(tokenizer, max_length, columns, labels, ids, joint=True)


class PairDataset(_Tokenized):
    """Sentence pairs (para, sts); labels are float (0/1 or a 0-5 score).

    cross_encode=False (siamese, SBERT): each side tokenized alone; input_ids,
    attention_mask and token_type_ids are (2, B, T) with [0] the first sentences and [1]
    the second, padded to one T so a model runs both in one forward via .view(2 * B, T).
    cross_encode=True: one `[CLS] a [SEP] b [SEP]` sequence per pair, token types 0 then
    1, truncated longest-first; tensors are (B, T).
    """

    def __init__(
        self,
        examples: Sequence[PairExample],
        tokenizer,
        max_length: int = 128,
        cross_encode: bool = False,
    ):
        columns = [[e.sentence1 for e in examples], [e.sentence2 for e in examples]]
        labels, ids = _labels(examples, torch.float), [e.id for e in examples]
        super().__init__(tokenizer, max_length, columns, labels, ids, joint=cross_encode)


class TupleDataset(_Tokenized):
    """K unlabeled sentences per example, e.g. SimCSE's (anchor, positive, negative).

    Each column is tokenized once; batches are (K, B, T) like siamese pairs, so a model
    encodes all K * B sentences in one forward via .view(K * B, T).
    """

    def __init__(self, tuples: Sequence[Sequence[str]], tokenizer, max_length: int = 128):
        K = len(tuples[0]) if tuples else 1
        if any(len(t) != K for t in tuples):
            raise ValueError(f"every example needs {K} sentences, like the first one")
        columns = [[t[k] for t in tuples] for k in range(K)]
        ids = [str(i) for i in range(len(tuples))]
        super().__init__(tokenizer, max_length, columns, None, ids, joint=False)


# ---------------------------------------------------------------------------------------
# A run's data: every split read and tokenized once, batches over a stage's share


@dataclass
class TaskData:
    train: SentenceDataset | PairDataset | TupleDataset | None
    dev: SentenceDataset | PairDataset | None
    test: SentenceDataset | PairDataset | None


def random_subset(examples: list, n: int, seed: int) -> list:
    """A fixed random subset of n examples (all when n is 0 or covers them)."""
    if not n or n >= len(examples):
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), n))
    return [examples[i] for i in keep]


def subset(examples: list, size: int, share: float, seed: int, first: bool = False) -> list:
    """`size` examples at random, or the first `size` (0: all), then a fixed random share of
    those (at least one): --train_size (--train_first), then --train_share."""
    examples = examples[:size] if first and size else random_subset(examples, size, seed)
    return random_subset(examples, max(1, round(share * len(examples))), seed)


def check_usable(examples: list, path: Path, split: str) -> None:
    """A split a run needs must have rows, and labels unless it is the test split."""
    if not examples:
        raise DataError(f"{path}: no usable rows; expected a header and at least one row")
    if split != "test" and examples[0].label is None:
        raise DataError(f"{path}: no label column; a {split} file needs its labels")


HELDOUT = "heldout"  # the task_data key of the held-out transfer pairs (load_heldout)
CONTRASTIVE = "contrastive"  # the task_data key (and stage kind) of contrastive sentence tuples


def load_task_data(
    cfg, tokenizer, tasks, seed: int, train_tasks=None, cross=()
) -> dict[str, TaskData]:
    """Read and tokenize each task's splits once; the ids are reused every epoch.

    cfg: settings.DataConfig. Training sets are read only for `train_tasks` (None: every
    task), so a run that trains one task, or only the encoder, does not tokenize the others
    for nothing. cross: pair tasks encoded as one [CLS] a [SEP] b [SEP] sequence. With
    cfg.heldout_size, also the held-out pairs under HELDOUT (load_heldout).
    """
    folder = data_dir(cfg.data_dir)
    out = {}
    for task in tasks:

        def load(split, limit, share=1.0, task=task):
            examples = read_task(folder, task, split, cfg.strict)
            check_usable(examples, task_file(folder, task, split), split)
            examples = subset(examples, limit, share, seed, split == "train" and cfg.train_first)
            if not TASKS[task].pair:
                return SentenceDataset(examples, tokenizer, cfg.max_length)
            return PairDataset(examples, tokenizer, cfg.max_length, cross_encode=task in cross)

        trained = train_tasks is None or task in train_tasks
        out[task] = TaskData(
            train=load("train", cfg.train_size, cfg.train_share) if trained else None,
            dev=load("dev", cfg.dev_size),
            test=load("test", cfg.dev_size) if cfg.test_predictions else None,
        )
        sizes = {k: len(v) for k, v in vars(out[task]).items() if v is not None}
        print(f"{TASKS[task].title}: " + ", ".join(f"{n} {k}" for k, n in sizes.items()))
    if cfg.heldout_size:
        out[HELDOUT] = load_heldout(cfg, tokenizer, seed)
    return out


def load_heldout(cfg, tokenizer, seed: int) -> TaskData:
    """cfg.heldout_size SNLI dev pairs, premise and hypothesis, label 1 for an entailment and
    0 for a contradiction (neutral pairs left out): a similarity the encoder brought along
    that no task trains, scored after every stage (runfolder.Run.evaluate)."""
    path = task_file(data_dir(cfg.data_dir), "snli", "dev")
    snli = read_snli(path, cfg.strict)
    check_usable(snli, path, "dev")  # an unlabeled file would score every pair as 0
    pairs = [
        PairExample(f"snli-{i}", e.premise, e.hypothesis, 1.0 if e.label == 0 else 0.0)
        for i, e in enumerate(snli)
        if e.label != 1
    ]
    check_usable(pairs, path, "dev")
    pairs = random_subset(pairs, cfg.heldout_size, seed)
    print(f"held out: {len(pairs)} SNLI dev pairs (entailment / contradiction)")
    return TaskData(train=None, dev=PairDataset(pairs, tokenizer, cfg.max_length), test=None)


CONTRASTIVE_SOURCES = {"snli": 3, "para": 2, "sst": 1}  # sentences per example of each source
