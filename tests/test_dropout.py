"""The engine's faster CPU dropout (engine/runtime.py), against the definition, and the swap
that gives a run's model it in place of bert.py's and the heads' nn.Dropout."""

import pytest
import torch

import sbert
from bert import BertModel
from engine.runtime import Dropout, dropout, fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_a_p_share_and_keeps_the_mean(p):
    """Against the definition: each element dropped with probability p, independently,
    survivors scaled by the inverse keep rate. n = 2^22 draws: the share's standard error is
    at most 2.5e-4, so 2e-3 is 8 of them; a mask of the wrong rate (cut off by one bit of
    16 is 1.5e-5, too small to see; p = 0.11 for 0.1 is 40 errors) fails."""
    torch.manual_seed(0)
    x = torch.rand(2**22) + 0.5
    y = dropout(x, p)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - p) < 2e-3
    torch.testing.assert_close(y[~dropped], x[~dropped] * 2**16 / (2**16 - round(p * 2**16)))
    assert abs(y.mean().item() / x.mean().item() - 1) < 3e-3
    # four masks come from one 64-bit draw: neighbours must still be independent
    lanes = dropped.view(-1, 4).float().T  # (4, n/4): lane j holds elements 4i + j
    off_diagonal = torch.corrcoef(lanes)[~torch.eye(4, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 5e-3  # standard error 1e-3 at n/4 = 2^20 pairs


def test_dropout_gradient_is_the_mask_and_follows_the_generator():
    x = (torch.rand(6, 7, 8) + 0.5).bfloat16().requires_grad_()  # no zeros: y == 0 is a drop
    torch.manual_seed(3)
    y = dropout(x, 0.25)
    y.backward(torch.ones_like(y))
    scale = torch.tensor(2**16 / (2**16 - round(0.25 * 2**16)), dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    torch.testing.assert_close(x.grad, (y != 0).to(x.dtype) * scale, atol=0, rtol=0)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.25), y)  # seeded: the same mask
    assert not torch.equal(dropout(x, 0.25), y)  # the generator moved on
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    for p in (1 - 2**-17, 1 - 2**-20):  # rounds to 1: all dropped, as F.dropout at p = 1
        assert torch.equal(dropout(x.detach(), p), torch.zeros_like(x))
    assert torch.equal(dropout(x.detach(), 2**-20), x.detach())  # rounds to 0: all kept
    with pytest.raises(ValueError):
        dropout(x, 1.5)


def test_a_runs_model_draws_the_engines_dropout_everywhere(tiny_config, monkeypatch):
    """fast_dropout makes every nn.Dropout of the model (BERT's, attention's, the heads')
    the engine's; a swapped model in training equals, bit for bit, the same model whose
    dropouts call `dropout` by hand with the same seed."""
    torch.manual_seed(0)
    model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.3).train()
    plain = [m for m in model.modules() if type(m) is torch.nn.Dropout]
    assert len(plain) == 3 * tiny_config.num_hidden_layers + 2  # + embeddings, the heads'
    ids = torch.randint(1, tiny_config.vocab_size, (3, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    batch["token_type_ids"] = torch.zeros_like(ids)
    torch.manual_seed(1)
    before = model("sst", batch)
    swapped = fast_dropout(model)
    assert all(type(m) is Dropout for m in plain) and swapped is model
    torch.manual_seed(1)
    after = model("sst", batch)
    assert not torch.equal(before, after)  # another draw: the CPU's 16-bit one
    by_hand = lambda m, x: dropout(x, m.p, m.training)  # noqa: E731
    monkeypatch.setattr(torch.nn.Dropout, "forward", by_hand)  # the engine's, unswapped
    plain_model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.3).train()
    plain_model.load_state_dict(model.state_dict())
    torch.manual_seed(1)
    assert torch.equal(plain_model("sst", batch), after)
