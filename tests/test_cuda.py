"""What only a GPU runs: CUDA kernels against the CPU and the manual attention, fp16 with
its gradient scaler, checkpoints that cross devices. Skipped without CUDA; `python
lab/gpu_check.py run` (make gpu-check) runs them with `-m cuda`."""

import pytest
import torch

import batches
import bert
import evaluation
from bert import BertModel
from engine import checkpoint
from engine.runtime import check_attention, dropout, make_runtime
from helpers import run, sentence_batch, tiny_model_and_data
from optimizer import AdamW

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def twin_berts(config, **overrides):
    """The same random tiny BERT twice on the GPU, the second with `overrides`."""
    torch.manual_seed(0)
    a = BertModel(config).eval().cuda()
    b = BertModel(type(config)(**{**config.to_dict(), **overrides})).eval().cuda()
    b.load_state_dict(a.state_dict())
    return a, b


def test_sdpa_equals_the_manual_attention_on_cuda(tiny_config):
    manual, sdpa = twin_berts(tiny_config, attention="sdpa")
    batch = sentence_batch(B=4, T=9, vocab=tiny_config.vocab_size)  # row 0 padded after 3
    ids, mask, types = (batch[k].cuda() for k in INPUTS)
    keep = mask.bool()  # padded positions' outputs are free; masked keys must be left out
    with torch.no_grad():
        for dtype, atol in ((None, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                a = manual(ids, mask, types)["last_hidden_state"]
                b = sdpa(ids, mask, types)["last_hidden_state"]
            assert (a - b)[keep].abs().max().item() <= atol, dtype


def test_auto_attention_is_sdpa_on_cuda_and_manual_on_the_cpu(tiny_config):
    """Probed as a run's model is (check_attention), auto takes SDPA on the GPU only."""
    manual, auto = twin_berts(tiny_config, attention="auto")
    assert check_attention(auto) < 1e-9
    sdpa = twin_berts(tiny_config, attention="sdpa")[1]
    batch = sentence_batch(B=4, T=9, vocab=tiny_config.vocab_size)
    with torch.no_grad():
        on_gpu = [m(*(batch[k].cuda() for k in INPUTS))["last_hidden_state"] for m in (auto, sdpa)]
        auto_cpu, manual_cpu = (
            m.cpu()(*batch.values())["last_hidden_state"] for m in (auto, manual)
        )
    assert torch.equal(on_gpu[0], on_gpu[1]) and torch.equal(auto_cpu, manual_cpu)


def test_an_edited_attention_runs_on_cuda_under_auto(tiny_config, monkeypatch):
    """A student's edit to BertSelfAttention.attention (here a temperature of 2) changes
    what a CUDA run computes: the probe finds it unlike SDPA, so auto runs it."""

    class Edited(bert.BertSelfAttention):
        def attention(self, key, query, value, attention_mask):
            return super().attention(key, query / 2, value, attention_mask)

    sdpa = twin_berts(tiny_config, attention="sdpa")[1]
    monkeypatch.setattr(bert, "BertSelfAttention", Edited)
    manual, auto = twin_berts(tiny_config, attention="auto")
    assert check_attention(auto) > 1e-3
    batch = sentence_batch(B=4, T=9, vocab=tiny_config.vocab_size)
    with torch.no_grad():
        edited, hand, fused = (
            m(*(batch[k].cuda() for k in INPUTS))["last_hidden_state"] for m in (auto, manual, sdpa)
        )
    assert torch.equal(edited, hand) and (edited - fused).abs().max() > 1e-3


def test_the_cuda_forward_equals_the_cpu_forward(tiny_config):
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    ids, mask, types = sentence_batch(B=3, T=7, vocab=tiny_config.vocab_size).values()
    with torch.no_grad():
        cpu = model(ids, mask, types)["last_hidden_state"]
        gpu = model.cuda()(ids.cuda(), mask.cuda(), types.cuda())["last_hidden_state"]
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-5)


def test_dropout_on_cuda_keeps_the_expectation():
    x = torch.rand(2**20, device="cuda") + 0.5
    y = dropout(x, 0.1)
    assert abs((y == 0).float().mean().item() - 0.1) < 2e-3
    torch.testing.assert_close(y[y != 0], x[y != 0] / 0.9)


def one_step(model, batch, rt) -> torch.Tensor:
    optimizer = AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cuda", dtype=rt.amp_dtype or torch.float32, enabled=bool(rt.amp_dtype)):
        loss = model(*batch)["pooler_output"].float().pow(2).mean()
    rt.scaler.scale(loss).backward()
    rt.scaler.unscale_(optimizer)  # the true gradient, as train_step takes its norm
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    rt.scaler.step(optimizer)
    rt.scaler.update()
    return norm


def test_fp16_with_the_scaler_steps_like_float32(tiny_config):
    fp32, fp16 = twin_berts(tiny_config)
    batch = [t.cuda() for t in sentence_batch(B=4, T=9, vocab=tiny_config.vocab_size).values()]
    rt16, rt32 = make_runtime("cuda", "fp16"), make_runtime("cuda", "fp32")
    assert rt16.scaler.is_enabled() and rt16.amp_dtype == torch.float16
    assert not rt32.scaler.is_enabled()
    scale = rt16.scaler.get_scale()
    norms = one_step(fp16, batch, rt16), one_step(fp32, batch, rt32)
    assert rt16.scaler.get_scale() == scale  # no overflow: the step was taken
    torch.testing.assert_close(norms[0], norms[1], rtol=2e-2, atol=0)  # unscaled before the norm
    for p, q in zip(fp16.parameters(), fp32.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-4, rtol=0)  # lr 1e-3: one step of ~1e-3


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_model_trained_on_cuda_scores_the_same_on_the_cpu(tiny_env, tmp_path, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bf16")
    rows = run(tiny_env, tmp_path / "run", "--device", "cuda", "--precision", precision)
    assert all(0 <= r["overall"] <= 1 for r in rows)
    model, task_data = tiny_model_and_data(tiny_env)
    checkpoint.load_model(model, tmp_path / "run" / "best.safetensors")
    loaders = {t: batches.make_loader(d.dev, 8, shuffle=False) for t, d in task_data.items()}
    cpu = evaluation.evaluate(model, loaders, "cpu")
    gpu = evaluation.evaluate(model.cuda(), loaders, "cuda")
    for task in loaders:
        assert cpu[task].preds == pytest.approx(gpu[task].preds, abs=1e-4)
