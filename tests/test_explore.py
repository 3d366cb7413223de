"""explore.py: a run's attention, the untouched model beside the kept one."""

import pytest
import torch
from matplotlib.image import imread

import explore
from helpers import run


def test_the_attention_picture_of_a_pair_untouched_beside_kept(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run")
    models = explore.untouched_and_kept(tmp_path / "run")
    tokenizer = explore.BertTokenizer.from_pretrained(str(tiny_env[0]))
    maps = {}
    for name, bert in models.items():
        tokens, maps[name] = explore.attention_maps(bert, tokenizer, "a fine film", "a good one")
    n = len(tokens)
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    cfg = models["kept"].config
    assert maps["kept"].shape == (cfg.num_hidden_layers, cfg.num_attention_heads, n, n)
    for probs in maps.values():  # every row a distribution over the sequence
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    assert (maps["kept"] - maps["untouched"]).abs().max() > 1e-4  # training moved them

    out = explore.main([str(tmp_path / "run"), "a fine film", "--pair", "a good one"])
    assert out == tmp_path / "run" / f"attention-layer{cfg.num_hidden_layers}.png"
    pixels = imread(out)[..., :3]  # (height, width, RGB) in [0, 1]
    assert pixels.std() > 0.05  # heatmaps and labels drawn, not a blank page


def test_explore_says_what_it_needs(tiny_env, tmp_path, capsys):
    with pytest.raises(SystemExit):
        explore.main([str(tmp_path), "a sentence"])
    assert "no best.safetensors there" in capsys.readouterr().err
    run(tiny_env, tmp_path / "run")
    with pytest.raises(SystemExit):
        explore.main([str(tmp_path / "run"), "a sentence", "--layer", "9"])
    assert "--layer 9: this model has layers 1 to" in capsys.readouterr().err
