"""tokenizer.py against Hugging Face's tokenizers loaded from the same vocab.txt.

References: `transformers.BertTokenizer` (Rust `tokenizers` backend) and
`transformers.BertTokenizerLegacy` (pure Python). Ids must be equal, exactly.
"""

import csv
import os
import re
import sys
import unicodedata
from pathlib import Path

import pytest
import torch

import base_bert
import tokenizer
from tokenizer import BertTokenizer, longest_first_lengths

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # the legacy one warns on every truncated pair

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / os.environ.get("MINBERT_DATA", "data")  # an absolute MINBERT_DATA wins the join
DATA_FILES = [
    f"{name}-{split}.csv"
    for name in ("ids-sst", "ids-cfimdb", "quora", "sts")
    for split in ("train", "dev", "test-student")
] + ["snli-train.csv", "snli-dev.csv"]
TEXT_COLUMNS = ("sentence", "sentence1", "sentence2", "premise", "hypothesis")
KEYS = ("input_ids", "token_type_ids", "attention_mask")

HARD_CASES = [
    "",
    "   ",
    "\t\n\r \u3000",
    "Héllo Wörld, naïve café résumé Ångström ÆØÅ æøå ß ẞ",
    "İstanbul DİYARBAKIR",
    "e\u0301 a\u0300\u0301 \u0301alone \u0301",
    "中文字符 mixed中文text 日本語のテキスト 한국어 텍스트 𠀀𠀁",
    "I ❤️ NY 🥰👍🏽 🇫🇷 😀x",
    "a\x00b\x01c\x7fd\ufffde \x0bf\x0cg\x1ch\x85i \ue000j",  # controls, private use
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom \u2060wj \u00adsoft",
    "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u202fg\u1680h",  # unicode whitespace
    "x" * 100,
    "x" * 101,
    "ok " + "ab" * 60 + " ok",
    "supercalifragilisticexpialidocious " * 3,
    "ᚠᛇᚻ ᚦᚨ 𐌰𐌱𐌲 ꦲꦏ ⵜⴰⵎⴰⵣⵉⵖⵜ",  # runes, Gothic, Javanese, Tifinagh
    "Hello!!! What?!... (yes) [no] {maybe} <tag> \"q\" 'single' `back` ~t^c$100 50% a&b "
    "#hash @at_under-score+plus=eq|pipe\\back/slash ¿¡«»—–…“”‘’",
    "ＡＢＣ ﬁ ① ²³ Ⅻ COVID-19's 3.14159 1,000,000 U.S.A. e-mail",
    "[CLS] the [MASK] sat [SEP] on [PAD] the [UNK] mat [mask] [MASK][MASK]x[SEP]y",
    "a long one " * 300,
]
PAIRS = [
    ("", "The other side is empty."),
    ("The other side is empty.", ""),
    ("", ""),
    ("   ", "\u200b"),
    ("中文 text", "Héllo!"),
]


@pytest.fixture(scope="module")
def model_dir():
    try:
        return base_bert.resolve_model_dir("minilm")
    except FileNotFoundError as e:
        pytest.skip(f"embedded model not available: {e}")


@pytest.fixture(scope="module")
def ours(model_dir):
    return BertTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def fast(model_dir):
    return transformers.BertTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def legacy(model_dir):
    return transformers.BertTokenizerLegacy.from_pretrained(str(model_dir))


def ragged(tok, *texts, **kwargs):
    """Unpadded Python lists of the three fields (the legacy tokenizer omits token types)."""
    out = tok(*texts, padding=False, return_tensors=None, return_token_type_ids=True, **kwargs)
    return {k: out[k] for k in KEYS}


def ours_ragged(tok, *texts, truncation=False, **kwargs):
    out = tok(*texts, padding=False, truncation=truncation, return_tensors=None, **kwargs)
    return {k: out[k] for k in KEYS}


def assert_same(ours_out, ref_out, texts):
    for key in KEYS:
        got, want = ours_out[key], ref_out[key]
        bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
        assert not bad, f"{key} differs on {len(bad)} texts, first {texts[bad[0]]!r:.300}"


def assert_same_in_packs(ours, fast, texts, sep, group):
    """Compare `group` texts at a time, joined by `sep`: the Rust tokenizer's cost here is
    mostly per text, so fewer, longer texts take it less than half the time. A differing pack
    is redone text by text to name the first text that differs."""
    packs = [sep.join(texts[i : i + group]) for i in range(0, len(texts), group)]
    got, want = ours_ragged(ours, packs)["input_ids"], ragged(fast, packs)["input_ids"]
    bad = [k for k, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    if bad:
        members = texts[bad[0] * group : (bad[0] + 1) * group]
        assert_same(ours_ragged(ours, members), ragged(fast, members), members)
        pytest.fail(f"{len(bad)} packs differ, first {packs[bad[0]]!r:.300}")


# ---- the project's data, against the Rust tokenizer ----------------------------------------


SLOW_FILES = ("snli", "-train")  # SNLI and every train file: make test's, not make check's


@pytest.mark.parametrize(
    "file_name",
    [
        pytest.param(f, marks=pytest.mark.slow) if any(s in f for s in SLOW_FILES) else f
        for f in DATA_FILES
    ],
)
def test_matches_hf_on_data(file_name, ours, fast):
    """Every distinct sentence, untruncated (eight to a text, see assert_same_in_packs). Pairs truncated to 16 tokens (odd budget 13, to
    exercise longest-first): every row of the dev and test files, every 10th row of the train
    files, whose 120k pairs would take the Rust tokenizer most of a minute (truncation depends
    on lengths only; test_longest_first_lengths_match_hf covers all small lengths)."""
    path = DATA_DIR / file_name
    if not path.is_file():
        pytest.skip(f"{path} not found; set MINBERT_DATA to the data folder")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    columns = [c for c in TEXT_COLUMNS if c in rows[0]]
    assert columns, f"no text column in {path}"
    texts = sorted({r[c] for r in rows for c in columns})  # repeated premises: tokenize once
    # [SEP] in the text is split off before any normalisation, by both tokenizers
    assert_same_in_packs(ours, fast, texts, sep=" [SEP] ", group=8)
    if len(columns) == 2:
        step = 10 if "-train" in file_name else 1
        pairs = sorted({(r[columns[0]], r[columns[1]]) for r in rows[::step]})
        first, second = [a for a, _ in pairs], [b for _, b in pairs]
        kwargs = {"truncation": True, "max_length": 16}
        assert_same(
            ours_ragged(ours, first, second, **kwargs), ragged(fast, first, second, **kwargs), pairs
        )


def test_padded_tensors_match_hf(ours, fast):
    texts = [s for s, _ in PAIRS] + HARD_CASES
    pairs = [p for _, p in PAIRS] + HARD_CASES[::-1]
    for args, kwargs in [
        ((texts,), {}),  # our defaults: padding, truncation to 512, tensors
        ((texts, pairs), {"truncation": True, "max_length": 24, "padding": "max_length"}),
        ((texts, pairs), {"truncation": True, "max_length": 7, "padding": True}),
    ]:
        got = ours(*args, **kwargs)
        want = fast(*args, **{"padding": True, "truncation": True, "return_tensors": "pt"} | kwargs)
        for key in KEYS:
            assert got[key].dtype == torch.long
            assert torch.equal(got[key], want[key]), key


# ---- hard cases, against both references ----------------------------------------------------


@pytest.mark.parametrize("ref", ["fast", "legacy"])
def test_hard_cases_match_hf(ref, ours, request):
    hf = request.getfixturevalue(ref)
    assert_same(ours_ragged(ours, HARD_CASES), ragged(hf, HARD_CASES), HARD_CASES)
    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    assert_same(ours_ragged(ours, first, second), ragged(hf, first, second), PAIRS)
    for text in HARD_CASES:
        assert ours.tokenize(text) == hf.tokenize(text), text


def test_every_character_matches_hf(ours, fast):
    """Each code point alone and between letters: exercises the control, whitespace, punctuation,
    CJK, accent and case tables. Skipped: characters whose Unicode category changed since
    Unicode 3.2 (Rust's tables and Python's unicodedata are of different Unicode versions)."""
    code_points = [
        cp
        for cp in [*range(0x10000), *range(0x1F000, 0x1FB00), *range(0x20000, 0x20200)]
        if not 0xD800 <= cp <= 0xDFFF  # surrogates are not valid text for Rust
        and unicodedata.category(chr(cp)) == unicodedata.ucd_3_2_0.category(chr(cp))
    ]
    assert len(code_points) > 55000
    for template in ("{}", "a{}b"):
        texts = [template.format(chr(cp)) for cp in code_points]
        assert_same_in_packs(ours, fast, texts, sep=" ", group=64)


def test_known_differences_between_hf_tokenizers(ours, fast, legacy):
    """Where the two references disagree we follow the Rust one (see tokenizer.py)."""
    sigma = "ΟΔΟΣ ΣΑΣ"  # str.lower() gives a final 'ς', Rust lowercases per character: 'σ'
    assert ours.tokenize(sigma) == fast.tokenize(sigma) != legacy.tokenize(sigma)
    unassigned = "a\u0378b"  # not a character yet: Rust keeps it, the legacy one drops it
    assert ours.tokenize(unassigned) == fast.tokenize(unassigned) == ["[UNK]"]
    assert legacy.tokenize(unassigned) == ["ab"]
    a, b = "one two three four five", "six seven eight nine ten"  # both trimmed, odd budget
    got = ours(a, b, max_length=10, return_tensors=None)["input_ids"]
    assert got == fast(a, b, truncation=True, max_length=10)["input_ids"]
    assert got != legacy(a, b, truncation=True, max_length=10)["input_ids"]


def test_longest_first_lengths_match_hf(ours, fast):
    """Every pair of lengths 0..12 and every max_length 3..20, with one-token words."""
    lengths = [(la, lb) for la in range(13) for lb in range(13)]
    first = [" ".join(["a"] * la) for la, _ in lengths]
    second = [" ".join(["b"] * lb) for _, lb in lengths]
    for max_length in range(3, 21):
        want = fast(first, second, truncation=True, max_length=max_length)["token_type_ids"]
        for (la, lb), types in zip(lengths, want, strict=True):
            kept = (types.count(0) - 2, types.count(1) - 1)
            assert longest_first_lengths(la, lb, max_length - 3) == kept, (la, lb, max_length)
    assert longest_first_lengths(4, 30, 13) == (4, 9)  # only the longer one is cut
    assert longest_first_lengths(10, 10, 7) == (3, 4)  # tie: the odd token goes to the second


# ---- decode, call surface, errors ---------------------------------------------------------


def test_decode_matches_hf_and_round_trips(ours, fast):
    texts = HARD_CASES + [a for a, _ in PAIRS]
    for ids in fast(texts, truncation=True)["input_ids"]:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == fast.decode(
                ids, skip_special_tokens=skip
            )
    text = "the quick brown fox, unaffected by rain, jumped over 12 lazy dogs! really? yes."
    ids = ours(text)["input_ids"][0]  # (T,) tensor
    assert ours.decode(ids, skip_special_tokens=True) == text
    assert ours.decode(ids).startswith("[CLS] the quick") and ours.decode(ids).endswith("[SEP]")


def test_call_surface(ours, fast):
    for name in ("vocab_size", "pad_token_id", "cls_token_id", "sep_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(fast, name), name
    assert ours.mask_token_id == fast.mask_token_id and ours.model_max_length == 512
    one = ours("Hello there!", return_tensors=None)
    assert one["input_ids"] == fast("Hello there!")["input_ids"]  # flat list, like HF
    assert ours("Hello there!")["input_ids"].shape == (1, 5)
    assert ours.convert_tokens_to_ids(["hello", "notaword"]) == [7592, ours.unk_token_id]
    assert ours.convert_ids_to_tokens([101, 7592]) == ["[CLS]", "hello"]
    assert ours.tokenize("unaffable") == fast.tokenize("unaffable")
    empty = ours([])
    assert empty["input_ids"].shape == (0, 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.convert_ids_to_tokens([ours.vocab_size])


def test_word_cache_is_bounded_and_transparent(model_dir):
    small = BertTokenizer(model_dir / "vocab.txt", cache_size=8)
    default = BertTokenizer(model_dir / "vocab.txt")
    texts = [" ".join(f"w{i}x{j}" for j in range(5)) for i in range(20)] * 2
    assert small(texts, return_tensors=None) == default(texts, return_tensors=None)
    assert len(small._cache) <= 8
    assert len(default._cache) == 100  # one entry per distinct word


def test_wordpiece_and_config_on_a_tiny_vocab(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "Hello", "!"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    lower = BertTokenizer(tmp_path / "vocab.txt")
    assert lower.tokenize("Unaffable! unaff Hello") == [
        "un",
        "##aff",
        "##able",
        "!",
        "un",
        "##aff",
        "[UNK]",
    ]
    for broken, why in [
        ('{"do_lower_case": fal', "not valid JSON"),
        ("[]", "expected a JSON object, got list"),
    ]:
        (tmp_path / "tokenizer_config.json").write_text(broken)
        with pytest.raises(base_bert.ModelError, match=rf"tokenizer_config.json: {why}"):
            BertTokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    cased = BertTokenizer.from_pretrained(str(tmp_path))
    assert cased.tokenize("Hello unaffable Unaffable") == [
        "Hello",
        "un",
        "##aff",
        "##able",
        "[UNK]",
    ]


def test_a_vocab_that_cannot_serve_the_model_is_a_model_error(tmp_path):
    """Missing special tokens, bytes that are not UTF-8, or more tokens than the model's
    embedding rows: each is one ModelError naming vocab.txt, not a failure at a forward."""
    vocab = tmp_path / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text("\n".join(specials[1:] + ["a"]) + "\n", encoding="utf-8")
    with pytest.raises(base_bert.ModelError, match=r"lacks the special tokens \['\[PAD\]'\]"):
        BertTokenizer(vocab)
    vocab.write_bytes("\n".join(specials).encode() + b"\ncaf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(base_bert.ModelError, match=r"vocab.txt: not UTF-8 text"):
        BertTokenizer.from_pretrained(str(tmp_path))
    vocab.write_text("\n".join(specials + ["a", "b"]) + "\n", encoding="utf-8")
    (tmp_path / "config.json").write_text('{"vocab_size": 7}')
    assert BertTokenizer.from_pretrained(str(tmp_path)).vocab_size == 7
    (tmp_path / "config.json").write_text('{"vocab_size": 6}')
    with pytest.raises(base_bert.ModelError, match=r"has 7 tokens, more than .*vocab_size 6"):
        BertTokenizer.from_pretrained(str(tmp_path))


def test_bad_input_errors(ours, tmp_path):
    with pytest.raises(TypeError, match=r"text\[1\] is int"):
        ours(["fine", 3])
    with pytest.raises(TypeError, match=r"text_pair\[2\] is NoneType"):
        ours(["a", "b", "c"], ["a", "b", None])
    with pytest.raises(ValueError, match="text has 2 entries but text_pair has 3"):
        ours(["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="padding must be"):
        ours(["a"], padding="left")
    with pytest.raises(ValueError, match="different lengths"):
        ours(["a", "a b"], padding=False)
    with pytest.raises(ValueError, match="more than max_length=4"):
        ours(["a b c d e"], padding="max_length", truncation=False, max_length=4)
    missing = tmp_path / "nowhere" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        BertTokenizer(missing)


def test_main_prints_every_stage(monkeypatch, capsys, model_dir):
    monkeypatch.setattr(sys, "argv", ["tokenizer.py", "Héllo, wörld!", "--model", str(model_dir)])
    tokenizer.main()
    out = capsys.readouterr().out
    for stage in ("clean:", "basic:", "word pieces:", "input_ids:"):
        assert stage in out
    assert "['hello', ',', 'world', '!']" in out


def test_an_empty_second_text_is_encoded_as_hf_does(ours, fast, legacy):
    for a, b in [("a", ""), ("a", "   "), ("", "b"), ("", "")]:  # a single example
        assert ours(a, b, return_tensors=None)["input_ids"] == fast(a, b)["input_ids"], (a, b)
    assert legacy("a", "")["input_ids"] == [101, 1037, 102, 102]  # the old one differs here
    batch = (["a", "c"], ["", "b"])  # in a batch, "" is an empty segment for all of them
    ids = ours(*batch, padding=False, return_tensors=None)["input_ids"]
    assert ids == fast(*batch)["input_ids"] == legacy(*batch)["input_ids"]
