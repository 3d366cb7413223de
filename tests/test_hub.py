"""lab/export.py's model card read by huggingface_hub's own parser, checked against what
sentence-transformers makes of the folder, and --push_to_hub against a stand-in Hub on
127.0.0.1 (never the network)."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelCard
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

import datasets as data
from commands import command
from engine import runtime
from evaluation import MULTITASK
from helpers import run
from lab import export
from tokenizer import BertTokenizer


class StandInHub(BaseHTTPRequestHandler):
    """The calls an upload of small files makes: create the repo, validate the card's
    metadata, ask how each file goes up (all 'regular': inline in the commit), commit."""

    repos, files, cards = {}, {}, []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != "Bearer hf_standin":
            return self.send_error(401, "a token is needed")
        if self.path == "/api/repos/create":
            request = json.loads(body)
            self.repos[f"{request['organization']}/{request['name']}"] = request
            return self.reply({"url": f"{self.here()}/{request['organization']}/{request['name']}"})
        if self.path == "/api/validate-yaml":  # the Hub checks the card's metadata first
            self.cards.append(json.loads(body)["content"])
            return self.reply({"warnings": [], "errors": []})
        if "/preupload/" in self.path:
            paths = [f["path"] for f in json.loads(body)["files"]]
            files = [{"path": p, "uploadMode": "regular", "shouldIgnore": False} for p in paths]
            return self.reply({"files": files})
        if "/commit/" in self.path:
            for line in body.decode().splitlines():
                entry = json.loads(line)
                if entry["key"] == "file":
                    value = entry["value"]
                    self.files[value["path"]] = base64.b64decode(value["content"])
            repo = self.path.removeprefix("/api/models/").partition("/commit/")[0]
            oid = "1" * 40
            return self.reply({"commitUrl": f"{self.here()}/{repo}/commit/{oid}", "commitOid": oid})
        self.send_error(404, f"the stand-in Hub has no {self.path}")

    def here(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def reply(self, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    StandInHub.url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", StandInHub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    StandInHub.repos.clear()
    StandInHub.files.clear()
    StandInHub.cards.clear()
    yield StandInHub
    server.shutdown()


def test_the_card_gives_the_hub_the_kept_models_dev_scores(tiny_env, tmp_path):
    """The scores are on the CS224n handout's own dev files (here 12 of each file's 16
    rows: --dev_size 12), so no result names a Hub data set, its config or its split."""
    run(tiny_env, tmp_path / "run", "--loops", "0", "--dev_size", "12")
    export.main([str(tmp_path / "run")])
    card = ModelCard.load(tmp_path / "run" / "export" / "README.md")
    kept = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    results = {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("cs224n:ids-sst-dev.csv", "accuracy"): round(kept["sst"]["accuracy"], 4),
        ("cs224n:quora-dev.csv", "accuracy"): round(kept["para"]["accuracy"], 4),
        ("cs224n:sts-dev.csv", "pearsonr"): round(kept["sts"]["pearson"], 4),
        ("cs224n:sts-dev.csv", "spearmanr"): round(kept["sts"]["spearman"], 4),
    }
    for result in card.data.eval_results:
        with pytest.raises(HFValidationError):  # a name no Hub data set can have
            validate_repo_id(result.dataset_type)
        assert result.dataset_config is None and result.dataset_split == "dev"
        assert (
            result.dataset_name.startswith("CS224n ") and "(12 of 16 rows)" in result.dataset_name
        )
    for task in MULTITASK:  # the prose counts each file's rows as the project reads them
        path = data.task_file(tiny_env[1], task, "dev")
        rows = len(path.read_text().splitlines()) - 1  # less the header
        assert f"{path.name}: 12 of {rows} rows" in card.text
    assert card.data.license == "apache-2.0"
    assert card.data.datasets is None  # the handout's files are no Hub data set
    assert card.data.base_model is None  # trained from a local folder: no Hub id to name


@pytest.mark.parametrize("source", ["snli", "sst"])
def test_the_card_names_snli_only_where_the_kept_model_trained_on_it(tiny_env, tmp_path, source):
    flags = ("--preset", "unsup-simcse", "--simcse_epochs", "1", "--simcse_data", source)
    rows = run(tiny_env, tmp_path / "run", *flags, "--individual_epochs", "1")
    assert rows[0]["kind"] == "contrastive"
    export.main([str(tmp_path / "run")])
    card = ModelCard.load(tmp_path / "run" / "export" / "README.md")
    _, _, info = command.kept_model(tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    assert info["row"]["index"] >= 0  # the kept model went through SimCSE
    assert card.data.datasets == (["stanfordnlp/snli"] if source == "snli" else None)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_card_names_sentence_transformers_only_where_it_gives_our_embeddings(
    tiny_env, tmp_path, pooling
):
    """SentenceTransformer(folder) mean-pools a folder without its modules.json, silently
    but for a log line: the card may name that library only where it gives our sentence
    embeddings. transformers' BertModel gives --pooling cls's (its pooler_output)."""
    import transformers
    from sentence_transformers import SentenceTransformer

    run(tiny_env, tmp_path / "run", "--loops", "0", "--pooling", pooling)
    out = export.main([str(tmp_path / "run")])
    card = ModelCard.load(out / "README.md").data
    _, model, _ = command.kept_model(tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    sentences = ["a good film", "the dull one , awful !", "great"]
    tokenizer = BertTokenizer.from_pretrained(str(out))
    examples = [data.SentenceExample(str(i), s, None) for i, s in enumerate(sentences)]
    batch = data.SentenceDataset(examples, tokenizer, 64).collate([0, 1, 2])
    with torch.no_grad():
        ours = model.sentences(batch)  # (3, H)
        hf = transformers.BertModel.from_pretrained(str(out)).eval()
        pooled = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    theirs = SentenceTransformer(str(out), device="cpu").encode(sentences, convert_to_tensor=True)
    same = torch.allclose(theirs, ours, atol=1e-5, rtol=0)
    named = card.library_name == "sentence-transformers" or "sentence-transformers" in card.tags
    assert named == same == (pooling == "mean") == (out / "modules.json").is_file()
    assert card.pipeline_tag == ("sentence-similarity" if same else "feature-extraction")
    if pooling == "cls":
        assert card.library_name == "transformers"
        torch.testing.assert_close(pooled.pooler_output, ours, atol=1e-5, rtol=0)


def test_push_to_hub_uploads_the_export_to_a_private_repository(tiny_env, tmp_path, hub, capsys):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    export.main([str(tmp_path / "run"), "--push_to_hub", "me/minbert"])
    made = hub.repos["me/minbert"]  # private: older huggingface_hub says it another way
    assert made.get("visibility") == "private" or made.get("private") is True
    out = tmp_path / "run" / "export"
    sent = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert hub.files == sent and hub.cards == [sent["README.md"].decode()]
    assert f"uploaded: {hub.url}/me/minbert/commit/{'1' * 40}" in capsys.readouterr().out


def test_push_to_hub_without_a_token_is_one_line(tiny_env, tmp_path, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-login"))  # no token saved by a login
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    run(tiny_env, tmp_path / "run", "--loops", "0")
    with pytest.raises(SystemExit, match="no Hugging Face token"):
        export.main([str(tmp_path / "run"), "--push_to_hub", "me/minbert"])
