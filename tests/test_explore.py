"""lab/explore.py: a run's attention, the untouched model beside the kept one; its report page;
label, the kept model's labels for lines of text."""

import io
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
from matplotlib.image import imread
from scipy.stats import spearmanr

import datasets as data
from commands import command, flags, outputs
from commands.cli import run_cli
from datasets import read_task
from helpers import run, tiny_model_and_data
from lab import explore


def test_the_attention_picture_of_a_pair_untouched_beside_kept(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run")
    _, tokenizer, models = explore.load(tmp_path / "run")
    maps = {}
    for name, model in models.items():
        texts = ("a fine film", "a good one")
        tokens, maps[name] = explore.attention_maps(model.bert, tokenizer, *texts)
    n = len(tokens)
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    cfg = models["kept"].bert.config
    assert maps["kept"].shape == (cfg.num_hidden_layers, cfg.num_attention_heads, n, n)
    for probs in maps.values():  # every row a distribution over the sequence
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    assert (maps["kept"] - maps["untouched"]).abs().max() > 1e-4  # training moved them

    out = explore.main(["attention", str(tmp_path / "run"), "a fine film", "--pair", "a good one"])
    assert out == tmp_path / "run" / f"attention-layer{cfg.num_hidden_layers}.png"
    pixels = imread(out)[..., :3]  # (height, width, RGB) in [0, 1]
    assert pixels.std() > 0.05  # heatmaps and labels drawn, not a blank page


def test_explore_says_what_it_needs(tiny_env, tmp_path, capsys):
    with pytest.raises(SystemExit, match="no config.json there; is it a run folder"):
        explore.main(["report", str(tmp_path)])
    cfg, _ = command.parse_args(["--preset", "individual"])  # a model per task
    (tmp_path / "config.json").write_text(json.dumps(flags.to_dict(cfg)))
    with pytest.raises(SystemExit, match="--preset individual keeps a model per task; this ne"):
        explore.main(["report", str(tmp_path)])
    cfg, _ = command.parse_args(["--preset", "thesis"])
    (tmp_path / "config.json").write_text(json.dumps(flags.to_dict(cfg)))
    with pytest.raises(SystemExit):
        explore.main(["report", str(tmp_path)])
    assert "no best.safetensors there" in capsys.readouterr().err
    run(tiny_env, tmp_path / "run")
    with pytest.raises(SystemExit):
        explore.main(["attention", str(tmp_path / "run"), "a sentence", "--layer", "9"])
    assert "--layer 9: this model has layers 1 to" in capsys.readouterr().err


def test_the_report_page_of_a_run(tiny_env, tmp_path):
    """One self-contained file: the stage figure and table, SST's confusion counted as a
    loop counts it, STS's Spearman as scipy's, the worst errors as text."""
    run_dir = tmp_path / "run"
    run(tiny_env, run_dir)
    out = explore.main(["report", str(run_dir)])
    page = out.read_text()
    assert out == run_dir / "report.html"
    assert not re.findall(r'(?:src|href)="(?!data:)', page)  # nothing fetched from anywhere
    assert page.count('<img alt="" src="data:image/png;base64,') == 4
    assert "loop 1: SST" in page and "start (no training)" in page

    def dev(task):
        ids, preds = outputs.read_predictions(run_dir / "predictions" / f"{task}-dev-output.csv")
        gold = {e.id: e.label for e in read_task(tiny_env[1], task, "dev")}
        return [gold[i] for i in ids], preds

    gold, pred = dev("sst")
    counts = np.zeros((5, 5), dtype=int)
    for g, p in zip(gold, pred, strict=True):
        counts[g][p] += 1
    cells = [int(n) for n in re.findall(r"<td[^>]*>(\d+)</td>", page)[:25]]
    assert cells == counts.flatten().tolist() and sum(cells) == len(gold)
    gold, pred = dev("sts")
    assert f"Spearman {spearmanr(gold, pred).statistic:.3f}" in page
    assert page.count("<li>gold ") == 2 * min(explore.WORST, len(gold))


def test_a_small_runs_report_maps_the_dev_sample_it_scored(tiny_env, tmp_path):
    """A run scored on --dev_size examples draws its QQP outputs and SST map on those very
    examples (the ids of its dev predictions), not on the whole dev set (16 pairs here)."""
    for name, args, n in (("small", ["--dev_size", "6"], 6), ("whole", [], 16)):
        run(tiny_env, tmp_path / name, "--loops", "0", *args)
        page = explore.main(["report", str(tmp_path / name)]).read_text()
        assert f"QQP: the kept model's output on {n} dev pairs" in page
        dev = explore.dev_examples(command.load_run_config(tmp_path / name))
        for task in ("sst", "para", "sts"):
            predictions = outputs.prediction_path(tmp_path / name / "predictions", task, "dev")
            ids, _ = outputs.read_predictions(predictions)
            assert sorted(e.id for e in dev[task]) == sorted(ids), (name, task)


def test_pca_2d_is_sklearns_up_to_sign():
    from sklearn.decomposition import PCA

    z = np.random.default_rng(0).normal(size=(50, 8)) * np.arange(1, 9)  # (N, H)
    ours, ref = explore.pca_2d(z), PCA(n_components=2).fit_transform(z)
    for k in range(2):
        sign = np.sign(ours[:, k] @ ref[:, k])
        np.testing.assert_allclose(sign * ours[:, k], ref[:, k], atol=1e-9)


@pytest.mark.parametrize("task", ["sst", "para"])
def test_outputs_follow_the_ids_whatever_the_batching(tiny_env, task):
    """Scoring batches come bucketed by length: each row must still be its id's, its output
    model.predict's and its embedding the first sentence's (a siamese pair has two)."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.eval()
    dataset = task_data[task].dev
    got = explore.outputs(model, task, dataset)
    for k in (0, 5, len(dataset) - 1):
        i = list(dataset.ids).index(got["ids"][k])
        with torch.no_grad():
            one = model.predict(task, dataset.collate([i]))[0]
            z = model.sentences(dataset.collate([i]))[0]  # (H,): the first sentence
        torch.testing.assert_close(torch.as_tensor(got["out"][k]), one, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.from_numpy(got["z"][k]), z, atol=1e-5, rtol=0)


def chromium():
    """Debian's chromium driven by its chromedriver, headless; skips where they are absent,
    unless MINBERT_BROWSER_REQUIRED is set (.ci/run sets it: there the test must run)."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        missing = "needs Debian's chromium and chromium-driver (apt-get install them)"
        if os.environ.get("MINBERT_BROWSER_REQUIRED"):
            pytest.fail(f"MINBERT_BROWSER_REQUIRED: {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    flags = "--headless=new --no-sandbox --disable-gpu --window-size=1000,3000 --no-first-run"
    offline = "--disable-background-networking --disable-component-update --disable-sync"
    # offline: no calls home, which a closed network refuses
    for flag in f"{flags} {offline}".split():
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def redraws(browser) -> bool:
    """Whether picking the first layer and the second head redraws the kept model's heatmap."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    script = 'return document.getElementById("kept").toDataURL()'
    before = browser.execute_script(script)
    Select(browser.find_element(By.ID, "layer")).select_by_index(0)  # the first, not the last
    Select(browser.find_element(By.ID, "head")).select_by_index(1)
    return browser.execute_script(script) != before


def test_the_report_works_in_a_real_browser(tiny_env, tmp_path):
    """No console errors; another layer and head redraw the kept model's heatmap; the page
    is not blank; the same inside the frame a notebook shows it in."""
    from selenium.webdriver.common.by import By

    run_dir = tmp_path / "run"
    run(tiny_env, run_dir)
    page = explore.main(["report", str(run_dir)])
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!doctype html><p>a notebook's cell</p>{explore.inline(page)}")
    browser = chromium()
    try:
        browser.get(page.as_uri())
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert redraws(browser)
        shot = imread(io.BytesIO(browser.get_screenshot_as_png()))[..., :3]
        assert shot.std() > 0.05
        browser.get(notebook.as_uri())
        browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
        assert "loop 1: SST" in browser.find_element(By.TAG_NAME, "body").text
        assert redraws(browser)
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.quit()


def test_input_lines_prompt_only_a_terminal(capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert list(explore.input_lines(io.StringIO("a\nb\tc\n"))) == ["a\n", "b\tc\n"]
    assert capsys.readouterr().err == ""  # a pipe or a file: no prompt in the way
    assert list(explore.input_lines(Terminal("a\n"))) == ["a\n"]
    assert "two separated by a tab; Ctrl-D ends" in capsys.readouterr().err


def test_label_gives_a_sentiment_or_a_pair_score_per_line(tiny_env, tmp_path, monkeypatch, capsys):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("good movie\nthe cat\tthe dog\n\n"))
    explore.main(["label", str(tmp_path / "run")])  # prints each line's labels as it goes
    lines = capsys.readouterr().out.splitlines()[-2:]
    assert re.fullmatch(r"sentiment [0-4] \(p 0\.\d\d\)\tgood movie", lines[0])
    assert re.fullmatch(r"paraphrase 0\.\d{3}\tsimilarity [0-5]\.\d\d\tthe cat\tthe dog", lines[1])
    for text, message in [
        ("ok\nid\tsentence\tsentiment\n", "3 tab-separated fields"),  # a csv's header row
        ("ok\n\tthe dog\n", "an empty side of the tab"),
        ("ok\nthe cat\t \n", "an empty side of the tab"),
    ]:
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
        with pytest.raises(data.DataError, match=rf"^input line 2: {message}; expected a sent"):
            explore.main(["label", str(tmp_path / "run")])


def test_label_input_that_is_not_utf8_or_a_reader_that_stops_is_quiet(
    tiny_env, tmp_path, monkeypatch
):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    strict = io.TextIOWrapper(io.BytesIO(b"caf\xe9\n"), encoding="utf-8")  # Latin-1 bytes
    monkeypatch.setattr("sys.stdin", strict)
    with pytest.raises(SystemExit, match=r"^error: input after 0 good line\(s\): not UTF-8 text"):
        run_cli(explore.main, ["label", str(tmp_path / "run")])
    read, write = os.pipe()
    os.close(read)  # `| head` that has read enough
    monkeypatch.setattr("sys.stdin", io.StringIO("good movie\n"))
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(os.fdopen(write, "wb"), line_buffering=True))
    with pytest.raises(SystemExit) as stop:
        run_cli(explore.main, ["label", str(tmp_path / "run")])
    assert stop.value.code == 1
