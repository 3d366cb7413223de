"""BERT's WordPiece tokenizer, written from scratch.

WordPiece (Schuster & Nakajima, 2012, "Japanese and Korean Voice Search"; Wu et al., 2016,
"Google's Neural Machine Translation System") cuts a word into the longest pieces found in a
fixed vocabulary, marking every piece after the first with `##`: "unaffable" -> un ##aff ##able.
BERT (Devlin et al., 2019) runs a "basic" tokenizer before it. For one text:

  1. clean:      drop NUL, U+FFFD and control characters; every whitespace character -> ' '
  2. CJK:        put spaces around each CJK ideograph, so each one is a word of its own
  3. split:      on whitespace
  4. normalise:  strip accents (NFD, drop the combining marks, category Mn), lowercase
  5. punctuate:  every punctuation character becomes a token of its own
  6. WordPiece:  greedy longest-match-first pieces; [UNK] for a word that has none, or that is
                 longer than 100 characters
  7. specials:   [CLS] a [SEP]  or  [CLS] a [SEP] b [SEP], token_type_ids 0 for the first part and 1
                 for b [SEP]; truncation longest-first; padding with [PAD].

The ids equal those of Hugging Face's `BertTokenizer` (the Rust `tokenizers` backend) for the
same vocab.txt. Its pure-Python twin `BertTokenizerLegacy` differs in three places, and we
follow the Rust one: Python's str.lower() turns a word-final 'Σ' into 'ς' (Rust lowercases
character by character: 'σ'); the legacy one drops unassigned code points (Rust keeps them, so
they become [UNK]); and when both texts of a pair must be truncated and the budget is odd, the
legacy one gives the odd token to the first text, Rust to the longer one (the second on a tie).
Characters whose Unicode category changed in recent Unicode versions may also differ, as Rust's
tables and Python's unicodedata are of different versions.

Speed: steps 1-6 depend only on the whitespace-separated word, so each word's ids are cached.

Run `python tokenizer.py "Some sentence"` to print every stage.
"""

import argparse
import re
import unicodedata
from pathlib import Path

import torch

import base_bert

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_CHARS_PER_WORD = 100  # longer words become [UNK], as in BERT
# Controls that Python's str.split() would treat as separators; BERT deletes them instead.
_SPLITTING_CONTROLS = {
    cp: None
    for cp in range(0x3001)
    if chr(cp).isspace() and chr(cp) not in "\t\n\r" and unicodedata.category(chr(cp)) == "Cc"
}
_ASCII_PUNCT = r"!-/:-@\[-`{-~"  # code points 33-47, 58-64, 91-96, 123-126
# a punctuation character, or a run of anything else
_ASCII_WORD_RE = re.compile(f"[{_ASCII_PUNCT}]|[^{_ASCII_PUNCT}]+")
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


def is_whitespace(ch: str) -> bool:
    return ch in "\t\n\r" or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def is_control(ch: str) -> bool:
    """Control, format (U+200B), private-use or surrogate. Unassigned code points (Cn) stay, as
    in Hugging Face's Rust tokenizer (the Python one drops them)."""
    # \t \n \r are controls in Unicode, but BERT treats them as whitespace
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


def is_punctuation(ch: str) -> bool:
    """Unicode punctuation (P*) plus every non-alphanumeric printable ASCII char ($, ^, `...)."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(ch: str) -> bool:
    """CJK Unified Ideographs and their extensions (not Hangul, Hiragana or Katakana)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def clean_text(text: str) -> str:
    """Step 1: drop NUL, U+FFFD and controls (zero-width space is one); whitespace -> ' '."""
    out = []
    for ch in text:
        if is_whitespace(ch):
            out.append(" ")
        elif ch != "\ufffd" and not is_control(ch):  # NUL is a control
            out.append(ch)
    return "".join(out)


def space_cjk(text: str) -> str:
    """Step 2: surround each CJK ideograph with spaces."""
    return "".join(f" {ch} " if is_cjk(ch) else ch for ch in text)


def strip_accents(word: str) -> str:
    """Decompose (NFD: 'é' -> 'e' + U+0301) and drop the combining marks."""
    return "".join(
        ch for ch in unicodedata.normalize("NFD", word) if unicodedata.category(ch) != "Mn"
    )


def lowercase(word: str) -> str:
    # Character by character when there is a capital sigma: str.lower() would give a final 'ς'
    # at the end of a word, Hugging Face's Rust tokenizer gives 'σ' everywhere.
    return "".join(map(str.lower, word)) if "Σ" in word else word.lower()


def split_punctuation(word: str) -> list[str]:
    """Step 5: 'don't!' -> ['don', "'", 't', '!']."""
    out, start_new = [], True
    for ch in word:
        if is_punctuation(ch):
            out.append(ch)
            start_new = True
        elif start_new:
            out.append(ch)
            start_new = False
        else:
            out[-1] += ch
    return out


def longest_first_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of a pair to keep so that the two fit in `budget` tokens together.

    Trim the longer text until both are equally long, then both in turn. This is Hugging Face
    tokenizers' (Rust) LongestFirst: when both are trimmed, the budget is halved and the odd
    token goes to the longer text (to the second text when they are equally long).
    """
    if len_a + len_b <= budget:
        return len_a, len_b
    short = min(len_a, len_b)
    if 2 * short <= budget:  # trimming the longer one alone is enough
        keep_short, keep_long = short, budget - short
    else:
        keep_short, keep_long = budget // 2, budget - budget // 2
    return (keep_long, keep_short) if len_a > len_b else (keep_short, keep_long)


class BatchEncoding(dict):
    """input_ids, token_type_ids, attention_mask; `.to(device)` moves the tensors, like HF's."""

    def to(self, device) -> "BatchEncoding":
        return BatchEncoding(
            {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()}
        )


class BertTokenizer:
    """WordPiece tokenizer with the call surface of Hugging Face's BertTokenizer.

    The word cache maps a whitespace-separated word of the raw text to its piece ids. It holds
    at most `cache_size` words (a few hundred bytes each) and is emptied when full.
    """

    model_max_length = 512  # longest sequence BERT's position table covers

    def __init__(self, vocab_file, do_lower_case: bool = True, cache_size: int = 1 << 18):
        vocab_file = Path(vocab_file)
        if not vocab_file.is_file():
            raise FileNotFoundError(f"vocabulary file not found: '{vocab_file}'")
        try:
            with open(vocab_file, encoding="utf-8") as f:
                tokens = [line.rstrip("\n") for line in f]
        except UnicodeDecodeError as e:
            raise base_bert.ModelError(f"{vocab_file}: not UTF-8 text ({e.reason})") from None
        self.vocab = {tok: i for i, tok in enumerate(tokens)}  # a repeated line: the last id wins
        self.ids_to_tokens = tokens
        missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
        if missing:
            raise base_bert.ModelError(f"{vocab_file} lacks the special tokens {missing}")
        self.do_lower_case = do_lower_case
        self.vocab_file = vocab_file  # an export copies it
        self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id = (
            self.vocab[t] for t in SPECIAL_TOKENS[:4]
        )
        self.mask_token_id = self.vocab["[MASK]"]
        # no piece is longer than this, so longer candidates need no vocabulary look-up
        self.max_piece_chars = max(len(t) - 2 * t.startswith("##") for t in tokens)
        self.cache_size = cache_size
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_pretrained(cls, name_or_dir: str, **kwargs) -> "BertTokenizer":
        """Read vocab.txt (and do_lower_case from tokenizer_config.json) of a model folder/name."""
        model_dir = base_bert.resolve_model_dir(name_or_dir)
        config_file = model_dir / "tokenizer_config.json"
        if config_file.is_file() and "do_lower_case" not in kwargs:
            casing = base_bert.read_json_object(config_file).get("do_lower_case", True)
            kwargs["do_lower_case"] = casing
        tokenizer = cls(model_dir / "vocab.txt", **kwargs)
        if (model_dir / "config.json").is_file():  # no id may reach past the embedding table
            rows = base_bert.load_config(model_dir).vocab_size
            if tokenizer.vocab_size > rows:
                raise base_bert.ModelError(
                    f"{model_dir / 'vocab.txt'} has {tokenizer.vocab_size} tokens, more than "
                    f"config.json's vocab_size {rows}"
                )
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.ids_to_tokens)

    # ---- text -> tokens -------------------------------------------------------------------

    def basic_tokenize(self, text: str) -> list[str]:
        """Steps 1-5: clean, split CJK, whitespace, accents and case, punctuation."""
        tokens = []
        for word in space_cjk(clean_text(text)).split():
            if self.do_lower_case:
                word = lowercase(strip_accents(word))
            tokens += split_punctuation(word)
        return tokens

    def wordpiece(self, word: str) -> list[int]:
        """Step 6: greedy longest-match-first pieces of one basic token, as ids."""
        if len(word) > MAX_CHARS_PER_WORD:
            return [self.unk_token_id]
        # BEGIN EXERCISE wordpiece: from each start, the longest piece in the vocab ('##' inside a word); none: [UNK] for the word
        ids, start = [], 0
        while start < len(word):
            end = min(len(word), start + self.max_piece_chars)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                piece_id = self.vocab.get(piece)
                if piece_id is not None:
                    break
                end -= 1
            else:  # no piece starts here: the whole word is unknown
                return [self.unk_token_id]
            ids.append(piece_id)
            start = end
        return ids
        # END EXERCISE wordpiece

    def _word_ids(self, word: str) -> list[int]:
        """Ids of one whitespace-separated word of the raw text (cache miss)."""
        if word.isascii() and word.isprintable():  # no control, accent or CJK: skip steps 1-4
            basic = _ASCII_WORD_RE.findall(word.lower() if self.do_lower_case else word)
        else:
            basic = self.basic_tokenize(word)
        ids = [i for token in basic for i in self.wordpiece(token)]
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        if not text.isprintable():
            text = text.translate(_SPLITTING_CONTROLS)
        cache, ids = self._cache, []
        for word in text.split():
            word_ids = cache.get(word)
            ids += word_ids if word_ids is not None else self._word_ids(word)
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Piece ids of one text, without [CLS]/[SEP]. A literal '[MASK]' etc. stays one token."""
        if "[" not in text or not _SPECIAL_RE.search(text):
            return self._encode_plain(text)
        ids = []
        for k, part in enumerate(_SPECIAL_RE.split(text)):  # odd k: a special token
            ids += [self.vocab[part]] if k % 2 else self._encode_plain(part)
        return ids

    def tokenize(self, text: str) -> list[str]:
        return self.convert_ids_to_tokens(self.encode_text(text))

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids) -> str | list[str]:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            return self.convert_ids_to_tokens([ids])[0]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return [self.ids_to_tokens[i] for i in ids]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Join tokens with spaces, glue '##' pieces and . , ! ? to the previous token (as HF)."""
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in SPECIAL_TOKENS]
        out = tokens[:1]
        for token in tokens[1:]:
            if token.startswith("##"):
                out.append(token[2:])
            else:
                out.append(token if token in (".", ",", "!", "?") else " " + token)
        return "".join(out)

    # ---- batches --------------------------------------------------------------------------

    def _with_specials(self, a: list[int], b: list[int] | None, max_length: int | None):
        """[CLS] a [SEP] (b [SEP]), truncated longest-first to max_length; also returns the
        length of the first segment [CLS] a [SEP] (token type 0; the rest has type 1)."""
        if max_length is not None:
            budget = max_length - (2 if b is None else 3)
            if budget < 0:
                raise ValueError(f"max_length={max_length} leaves no room for [CLS] and [SEP]")
            if b is None:
                a = a[:budget]
            else:
                keep_a, keep_b = longest_first_lengths(len(a), len(b), budget)
                a, b = a[:keep_a], b[:keep_b]
        ids = [self.cls_token_id, *a, self.sep_token_id]
        first_len = len(ids)
        if b is not None:
            ids += [*b, self.sep_token_id]
        return ids, first_len

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        padding: bool | str = True,
        truncation: bool | str = True,
        max_length: int | None = 512,
        return_tensors: str | None = "pt",
    ) -> BatchEncoding:
        """Encode one text (or pair) or a batch, like Hugging Face's tokenizer call.

        padding: True/'longest' (to the longest in the batch), 'max_length', False (ragged).
        truncation: True/'longest_first' or False. max_length None means model_max_length.
        return_tensors: 'pt' for LongTensors (batch, T), None for Python lists.
        A single str gives one example: lists of ints, or tensors of shape (1, T).
        """
        if padding not in (True, False, "longest", "max_length", "do_not_pad"):
            raise ValueError(
                f"padding must be True, False, 'longest' or 'max_length', got {padding!r}"
            )
        if truncation not in (True, False, "longest_first", "do_not_truncate"):
            raise ValueError(
                f"truncation must be True, False or 'longest_first', got {truncation!r}"
            )
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        max_length = self.model_max_length if max_length is None else max_length
        texts, pairs = self._check_batch(text, text_pair)
        limit = max_length if truncation not in (False, "do_not_truncate") else None
        rows = [
            self._with_specials(
                self.encode_text(a), None if b is None else self.encode_text(b), limit
            )
            for a, b in zip(texts, pairs if pairs is not None else [None] * len(texts), strict=True)
        ]
        if padding in (False, "do_not_pad"):
            width = None
        elif padding == "max_length":
            width = max_length
        else:
            width = max((len(ids) for ids, _ in rows), default=0)
        if return_tensors == "pt":
            return self._to_tensors(rows, width)
        out = self._to_lists(rows, width)
        if isinstance(text, str):  # one example, not a batch of one
            out = {k: v[0] for k, v in out.items()}
        return BatchEncoding(out)

    def _to_lists(self, rows, width: int | None) -> dict[str, list[list[int]]]:
        out = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        for ids, first_len in rows:
            pad = 0 if width is None else max(0, width - len(ids))  # 'max_length' never cuts
            out["input_ids"].append(ids + [self.pad_token_id] * pad)
            out["token_type_ids"].append([0] * first_len + [1] * (len(ids) - first_len) + [0] * pad)
            out["attention_mask"].append([1] * len(ids) + [0] * pad)
        return out

    def _to_tensors(self, rows, width: int | None) -> BatchEncoding:
        # Built from lengths and one flat id list: torch.tensor on nested lists is slow.
        lengths = torch.tensor([len(ids) for ids, _ in rows], dtype=torch.long)  # (B,)
        first_lens = torch.tensor([first_len for _, first_len in rows], dtype=torch.long)  # (B,)
        if width is None:
            width = int(lengths[0]) if rows else 0
            if bool((lengths != width).any()):
                raise ValueError(
                    "without padding the sequences have different lengths and cannot form one "
                    "tensor; pass padding=True, or return_tensors=None for ragged lists"
                )
        elif bool((lengths > width).any()):
            raise ValueError(
                f"a sequence has {int(lengths.max())} tokens, more than max_length={width}; "
                "pass truncation=True"
            )
        positions = torch.arange(width)  # (T,)
        mask = positions < lengths[:, None]  # (B, T)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)  # (B, T)
        input_ids[mask] = torch.tensor([i for ids, _ in rows for i in ids], dtype=torch.long)
        token_type_ids = (positions >= first_lens[:, None]) & mask  # (B, T)
        return BatchEncoding(
            input_ids=input_ids, token_type_ids=token_type_ids.long(), attention_mask=mask.long()
        )

    @staticmethod
    def _check_batch(text, text_pair) -> tuple[list[str], list[str] | None]:
        """Batch form of the inputs; wrong types and lengths fail here with a clear message."""
        if isinstance(text, str):
            if text_pair is not None and not isinstance(text_pair, str):
                raise TypeError(
                    f"text is a str, so text_pair must be one too, got {type(text_pair).__name__}"
                )
            # as HF: a single empty second text means no pair ([CLS] a [SEP]); in a batch an
            # empty entry is an empty segment ([CLS] a [SEP] [SEP]), in both HF tokenizers
            return [text], [text_pair] if text_pair else None
        if not isinstance(text, (list, tuple)):
            raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")
        if text_pair is not None:
            if not isinstance(text_pair, (list, tuple)):
                raise TypeError(
                    f"text is a list, so text_pair must be one too, got {type(text_pair).__name__}"
                )
            if len(text) != len(text_pair):
                raise ValueError(
                    f"text has {len(text)} entries but text_pair has {len(text_pair)}; they must match"
                )
        for name, batch in (("text", text), ("text_pair", text_pair or ())):
            for i, t in enumerate(batch):
                if not isinstance(t, str):
                    raise TypeError(f"{name}[{i}] is {type(t).__name__} ({t!r:.40}), expected str")
        return list(text), None if text_pair is None else list(text_pair)


def main():
    parser = argparse.ArgumentParser(description="Show each stage of BERT's tokenization.")
    parser.add_argument(
        "text",
        nargs="?",
        default="Héllo, wörld! Tokenizing  naïve 中文 text...",
        help="text to tokenize",
    )
    parser.add_argument("--pair", default=None, help="optional second text, as for a sentence pair")
    parser.add_argument(
        "--model", default=base_bert.EMBEDDED, help="model name or folder with vocab.txt"
    )
    args = parser.parse_args()

    tok = BertTokenizer.from_pretrained(args.model)
    cleaned = clean_text(args.text)
    spaced = space_cjk(cleaned)
    print(f"text:        {args.text!r}")
    print(f"clean:       {cleaned!r}   (controls dropped, whitespace -> ' ')")
    print(f"cjk spaced:  {spaced!r}")
    print(f"words:       {spaced.split()}")
    basic = tok.basic_tokenize(args.text)
    steps = "accents stripped, lowercased, " if tok.do_lower_case else ""
    print(f"basic:       {basic}   ({steps}punctuation split)")
    print(f"word pieces: {[tok.convert_ids_to_tokens(tok.wordpiece(w)) for w in basic]}")
    enc = tok(args.text, args.pair, padding=False, return_tensors=None)
    print(f"tokens:      {tok.convert_ids_to_tokens(enc['input_ids'])}")
    print(f"input_ids:   {enc['input_ids']}")
    print(f"token types: {enc['token_type_ids']}")
    print(f"decoded:     {tok.decode(enc['input_ids'])!r}")


if __name__ == "__main__":
    main()
