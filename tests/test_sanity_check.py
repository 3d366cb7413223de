"""`python sanity_check.py` passes on this checkout and fails loudly when a piece is wrong."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sanity_check

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_sanity_check_passes():
    done = subprocess.run(
        [sys.executable, "sanity_check.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALL CHECKS PASSED" in done.stdout
    assert done.stdout.count("\nOK ") + done.stdout.startswith("OK ") >= 7


def test_sanity_check_reports_a_wrong_reference(tmp_path, monkeypatch, capsys):
    ref = dict(np.load(sanity_check.REFERENCE))
    ref["pooler_output"] = ref["pooler_output"] + 1e-3  # as if our BERT drifted
    np.savez(tmp_path / "ref.npz", **ref)
    monkeypatch.setattr(sanity_check, "REFERENCE", tmp_path / "ref.npz")
    monkeypatch.setattr(sys, "argv", ["sanity_check.py"])
    with pytest.raises(SystemExit) as stop:
        sanity_check.main()
    assert stop.value.code == 1
    out = capsys.readouterr().out
    assert "NOT OK  BERT pooler_output (manual)" in out
    assert "2 CHECK(S) FAILED" in out  # the manual and the SDPA paths


def test_a_reference_or_checkpoint_it_cannot_use_is_one_line(tmp_path, tiny_env):
    good = tmp_path / "optimizer_test.npy"
    np.save(good, np.zeros((2, 3), dtype=np.float32))
    assert sanity_check.find_handout_reference(str(good)) == good  # the file itself
    assert sanity_check.find_handout_reference(str(tmp_path)) == good  # or its folder
    with pytest.raises(SystemExit, match=r"--reference .*nowhere: no optimizer_test.npy there"):
        sanity_check.find_handout_reference(str(tmp_path / "nowhere"))
    np.save(good, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SystemExit, match=r"optimizer_test.npy: not a .npy array"):
        sanity_check.read_handout_reference(good)
    np.save(good, np.zeros((3, 2)))
    with pytest.raises(SystemExit, match=r"\(3, 2\); expected the handout's 2 x 3 floats"):
        sanity_check.read_handout_reference(good)
    with pytest.raises(SystemExit, match=r"hidden size \d+; the stored outputs are all-MiniLM"):
        sanity_check.main(["--bert", str(tiny_env[0])])


def test_the_handouts_bert_outputs_are_compared_as_its_sanity_check_does(tmp_path):
    """A BERT with bert-base's vocabulary saves its outputs on the handout's ids, as the
    handout's sanity_check.data holds bert-base's: they pass, a drift of 1e-3 does not,
    and a file that is more than tensors is refused (loading runs no code)."""
    import torch

    from base_bert import BertConfig
    from bert import BertModel

    torch.manual_seed(0)
    small = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    bert = BertModel(BertConfig(vocab_size=30522, **small)).eval()
    ids = torch.tensor(sanity_check.HANDOUT_IDS)
    with torch.no_grad():
        out = bert(ids, (ids != 0).long())
    stored = {k: out[k].clone() for k in ("last_hidden_state", "pooler_output")}
    stored["last_hidden_state"][0, 5] = 7.0  # padding: zeroed before comparing, as theirs
    torch.save(stored, tmp_path / "sanity_check.data")
    diffs = sanity_check.handout_bert_diffs(bert, tmp_path / "sanity_check.data")
    assert set(diffs) == {"last_hidden_state", "pooler_output"} and max(diffs.values()) <= 1
    stored["pooler_output"] += 1e-3
    torch.save(stored, tmp_path / "sanity_check.data")
    assert (
        sanity_check.handout_bert_diffs(bert, tmp_path / "sanity_check.data")["pooler_output"] > 1
    )
    torch.save({"pooler_output": Path("x")}, tmp_path / "sanity_check.data")
    with pytest.raises(SystemExit, match="not the handout's sanity_check.data"):
        sanity_check.handout_bert_diffs(bert, tmp_path / "sanity_check.data")
