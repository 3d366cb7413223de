"""Fetching the data: every file the presets read that is missing, from where it comes.

    python -m lab.fetch [--data_dir DIR]      # what `make data` runs

The CS224n handout's files come one by one from its repository's data/ folder; SNLI's two
files are built from the SNLI 1.0 release (data/README.md says how). Each source's address
can be changed by its environment variable (SOURCES), e.g. to a stand-in server: the tests
serve both on 127.0.0.1. A download streams to NAME.part and is renamed only when whole;
a failure leaves nothing behind and names the address.
"""

import argparse
import csv
import http.client
import io
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
import warnings
import zipfile
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm

from commands.cli import prog, run_cli
from datasets import (
    FILE_STEMS,
    SPLITS,
    DataError,
    data_dir,
    expected_files,
    read_task,
    task_file,
)

HANDOUT_URL = "https://raw.githubusercontent.com/gpoesia/minbert-default-final-project/main/data/"


# Where the files come from; each address can be changed by its environment variable
# (data/README.md), e.g. to a stand-in server.
SOURCES = {
    "MINBERT_HANDOUT_URL": HANDOUT_URL,  # the CS224n handout's data/ folder
    "MINBERT_SNLI_URL": "https://nlp.stanford.edu/projects/snli/snli_1.0.zip",  # SNLI 1.0
}
SNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}  # "-": no gold label
SNLI_TRAIN_ROWS = 100_000  # snli-train.csv: the first rows of SNLI 1.0 train, "-" dropped
ONE_LINE = str.maketrans("\t\r\n", "   ")  # what a tab-separated field cannot hold
SNLI_MEMBERS = {"train": "snli_1.0/snli_1.0_train.jsonl", "dev": "snli_1.0/snli_1.0_test.jsonl"}
# The handout's reference outputs (sanity_check.py reads them), from the folder above its
# data/: AdamW's weights after optimizer_test.py (a .npy), bert-base's outputs (torch.save).
REFERENCES = {"optimizer_test.npy": b"\x93NUMPY", "sanity_check.data": b"PK\x03\x04"}


class FetchError(RuntimeError):
    """A download or a build that failed; the message names the address or the file."""


def source(variable: str) -> str:
    """The address of a source: its environment variable when set, else the public one."""
    url = os.environ.get(variable) or SOURCES[variable]
    if not url.startswith(("http://", "https://", "file:")):
        raise FetchError(f"${variable}={url}: expected an http(s):// or file: address")
    return url


def _download(url: str, dest: Path, timeout: float) -> None:
    """Stream url into dest with a progress bar. Atomic: the bytes go to dest.part and are
    renamed only once their count matches the server's Content-Length; on any failure
    nothing is left behind."""
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
            size = response.headers.get("Content-Length")
            total = int(size) if size else None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, leave=False) as bar:
                while chunk := response.read(1 << 20):
                    bar.update(out.write(chunk))
            got = out.tell()
        if total is not None and got != total:
            raise FetchError(f"{url}: got {got:,} of {total:,} bytes; the download was cut short")
        part.replace(dest)
    except http.client.IncompleteRead as err:
        raise FetchError(f"{url}: the download was cut short ({err})") from None
    finally:
        part.unlink(missing_ok=True)


def _write_rows(path: Path, header: list[str], rows) -> None:
    """A tab-separated file with a header, quoted as the handout's csv files are; atomic."""
    part = path.with_name(path.name + ".part")
    try:
        with open(part, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(header)
            writer.writerows(rows)
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def _snli_rows(archive: zipfile.ZipFile, member: str, limit: int | None):
    """(premise, hypothesis, label) of one SNLI 1.0 jsonl member: its first `limit` lines
    (all when None), those without a gold label dropped; a tab or line break in a sentence
    becomes a space (a field of the file cannot hold one), other spacing is kept."""
    with archive.open(member) as f:
        for n, line in enumerate(io.TextIOWrapper(f, encoding="utf-8")):
            if limit is not None and n >= limit:
                return
            row = json.loads(line)
            if row["gold_label"] in SNLI_LABELS:
                premise, hypothesis = (
                    row[k].translate(ONE_LINE) for k in ("sentence1", "sentence2")
                )
                yield premise, hypothesis, SNLI_LABELS[row["gold_label"]]


def build_snli(zip_path: Path, folder: Path, whole: bool = False) -> None:
    """snli-train.csv and snli-dev.csv from the SNLI 1.0 release: train is the first
    100,000 training rows (whole: all 550,152, as the thesis trained on), dev the test
    split, each without the rows that have no gold label (data/README.md). The archive's
    CRCs are checked first; a failure leaves neither file (a task with one file would
    never be fetched again)."""
    built = [task_file(folder, "snli", split) for split in SNLI_MEMBERS]
    try:
        with zipfile.ZipFile(zip_path) as archive:
            corrupt = archive.testzip()
            if corrupt:
                raise FetchError(
                    f"{zip_path}: {corrupt} fails its CRC check; delete it, fetch again"
                )
            for split, member in SNLI_MEMBERS.items():
                limit = SNLI_TRAIN_ROWS if split == "train" and not whole else None
                rows = _snli_rows(archive, member, limit)
                _write_rows(
                    task_file(folder, "snli", split), ["premise", "hypothesis", "label"], rows
                )
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as err:
        for path in built:
            path.unlink(missing_ok=True)
        raise FetchError(f"{zip_path}: not the SNLI 1.0 release ({err})") from None


def fetch_missing(folder: Path, timeout: float, snli_all: bool = False) -> list[str]:
    """Download what is missing into folder; return the names still missing.

    A task's files are fetched only when ALL of them are missing, and placed only when all
    arrived: mixing sources would leak (a mirror's quora-train.csv is cut from the handout's
    quora-dev.csv), and a task left half there would never be fetched again. SNLI: the
    release is downloaded beside them, both files are built from it, and it is deleted;
    snli_all builds them again from all of its training split, whatever is there.
    The first address that cannot be reached ends the fetching.
    """
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for task in FILE_STEMS:
            splits = SPLITS[:2] if task == "snli" else SPLITS
            names = [task_file(folder, task, s).name for s in splits]
            if task == "snli" and snli_all:
                fetch_snli(folder, timeout, whole=True)
                continue
            if any((folder / name).is_file() for name in names):
                continue
            if task == "snli":
                fetch_snli(folder, timeout)
            else:
                fetch_task(folder, task, splits, timeout)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        print(f"offline? {getattr(err, 'reason', err)}; not trying further files")
    except FetchError as err:
        print(f"error: {err}")
    return [n for n in expected_files() if not (folder / n).is_file()]


def fetch_references(folder: Path, timeout: float) -> None:
    """The handout's reference files that are missing, each checked by its first bytes (a
    login page answers 200 too). They are optional: a failure is one line, never an error."""
    root = source("MINBERT_HANDOUT_URL").rstrip("/").rsplit("/", 1)[0] + "/"
    for name, magic in REFERENCES.items():
        path = folder / name
        if path.is_file():
            continue
        try:
            _download(root + name, path, timeout)
        except (urllib.error.URLError, TimeoutError, ConnectionError, FetchError) as err:
            print(f"{name}: not fetched from {root + name} ({getattr(err, 'reason', err)})")
            continue
        with open(path, "rb") as f:
            if f.read(len(magic)) != magic:
                path.unlink()
                print(f"{name}: {root + name} is not the handout's file; not kept")
                continue
        print(f"downloaded {name} from {root + name}")


def fetch_task(folder: Path, task: str, splits, timeout: float) -> None:
    """One task's handout files, downloaded into a staging folder, read as data files (a
    login or rate-limit page answers 200 too) and moved in together."""
    handout = source("MINBERT_HANDOUT_URL")
    staging = folder / ".fetching"
    staging.mkdir(exist_ok=True)
    names = [task_file(folder, task, split).name for split in splits]
    try:
        for name in names:
            try:
                _download(handout + name, staging / name, timeout)
            except urllib.error.HTTPError as err:
                print(f"{name}: not at {handout + name} (HTTP {err.code}); its task left out")
                return
        for name, split in zip(names, splits, strict=True):
            try:
                read_task(staging, task, split)
            except DataError as err:
                raise FetchError(f"{handout + name} is not the handout's file: {err}") from None
        for name in names:
            (staging / name).replace(folder / name)
            print(f"downloaded {name} from {handout + name}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_snli(folder: Path, timeout: float, whole: bool = False) -> None:
    """Both SNLI files, built from the release at MINBERT_SNLI_URL (about 90 MB); whole:
    all of its training split (build_snli)."""
    url = source("MINBERT_SNLI_URL")
    archive = folder / ".snli-release.zip"  # never a data file's name, whatever the URL
    try:
        _download(url, archive, timeout)
        build_snli(archive, folder, whole)
    except urllib.error.HTTPError as err:
        raise FetchError(f"SNLI: not at {url} (HTTP {err.code})") from None
    finally:
        archive.unlink(missing_ok=True)
    print(f"built snli-train.csv and snli-dev.csv from {url}")


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog(),
        description="Fetch every data file the presets read that is missing (the CS224n "
        "handout's, and SNLI built from its 1.0 release), then check them all.",
        epilog="Sources: " + "; ".join(f"${k} (default {v})" for k, v in SOURCES.items()),
    )
    parser.add_argument(
        "--data_dir", default=None, help="data folder (default: $MINBERT_DATA, else data/)"
    )
    parser.add_argument(
        "--no_download", action="store_true", help="only check, never touch the network"
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print nothing when no file is missing"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait on the network"
    )
    parser.add_argument(
        "--snli_all",
        action="store_true",
        help="build snli-train.csv from all of SNLI 1.0's training split (550,152 rows, "
        "the thesis's), not its first 100,000; replaces the file that is there",
    )
    return parser


def main(argv=None) -> int:
    parser = command_line()
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    folder = data_dir(args.data_dir)
    if folder.exists() and not folder.is_dir():
        parser.error(f"data folder {folder} is a file; expected a folder")
    missing = [n for n in expected_files() if not (folder / n).is_file()]
    references = [n for n in REFERENCES if not (folder / n).is_file()]
    if args.quiet and not missing and not references and not args.snli_all:
        return 0
    if (missing or args.snli_all) and not args.no_download:
        missing = fetch_missing(folder, args.timeout, args.snli_all)
    if references and not args.no_download:
        fetch_references(folder, args.timeout)
    check_files(folder)
    for name in missing:
        print(f"MISSING {name}")
    if missing:
        print(
            f"\n{len(missing)} file(s) missing from {folder.resolve()}. Fetch them when online "
            "(python -m lab.fetch), copy them there, or point MINBERT_DATA (or --data_dir) at "
            "a folder that has them: data/README.md says where each comes from. Take all "
            "files of a task from one source: a mirror's Quora split is cut from the "
            "handout's quora-dev.csv.",
            file=sys.stderr,
        )
        return 1
    return 0


def check_files(folder: Path) -> None:
    """Read every file that is there and print its row count (and what was skipped)."""
    for task in FILE_STEMS:
        for split in SPLITS[:2] if task == "snli" else SPLITS:
            path = task_file(folder, task, split)
            if not path.is_file():
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rows = len(read_task(folder, task, split))
            notes = "; ".join(str(w.message).split(": ", 1)[1] for w in caught)
            print(f"ok      {path.name:28s} {rows:7d} rows" + (f"  ({notes})" if notes else ""))


if __name__ == "__main__":
    sys.exit(run_cli(main))
