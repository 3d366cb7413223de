"""Our BertModel against Hugging Face's BertModel with the same weights, and loading errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

import bert
from base_bert import BertConfig, ModelError, hf_to_ours, ours_to_hf, resolve_model_dir
from bert import BertModel, BertSelfAttention, mean_pool
from commands import command
from engine import runtime

REPO = Path(__file__).resolve().parent.parent

ATOL = 1e-5


def hf_config(cfg: BertConfig) -> transformers.BertConfig:
    d = {k: v for k, v in cfg.to_dict().items() if k != "attention"}
    return transformers.BertConfig(**d, attn_implementation="eager")


def batch(vocab_size, B=4, T=19, seed=0):
    """Random ids with padding in two rows and both token types."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[3, 4:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    types[mask == 0] = 0
    return ids, mask, types


def embedded(model, ids, types):
    """The embedding output (B, T, H) of ids with their token types."""
    with model.token_types(types):
        return model.embed(ids)


def max_diff(ours, ref, mask):
    keep = mask.bool()  # padded positions are not compared: they are never used
    return (
        (ours["last_hidden_state"] - ref.last_hidden_state)[keep].abs().max().item(),
        (ours["pooler_output"] - ref.pooler_output).abs().max().item(),
    )


@pytest.fixture(scope="module")
def minilm_pair():
    ours = BertModel.from_pretrained("minilm").eval()
    ref = transformers.BertModel.from_pretrained(
        str(resolve_model_dir("minilm")), attn_implementation="eager"
    ).eval()
    return ours, ref


def test_embedded_checkpoint_equals_hf(minilm_pair):
    ours, ref = minilm_pair
    ids, mask, types = batch(ours.config.vocab_size)
    with torch.no_grad():
        hidden, pooled = max_diff(ours(ids, mask, types), ref(ids, mask, types), mask)
    assert hidden <= ATOL and pooled <= ATOL, (hidden, pooled)


def test_random_tiny_config_equals_hf(tiny_config):
    torch.manual_seed(0)
    ref = transformers.BertModel(hf_config(tiny_config)).eval()
    ours = BertModel(tiny_config).eval()
    # a plain name mapping is all it takes: no key is missing or left over
    mapped = {hf_to_ours(k): v for k, v in ref.state_dict().items() if hf_to_ours(k)}
    assert set(mapped) == set(ours.state_dict())
    ours.load_state_dict(mapped)
    ids, mask, types = batch(tiny_config.vocab_size)
    with torch.no_grad():
        hidden, pooled = max_diff(ours(ids, mask, types), ref(ids, mask, types), mask)
    assert hidden <= ATOL and pooled <= ATOL, (hidden, pooled)


def test_auto_attention_on_the_cpu_is_the_manual_one_bit_for_bit(tiny_config):
    torch.manual_seed(0)
    models = [
        BertModel(BertConfig(**{**tiny_config.to_dict(), "attention": a})).eval()
        for a in ("manual", "auto", "sdpa")
    ]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    ids, mask, types = batch(tiny_config.vocab_size)
    manual, auto, sdpa = (m(ids, mask, types)["last_hidden_state"] for m in models)
    assert torch.equal(auto, manual) and not torch.equal(sdpa, manual)  # (test_cuda: auto is sdpa)


@pytest.mark.parametrize("training", [False, True])
def test_sdpa_path_equals_manual(tiny_config, training):
    torch.manual_seed(0)
    manual = BertModel(tiny_config)
    sdpa = BertModel(BertConfig(**{**tiny_config.to_dict(), "attention": "sdpa"}))
    sdpa.load_state_dict(manual.state_dict())
    if training:  # dropout off but autograd on: gradients must agree too
        for m in (manual, sdpa):
            m.train()
            for mod in m.modules():
                if isinstance(mod, torch.nn.Dropout):
                    mod.p = 0.0
    else:
        manual.eval()
        sdpa.eval()
    ids, mask, types = batch(tiny_config.vocab_size)
    a, b = manual(ids, mask, types), sdpa(ids, mask, types)
    keep = mask.bool()
    assert (a["last_hidden_state"] - b["last_hidden_state"])[keep].abs().max() <= ATOL
    if training:
        a["pooler_output"].sum().backward()
        b["pooler_output"].sum().backward()
        for (n, p), q in zip(manual.named_parameters(), sdpa.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad, atol=ATOL), n


@pytest.mark.parametrize("kind", ["manual", "sdpa"])
def test_attention_probabilities_equal_a_hand_computation_and_change_nothing(tiny_config, kind):
    """Each layer's probabilities, head by head, from its query and key weights on the real
    tokens alone (1e-6); padded keys get 0. The outputs are bit for bit those without them
    (manual: the same computation, in train mode too; sdpa: they come from the manual path)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{**tiny_config.to_dict(), "attention": kind}))
    ids, mask, types = batch(tiny_config.vocab_size)
    nh = tiny_config.num_attention_heads
    hs = tiny_config.hidden_size // nh
    for training in (False, True):
        model.train(training)
        outs = []
        for keep in (False, True):
            torch.manual_seed(1)  # the same dropout masks both times
            with torch.no_grad():
                outs.append(model.encode(embedded(model, ids, types), mask, output_attentions=keep))
        if kind == "manual":
            assert torch.equal(outs[0]["last_hidden_state"], outs[1]["last_hidden_state"])
            assert torch.equal(outs[0]["pooler_output"], outs[1]["pooler_output"])
        assert "attentions" not in outs[0]
    model.eval()
    with torch.no_grad():
        x = embedded(model, ids, types)  # (B, T, H)
        probs = model.encode(x, mask, output_attentions=True)["attentions"]
        additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        assert len(probs) == tiny_config.num_hidden_layers
        for layer, got in zip(model.bert_layers, probs, strict=True):
            sa = layer.self_attention
            assert got.shape == (len(ids), nh, ids.size(1), ids.size(1))
            for b in range(len(ids)):
                n = int(mask[b].sum())  # its real tokens come first
                for h in range(nh):
                    cols = slice(h * hs, (h + 1) * hs)
                    q = x[b, :n] @ sa.query.weight[cols].T + sa.query.bias[cols]  # (n, hs)
                    k = x[b, :n] @ sa.key.weight[cols].T + sa.key.bias[cols]  # (n, hs)
                    expected = torch.softmax(q @ k.T / hs**0.5, dim=-1)  # (n, n)
                    assert (got[b, h, :n, :n] - expected).abs().max() <= 1e-6
                    assert torch.all(got[b, h, :, n:] == 0)  # padded keys
            x = layer(x, additive)


def test_attention_probabilities_equal_hf(minilm_pair):
    ours, ref = minilm_pair
    ids, mask, types = batch(ours.config.vocab_size)
    with torch.no_grad():
        a = ours.encode(embedded(ours, ids, types), mask, output_attentions=True)["attentions"]
        b = ref(ids, mask, types, output_attentions=True).attentions
    assert len(a) == len(b) == 6
    for x, y in zip(a, b, strict=True):
        keep = mask.bool()[:, None, :, None]  # (B, 1, T, 1): real queries' rows
        assert ((x - y) * keep).abs().max() <= ATOL  # the hidden states differ by ~1e-6 too


def test_sdpa_equals_manual_on_embedded_checkpoint(minilm_pair):
    ours, _ = minilm_pair
    sdpa = BertModel.from_pretrained("minilm", attention="sdpa").eval()
    ids, mask, types = batch(ours.config.vocab_size, seed=1)
    with torch.no_grad():
        a, b = ours(ids, mask, types), sdpa(ids, mask, types)
    assert (a["last_hidden_state"] - b["last_hidden_state"])[mask.bool()].abs().max() <= ATOL


def test_attention_function_against_loop(tiny_config):
    """attention(key, query, value, mask), the handout's order, merges the heads: head h of
    token i is columns h * hs .. (h + 1) * hs of its row."""
    torch.manual_seed(0)
    nh = tiny_config.num_attention_heads
    hs = tiny_config.hidden_size // nh
    q, k, v = torch.randn(3, 2, nh, 5, hs).unbind(0)  # (B=2, nh, T=5, hs) each
    mask = torch.zeros(2, 1, 1, 5)
    mask[1, ..., 3:] = torch.finfo(torch.float32).min
    out = BertSelfAttention(tiny_config).eval().attention(k, q, v, mask)  # (B, T, H)
    assert out.shape == (2, 5, nh * hs)
    for b in range(2):
        for h in range(nh):
            T_b = 5 if b == 0 else 3
            for i in range(5):
                s = torch.tensor([q[b, h, i] @ k[b, h, j] / hs**0.5 for j in range(T_b)])
                w = torch.softmax(s, dim=0)
                ref = sum(w[j] * v[b, h, j] for j in range(T_b))
                assert torch.allclose(out[b, i, h * hs : (h + 1) * hs], ref, atol=1e-6)


def test_gradients_reach_every_parameter(tiny_config):
    torch.manual_seed(0)
    model = BertModel(tiny_config).train()
    ids, mask, types = batch(tiny_config.vocab_size)
    out = model(ids, mask, types)
    (out["last_hidden_state"].pow(2).mean() + out["pooler_output"].sum()).backward()
    for name, p in model.named_parameters():
        if name == "word_embedding.weight":
            assert p.grad[ids.unique()].abs().sum() > 0
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_token_types_hold_for_the_calls_inside_and_nest(tiny_config):
    """embed reads the token types `token_types` holds, 0 outside; an inner block (forward's
    own) gives the outer one's back."""
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    ids, mask, types = batch(tiny_config.vocab_size)
    with torch.no_grad():
        plain = model.embed(ids)
        with model.token_types(types):
            paired = model.embed(ids)
            model(ids, mask)  # its own token_types(None) inside
            assert torch.equal(model.embed(ids), paired)
        assert torch.equal(model.embed(ids), plain) and not torch.equal(paired, plain)
        ours = model(ids, mask, types)["last_hidden_state"]
        assert torch.equal(ours, model.encode(paired, mask)["last_hidden_state"])


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # (1, 3, 2)
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]))


def save_hf_checkpoint(path, cfg, state, fmt="safetensors"):
    """A checkpoint folder in Hugging Face's format: our names in `state` mapped to HF's."""
    state = {(ours_to_hf(k) or k): v for k, v in state.items()}
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    else:
        torch.save(state, path / "pytorch_model.bin")


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_loads_local_folder_with_prefix_and_old_names(tmp_path, tiny_config, fmt):
    torch.manual_seed(0)
    src = BertModel(tiny_config)
    state = {}
    for k, v in src.state_dict().items():  # as task checkpoints and old TF ports store them
        k = "bert." + ours_to_hf(k).replace("LayerNorm.weight", "LayerNorm.gamma")
        state[k.replace("LayerNorm.bias", "LayerNorm.beta")] = v
    state["cls.predictions.bias"] = torch.zeros(tiny_config.vocab_size)  # pretraining head: ignored
    save_hf_checkpoint(tmp_path / "ckpt", tiny_config, state, fmt)
    loaded = BertModel.from_pretrained(str(tmp_path / "ckpt"))
    for (n, a), b in zip(src.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_missing_and_unexpected_keys_are_reported(tmp_path, tiny_config):
    state = BertModel(tiny_config).state_dict()
    state.pop("pooler_dense.weight")
    state["encoder.layer.9.extra"] = torch.zeros(1)
    save_hf_checkpoint(tmp_path / "ckpt", tiny_config, state)
    with pytest.warns(UserWarning) as record:
        BertModel.from_pretrained(str(tmp_path / "ckpt"))
    text = " ".join(str(r.message) for r in record)
    assert "pooler_dense.weight" in text and "encoder.layer.9.extra" in text


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, tiny_config):
    state = BertModel(tiny_config).state_dict()
    bigger = BertConfig(**{**tiny_config.to_dict(), "intermediate_size": 128})
    save_hf_checkpoint(tmp_path / "ckpt", bigger, state)
    with pytest.raises(
        ValueError, match=r"intermediate\.dense\.bias. has shape \(64,\).*shape \(128,\)"
    ):
        BertModel.from_pretrained(str(tmp_path / "ckpt"))


def test_unknown_model_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="not-a-real-model.*offline.*minilm"):
        BertModel.from_pretrained("not-a-real-model")


def test_missing_local_path_says_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        BertModel.from_pretrained(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertModel.from_pretrained(str(tmp_path / "empty"))


def test_bad_ids_and_lengths(tiny_config):
    model = BertModel(tiny_config)
    with pytest.raises(ValueError, match=r"\[0, 100\).*max 100"):
        model(torch.tensor([[1, 100]]))
    with pytest.raises(ValueError, match="longer than the position table"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_config_validation():
    with pytest.raises(ValueError, match="multiple"):
        BertConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="attention"):
        BertConfig(attention="flash")


# ---------------------------------------------------------------- broken checkpoint folders


def test_broken_checkpoint_files_name_the_file(tmp_path, tiny_config):
    folder = tmp_path / "ckpt"
    save_hf_checkpoint(folder, tiny_config, BertModel(tiny_config).state_dict())
    good = (folder / "config.json").read_text()
    (folder / "config.json").write_text(good[:-5])
    with pytest.raises(ModelError, match=r"ckpt/config.json: not valid JSON"):
        BertModel.from_pretrained(str(folder))
    (folder / "config.json").write_text("[]")
    with pytest.raises(ModelError, match=r"ckpt/config.json: expected a JSON object, got list"):
        BertModel.from_pretrained(str(folder))
    (folder / "config.json").write_text(good.replace('"hidden_size": 32', '"hidden_size": "32"'))
    with pytest.raises(ModelError, match=r"config.json: hidden_size must be int, got '32'"):
        BertModel.from_pretrained(str(folder))
    wider = json.loads(good) | {"intermediate_size": 2 * tiny_config.intermediate_size}
    (folder / "config.json").write_text(json.dumps(wider))  # weights of another model size
    with pytest.raises(ModelError, match=r"ckpt: tensor .*intermediate.* the checkpoint does not"):
        BertModel.from_pretrained(str(folder))
    (folder / "config.json").write_text(good)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    with pytest.raises(ModelError, match=r"model.safetensors: cannot read the weights"):
        BertModel.from_pretrained(str(folder))


def test_a_checkpoint_with_fewer_layers_than_its_config_is_refused(tmp_path, tiny_config):
    state = {k: v for k, v in BertModel(tiny_config).state_dict().items() if "layers.1." not in k}
    save_hf_checkpoint(tmp_path / "ckpt", tiny_config, state)
    with pytest.raises(ModelError, match=r"lack \d+ of the model's tensors, e.g. bert_layers.1"):
        BertModel.from_pretrained(str(tmp_path / "ckpt"))


def test_owner_slash_name_is_a_hub_name_not_a_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="could not get 'google-bert/bert-base-uncased'"):
        BertModel.from_pretrained("google-bert/bert-base-uncased")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        BertModel.from_pretrained("./some/local/folder")


def test_a_hub_model_with_pytorch_weights_only_is_fetched_with_its_casing(
    tmp_path, tiny_config, monkeypatch
):
    """The hub is stood in for by a folder: snapshot_download copies what its patterns
    allow. A repository without model.safetensors gets a second call for the .bin."""
    import huggingface_hub

    repo = tmp_path / "repo"
    torch.manual_seed(0)
    state = BertModel(tiny_config).state_dict()
    save_hf_checkpoint(repo, tiny_config, state, "bin")
    (repo / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    (repo / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    (repo / "flax_model.msgpack").write_text("never wanted")
    asked = []

    def snapshot_download(repo_id, allow_patterns):
        asked.append(list(allow_patterns))
        local = tmp_path / f"cache{len(asked)}"
        local.mkdir()
        for f in repo.iterdir():
            if f.name in allow_patterns:
                (local / f.name).write_bytes(f.read_bytes())
        return str(local)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    folder = resolve_model_dir("someone/old-bert")
    assert [a[-1] for a in asked] == ["model.safetensors", "pytorch_model.bin"]
    assert "tokenizer_config.json" in asked[0] and not (folder / "flax_model.msgpack").exists()
    model = BertModel.from_pretrained("someone/old-bert")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    from tokenizer import BertTokenizer

    assert BertTokenizer.from_pretrained("someone/old-bert").do_lower_case is False
    (repo / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors or pytorch_model.bin"):
        resolve_model_dir("someone/empty-bert")


def test_a_folder_without_a_checkpoints_files_names_them_in_one_line(tmp_path, tiny_config):

    folder = tmp_path / "half"
    save_hf_checkpoint(folder, tiny_config, BertModel(tiny_config).state_dict())
    (folder / "model.safetensors").unlink()  # and no vocab.txt was ever written
    with pytest.raises(SystemExit, match=r"has no vocab.txt and no model.safetensors or pytorch"):
        command.main(
            ["--bert", str(folder), "--preset", "thesis", "--run_dir", str(tmp_path / "r")]
        )
    assert not (tmp_path / "r").exists()


def test_bert_imports_torch_and_its_own_configuration_only():
    """In a fresh interpreter, `import bert` loads base_bert of the project and nothing else
    (no data reader, no checkpoint code, no optimizer, no engine)."""
    ours = {p.stem for p in REPO.glob("*.py")} | {"engine", "commands", "lab"}
    code = "import sys, bert; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in done.stdout.split()}
    assert loaded & ours == {"bert", "base_bert"}


class ScaledAttention(BertSelfAttention):
    """A student's edit: attention at a learned temperature, a weight BERT does not have."""

    def __init__(self, config):
        super().__init__(config)
        self.temperature = torch.nn.Parameter(torch.tensor(2.0))

    def attention(self, key, query, value, attention_mask):
        return super().attention(key, query / self.temperature, value, attention_mask)


def test_an_edited_attention_runs_on_every_device_and_the_plain_one_may_be_fused(
    tiny_config, monkeypatch
):
    """check_attention probes bert.py's attention against torch's SDPA: the plain one
    agrees (SDPA may run on a GPU), an edited one does not, so 'auto' never replaces it;
    the run's line says which runs."""
    plain = BertModel(BertConfig(**{**tiny_config.to_dict(), "attention": "auto"}))
    assert runtime.check_attention(plain) < 1e-12
    assert all(m.sdpa_checked for m in plain.modules() if isinstance(m, BertSelfAttention))
    cuda = torch.device("cuda", 0)
    assert runtime.attention_line(plain, cuda).startswith("attention: torch's fused SDPA")
    monkeypatch.setattr(bert, "BertSelfAttention", ScaledAttention)
    edited = bert.BertModel(BertConfig(**{**tiny_config.to_dict(), "attention": "auto"}))
    assert runtime.check_attention(edited) > 0.01
    assert not any(m.sdpa_checked for m in edited.modules() if isinstance(m, ScaledAttention))
    line = runtime.attention_line(edited, cuda)
    assert line.startswith("attention: bert.py's BertSelfAttention.attention, on every device")


def test_a_model_with_new_weights_loads_the_checkpoint_and_names_them(
    tmp_path, tiny_config, monkeypatch, capsys
):
    """from_pretrained fills BERT's weights from the checkpoint, keeps a weight bert.py adds
    at its initialisation and names it in one line; a BERT weight missing still stops."""
    torch.manual_seed(0)
    src = BertModel(tiny_config)
    save_hf_checkpoint(tmp_path / "ckpt", tiny_config, src.state_dict())
    monkeypatch.setattr(bert, "BertSelfAttention", ScaledAttention)
    loaded = bert.BertModel.from_pretrained(str(tmp_path / "ckpt"))
    new = [f"bert_layers.{i}.self_attention.temperature" for i in range(2)]
    assert capsys.readouterr().out == (
        f"new weights, initialised (not in ckpt): {', '.join(new)}\n"
    )
    for name, tensor in src.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert all(loaded.state_dict()[n] == 2.0 for n in new)
    state = {k: v for k, v in src.state_dict().items() if "layers.1.out_dense" not in k}
    save_hf_checkpoint(tmp_path / "partial", tiny_config, state)
    with pytest.raises(ModelError, match="lack 2 of the model's tensors"):
        bert.BertModel.from_pretrained(str(tmp_path / "partial"))
