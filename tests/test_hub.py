"""lab/export.py's model card read by huggingface_hub's own parser, and --push_to_hub against a
stand-in Hub on 127.0.0.1 (never the network)."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub
import pytest
from huggingface_hub import ModelCard

from helpers import run
from lab import export


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
    run(tiny_env, tmp_path / "run", "--loops", "0")
    export.main([str(tmp_path / "run")])
    card = ModelCard.load(tmp_path / "run" / "export" / "README.md")
    kept = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    results = {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("SetFit/sst5", "accuracy"): round(kept["sst"]["accuracy"], 4),
        ("nyu-mll/glue", "accuracy"): round(kept["para"]["accuracy"], 4),
        ("sentence-transformers/stsb", "pearsonr"): round(kept["sts"]["pearson"], 4),
        ("sentence-transformers/stsb", "spearmanr"): round(kept["sts"]["spearman"], 4),
    }
    assert card.data.license == "apache-2.0" and "SetFit/sst5" in card.data.datasets
    assert {r.dataset_config for r in card.data.eval_results} == {None, "qqp"}
    assert card.data.base_model is None  # trained from a local folder: no Hub id to name


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
