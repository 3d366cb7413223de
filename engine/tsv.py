"""The CS224n data files read tolerantly: tab-separated, columns found by header name,
quoted fields as the handout's csv reader reads them, and every bad row (wrong column
count, empty or out-of-range label, empty text, repeated id) named by its line, never
misread. By default a training or dev file's bad rows are skipped with one warning per
file naming their lines; strict raises a DataError at the first. A test row is never
skipped (its id needs a prediction): an empty text is read as "", a repeated id as a row
of its own, said in one line; a row that cannot be read stops with a DataError.

datasets.py turns these rows into the handout's examples (read_sentiment, read_pairs).
"""

import csv
import math
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path


class DataError(ValueError):
    """A data file that cannot be read as expected; the message starts with `file:line:`."""


class DataWarning(UserWarning):
    """Rows of a data file were skipped, or (test files) read as the handout reads them."""


def _format_warning(message, category, filename, lineno, line=None, _python=warnings.formatwarning):
    """A DataWarning prints as one plain line (its message names the file and the lines),
    not with the source line that raised it; other warnings print as Python prints them."""
    if issubclass(category, DataWarning):
        return f"warning: {message}\n"
    return _python(message, category, filename, lineno, line)


warnings.formatwarning = _format_warning  # the warnings module's documented hook


class BadRow(Exception):
    """Why one row was rejected (becomes a DataError or a warning line)."""


def label_parser(low: float, high: float, integer: bool = False) -> Callable[[str], float]:
    """Parser for labels in [low, high]: class indices when `integer` (accepts '3' and
    Quora's '1.0', rejects '2.5' and '7'), else real-valued similarity scores."""
    expected = f"an integer {low}-{high}" if integer else f"a number in [{low:g}, {high:g}]"

    def parse(raw: str) -> float:
        if not raw.strip():
            raise BadRow(f"empty label; expected {expected}")
        try:
            value = float(raw)
        except ValueError:
            raise BadRow(f"label {raw.strip()!r} is not a number; expected {expected}") from None
        in_range = math.isfinite(value) and low <= value <= high
        if not in_range or (integer and not value.is_integer()):
            raise BadRow(f"label {raw.strip()!r} is out of range; expected {expected}")
        return int(value) if integer else value

    return parse


def _columns(path: Path, header, text_columns, label_column) -> tuple[list[int], int | None]:
    """Where the text columns and the label column (None: unlabeled file) are."""
    missing = [c for c in text_columns if c not in header]
    if missing:
        raise DataError(
            f"{path}:1: header {header} lacks column(s) {missing}; expected "
            f"{list(text_columns)} and, in labeled files, {label_column!r}"
        )
    label_at = header.index(label_column) if label_column in header else None
    return [header.index(c) for c in text_columns], label_at


def _fields(line: str) -> list[str]:
    """The tab-separated fields of one line, quoted fields read as the handout's csv reader
    reads them ("" is a quote, `"Harry Potter" is` gives `Harry Potter is`). No field of
    the CS224n files holds a tab or a newline, so a quote that swallows a tab is a stray
    one: the row is bad, and the next line is a new row (read as one file, the quote would
    swallow the rows that follow)."""
    (fields,) = csv.reader([line], delimiter="\t")
    if any("\t" in field for field in fields):
        raise BadRow("stray quote: a quoted field runs over a tab; fields may not span tabs")
    return fields


def _parse_row(line, width, text_columns, text_at, label_at, parse_label):
    """([stripped texts], label or None) of one line; BadRow says what is wrong. An
    unlabeled (test) row may have an empty text, but not an empty id."""
    fields = _fields(line)
    if len(fields) != width:
        raise BadRow(f"{len(fields)} columns; expected {width} like the header")
    texts = [fields[i].strip() for i in text_at]
    for name, text in zip(text_columns, texts, strict=True):
        if not text and (label_at is not None or name == "id"):
            raise BadRow(f"empty {name}; expected text")
    if "id" in text_columns and not ID.fullmatch(texts[0]):
        raise BadRow(f"id {texts[0]!r} has a space or a comma; expected one word")
    return texts, None if label_at is None else parse_label(fields[label_at])


ID = re.compile(r"[^\s,]+")  # ids go into "id , prediction" rows: no spaces, no commas


def _lines(path: Path) -> list[str]:
    """The lines of a data file; a missing or unreadable one stops with what to do."""
    if not path.is_file():
        raise FileNotFoundError(
            f"data file {path} not found. Point MINBERT_DATA (or --data_dir) at a folder holding "
            "the data files, or fetch them with `make data` (data/README.md says what they are)."
        )
    try:  # utf-8-sig: a byte-order mark (Excel, Notepad) is not part of the first column
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: cannot read ({err}); expected UTF-8 text") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror}); expected a readable file") from None
    return text.replace("\r\n", "\n").split("\n")  # not splitlines: \f, \x1c... are text


def read_table(
    path: str | Path,
    text_columns: Sequence[str],
    label_column: str,
    parse_label: Callable[[str], float],
    strict: bool,
) -> list[tuple[list[str], float | None]]:
    """Rows of a tab-separated file as ([stripped text columns], label or None).

    Columns are found by header name, which also copes with the extra leading column of
    the test-student files. A file whose header has no `label_column` is unlabeled. Each
    line is one row; an id seen before makes the later row bad.
    """
    path = Path(path)
    lines = _lines(path)
    if not lines[0].strip():
        raise DataError(f"{path}:1: empty file; expected a header line")
    try:
        header = _fields(lines[0])
    except BadRow as err:
        raise DataError(f"{path}:1: {err}") from None
    text_at, label_at = _columns(path, header, text_columns, label_column)
    test = label_at is None  # a test file: every row is predicted, none skipped
    rows, bad, first_line, kept = [], [], {}, {"empty text": [], "repeated id": []}
    for line_no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # blank line: csv.DictReader skips these too
        try:
            row = _parse_row(line, len(header), text_columns, text_at, label_at, parse_label)
            if "id" in text_columns and first_line.setdefault(row[0][0], line_no) != line_no:
                if not test:
                    raise BadRow(f"id {row[0][0]!r} repeats line {first_line[row[0][0]]}")
                kept["repeated id"].append(line_no)
            if not all(row[0]):
                kept["empty text"].append(line_no)
            rows.append(row)
        except BadRow as err:
            if strict or test:
                why = "; a test row is never skipped: its id needs a prediction" if test else ""
                raise DataError(f"{path}:{line_no}: {err}{why}") from None
            bad.append((line_no, str(err)))  # (line, why)
    _warn(path, bad, kept)
    return rows


def _warn(path: Path, bad: list, kept: dict) -> None:
    """One DataWarning for the file's skipped rows, one for the test rows read specially."""
    if bad:
        warnings.warn(
            f"{path}: skipped {len(bad)} bad row(s) at line(s) {_shown(bad)}; "
            f"first: line {bad[0][0]}: {bad[0][1]} (--strict stops instead)",
            DataWarning,
            stacklevel=3,
        )
    if kinds := [f"{len(at)} {kind} at line(s) {_shown(at)}" for kind, at in kept.items() if at]:
        warnings.warn(
            f"{path}: predicted as the handout predicts them: {'; '.join(kinds)} (an empty "
            "text is [CLS] [SEP]; a repeated id gets a prediction row each)",
            DataWarning,
            stacklevel=3,
        )


def _shown(lines: list) -> str:
    """The first five line numbers of `lines` (ints, or (line, why) pairs), then '...'."""
    numbers = [n if isinstance(n, int) else n[0] for n in lines]
    return ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")


def require(files: list[Path]) -> None:
    """Stop with one line naming every missing file and how to fetch it."""
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise SystemExit(
            f"missing data file(s) in {missing[0].parent}: {', '.join(f.name for f in missing)}; "
            "fetch them with `make data` (python -m lab.fetch), see data/README.md"
        )
