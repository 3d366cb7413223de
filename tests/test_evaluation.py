"""evaluation.py: metrics against sklearn/scipy/numpy, the evaluation loop on a fake model
with known outputs, and prediction files."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score

import evaluation as E
from commands import outputs
from helpers import RecordedBar

TOL = 1e-12


# ---------------------------------------------------------------------------------------
# Metrics


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    n, classes = int(rng.integers(5, 200)), int(rng.integers(2, 6))
    y_true = rng.integers(0, classes, n)
    y_pred = np.where(rng.random(n) < 0.6, y_true, rng.integers(0, classes, n))
    assert abs(E.accuracy(y_true, y_pred) - accuracy_score(y_true, y_pred)) < TOL
    for average, ours in (("macro", E.macro_f1), ("weighted", E.weighted_f1)):
        ref = f1_score(y_true, y_pred, average=average, zero_division=0)
        assert abs(ours(y_true, y_pred) - ref) < TOL, average


def test_f1_with_classes_missing_on_one_side():
    # Class 4 is never predicted; class 3 is predicted but never true.
    y_true = np.array([0, 0, 1, 2, 4, 4, 4])
    y_pred = np.array([0, 1, 1, 2, 3, 0, 3])
    for average, ours in (("macro", E.macro_f1), ("weighted", E.weighted_f1)):
        ref = f1_score(y_true, y_pred, average=average, zero_division=0)
        assert abs(ours(y_true, y_pred) - ref) < TOL, average
    # By hand: F1 per class 0..4 = 1/2, 2/3, 1, 0, 0; macro = (1/2 + 2/3 + 1) / 5.
    assert abs(E.macro_f1(y_true, y_pred) - (13 / 6) / 5) < TOL


@pytest.mark.parametrize("seed", range(5))
def test_pearson_matches_scipy_and_numpy(seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 5, 300)
    y = 0.5 * x + rng.normal(0, 1, 300)
    assert abs(E.pearson_r(x, y) - pearsonr(x, y)[0]) < TOL
    assert abs(E.pearson_r(x, y) - np.corrcoef(x, y)[0, 1]) < TOL
    assert abs(E.pearson_r(x, -x) + 1) < TOL
    assert np.isnan(E.pearson_r(x, np.ones_like(x)))


@pytest.mark.parametrize("seed", range(5))
def test_spearman_with_ties_matches_scipy_and_a_loop(seed):
    """STS gold scores repeat (0.2 steps) and so may predictions: ties take mean ranks."""
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, 200) * 5) / 5  # many ties
    pred = np.round(gold + rng.normal(0, 1, 200), 1)

    def ranks_by_loop(v):  # rank of v[i]: 1 + how many are smaller + half of its other ties
        return [1 + sum(w < a for w in v) + (sum(w == a for w in v) - 1) / 2 for a in v]

    assert E.average_ranks(gold).tolist() == ranks_by_loop(gold.tolist())
    assert abs(E.spearman_rho(gold, pred) - spearmanr(gold, pred).statistic) < TOL
    assert abs(E.spearman_rho(gold, gold**3) - 1) < TOL  # any increasing map: 1


def test_sts_is_scored_by_pearson_and_spearman_and_the_table_shows_both():
    """A row saved before Spearman was scored shows a blank in its place."""
    rng = np.random.default_rng(0)
    gold, pred = rng.uniform(0, 5, 50), rng.uniform(0, 5, 50)
    metrics = E.regression_metrics(gold, pred)
    assert abs(metrics["spearman"] - spearmanr(gold, pred).statistic) < TOL
    assert abs(metrics["pearson"] - pearsonr(gold, pred).statistic) < TOL
    rows = [
        {"stage": "now", "sts": {"pearson": 0.81, "spearman": 0.79}},
        {"stage": "older", "sts": {"pearson": 0.8}},
    ]
    lines = outputs.format_table(rows, ("sts",)).splitlines()
    assert [line.split("|")[1].split() for line in (lines[0], lines[2], lines[3])] == [
        ["STS", "r", "rho"],
        ["0.810", "0.790"],
        ["0.800"],
    ]


def test_overall_score_by_hand():
    assert abs(E.overall_score(0.5, 0.8, 0.6) - 0.7) < TOL  # (0.5 + 0.8 + 0.8) / 3
    assert abs(E.overall_score(0.3, 0.6, -1.0) - 0.3) < TOL  # r = -1 counts as 0
    assert abs(E.overall_score(1.0, 1.0, 1.0) - 1.0) < TOL


# ---------------------------------------------------------------------------------------
# The evaluation loop


class FakeModel(torch.nn.Module):
    """predict() looks its raw outputs up by example id and records how it was called."""

    def __init__(self, outputs: dict[str, dict[str, list]]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.outputs = outputs
        self.calls = []

    def predict(self, task, batch):
        self.calls.append((task, self.training, torch.is_grad_enabled()))
        return torch.tensor([self.outputs[task][i] for i in batch["ids"]]) + 0 * self.weight


def batches(ids, labels=None, size=2, dtype=torch.long):
    """Hand-made batches (the last one short), as a collate function would return them."""
    out = []
    for s in range(0, len(ids), size):
        batch = {"input_ids": torch.ones(len(ids[s : s + size]), 3, dtype=torch.long)}
        batch["ids"] = ids[s : s + size]
        if labels is not None:
            batch["labels"] = torch.tensor(labels[s : s + size], dtype=dtype)
        out.append(batch)
    return out


SST_LOGITS = {"a": [0.1, 2.0, 0.0], "b": [3.0, 0.0, 1.0], "c": [0.0, 0.0, 5.0]}  # preds 1, 0, 2
PARA_LOGITS = {"p": 1.5, "q": -0.2, "r": 0.0}  # preds 1, 0, 0 (logit 0 is sigmoid 0.5 -> 0)
STS_SCORES = {"x": 4.5, "y": 1.0, "z": 2.5, "w": 0.5}
OUTPUTS = {"sst": SST_LOGITS, "para": PARA_LOGITS, "sts": STS_SCORES}


def loaders(labeled=True):
    sst = batches(list("abc"), [1, 2, 2] if labeled else None)
    para = batches(list("pqr"), [1.0, 0.0, 1.0] if labeled else None, dtype=torch.float)
    sts = batches(list("xyzw"), [5.0, 0.0, 3.0, 1.0] if labeled else None, dtype=torch.float)
    return {"sst": sst, "para": para, "sts": sts}


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_known_outputs(training):
    model = FakeModel(OUTPUTS).train(training)
    results = E.evaluate(model, loaders(), "cpu")
    assert model.training is training  # mode restored
    assert all(mode is False and grad is False for _, mode, grad in model.calls)
    assert [t for t, *_ in model.calls] == ["sst"] * 2 + ["para"] * 2 + ["sts"] * 2

    sst = results["sst"]
    assert sst.ids == ["a", "b", "c"] and sst.preds == [1, 0, 2]
    assert sst.metrics["accuracy"] == pytest.approx(accuracy_score([1, 2, 2], [1, 0, 2]), abs=TOL)
    ref = f1_score([1, 2, 2], [1, 0, 2], average="macro", zero_division=0)
    assert sst.metrics["macro_f1"] == pytest.approx(ref, abs=TOL)
    ref = f1_score([1, 2, 2], [1, 0, 2], average="weighted", zero_division=0)
    assert sst.metrics["weighted_f1"] == pytest.approx(ref, abs=TOL)

    para = results["para"]
    assert para.ids == ["p", "q", "r"] and para.preds == [1, 0, 0]
    assert para.metrics["accuracy"] == pytest.approx(2 / 3, abs=TOL)

    sts = results["sts"]
    assert sts.ids == ["x", "y", "z", "w"] and sts.preds == [4.5, 1.0, 2.5, 0.5]
    ref = pearsonr([5.0, 0.0, 3.0, 1.0], [4.5, 1.0, 2.5, 0.5])[0]
    assert sts.metrics["pearson"] == pytest.approx(ref, abs=1e-6)  # float32 model outputs

    expected = E.overall_score(2 / 3, 2 / 3, sts.metrics["pearson"])
    assert E.overall_from_results(results) == pytest.approx(expected, abs=TOL)


def test_scoring_shows_a_bar_per_task_once_it_is_slow(monkeypatch):
    monkeypatch.setattr(E, "tqdm", RecordedBar)
    RecordedBar.made = []
    E.evaluate(FakeModel(OUTPUTS), loaders(), "cpu")
    assert [b.kwargs["desc"] for b in RecordedBar.made] == [
        "scoring SST",
        "scoring QQP",
        "scoring STS",
    ]
    assert all(b.kwargs["delay"] > 0 for b in RecordedBar.made)  # none for a quick one


def test_evaluate_unlabeled_gives_predictions_only():
    results = E.evaluate(FakeModel(OUTPUTS), loaders(labeled=False), "cpu")
    assert {t: r.metrics for t, r in results.items()} == {"sst": {}, "para": {}, "sts": {}}
    assert results["sst"].preds == [1, 0, 2] and results["para"].preds == [1, 0, 0]
    with pytest.raises(ValueError, match="needs labeled results"):
        E.overall_from_results(results)


def test_evaluate_rejects_wrong_shapes_and_unknown_tasks():
    model = FakeModel({"para": {"p": [0.3], "q": [0.1]}})  # (B, 1) instead of (B,)
    with pytest.raises(ValueError, match=r"predict\('para'\) returned shape \(2, 1\).*\(B,\)"):
        E.evaluate(model, {"para": batches(["p", "q"])}, "cpu")
    assert model.training  # restored even after an error
    with pytest.raises(ValueError, match="no evaluation rule for task"):
        E.evaluate(model, {"snli": []}, "cpu")


# ---------------------------------------------------------------------------------------
# Prediction files


def test_prediction_files_round_trip(tmp_path):
    assert outputs.prediction_path("predictions", "sst", "dev").as_posix() == (
        "predictions/sst-dev-output.csv"
    )
    path = outputs.prediction_path(tmp_path / "predictions", "sts", "test")
    scores = torch.tensor([4.2, 0.1, 3.3333333]).tolist()  # float32 values, as evaluate gives
    outputs.write_predictions(path, "sts", ["x", "y", "z"], scores)
    assert path.read_text().splitlines()[:2] == [
        "id \t Predicted_Similiary ",
        "x , 4.199999809265137 ",
    ]
    assert outputs.read_predictions(path) == (["x", "y", "z"], scores)

    path = outputs.prediction_path(tmp_path, "sst", "dev")
    outputs.write_predictions(path, "sst", ["a1", "b2"], [3, 0])
    assert path.read_text() == "id \t Predicted_Sentiment \na1 , 3 \nb2 , 0 \n"
    ids, preds = outputs.read_predictions(path)
    assert ids == ["a1", "b2"] and preds == [3, 0] and all(isinstance(p, int) for p in preds)

    outputs.write_predictions(tmp_path / "para.csv", "para", ["q"], [1])
    assert (tmp_path / "para.csv").read_text().startswith("id \t Predicted_Is_Paraphrase \n")
    with pytest.raises(ValueError, match="2 ids but 1 predictions"):
        outputs.write_predictions(tmp_path / "x.csv", "sst", ["a", "b"], [1])
    (tmp_path / "bad.csv").write_text("id \t Predicted_Sentiment \na1 ; 3\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: .* has no ','"):
        outputs.read_predictions(tmp_path / "bad.csv")


def test_forgetting_measures_of_a_hand_made_table():
    def row(sst, para, sts, tasks):
        r = {"sst": {"accuracy": sst}, "para": {"accuracy": para}, "sts": {"pearson": sts}}
        return r | {"overall": E.overall_score(sst, para, sts), "tasks": tasks}

    rows = [
        row(0.2, 0.5, 0.8, []),  # the untouched model
        row(0.2, 0.7, 0.7, ["para"]),
        row(0.1, 0.6, 0.9, ["sts"]),
        row(0.4, 0.6, 0.6, ["sst"]),
    ]
    m = E.forgetting(rows, E.MULTITASK)
    # STS: best before each stage 0.8, 0.8, 0.9 minus 0.7, 0.9, 0.6 -> 0.1, (gain) 0, 0.3
    assert m["sts"]["mean_drop_below_best"] == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert m["sts"]["forgetting"] == pytest.approx(0.9 - 0.6)  # best before the end, less it
    assert m["sts"]["final_minus_start"] == pytest.approx(-0.2)
    assert m["sts"]["backward_transfer"] == pytest.approx(0.6 - 0.9)  # after its own stage
    # QQP: 0.5 -> 0.7 (gain), then 0.6 and 0.6 against the best 0.7
    assert m["para"]["mean_drop_below_best"] == pytest.approx((0.0 + 0.1 + 0.1) / 3)
    assert m["para"]["forgetting"] == pytest.approx(0.7 - 0.6)
    assert m["para"]["backward_transfer"] == pytest.approx(0.6 - 0.7)
    assert m["sst"]["backward_transfer"] is None  # only the last stage trained it
    overall = [r["overall"] for r in rows]
    drops = [max(0, max(overall[:k]) - overall[k]) for k in (1, 2, 3)]
    assert m["overall"]["mean_drop_below_best"] == pytest.approx(sum(drops) / 3)
    assert m["overall"]["backward_transfer"] == pytest.approx(  # Lopez-Paz: i < T only
        sum(overall[3] - overall[k] for k in (1, 2)) / 2
    )
    untrained = E.forgetting([rows[0], row(0.3, 0.5, 0.8, [])], E.MULTITASK)
    assert untrained["sst"]["backward_transfer"] is None
    table = outputs.format_forgetting(m).splitlines()
    assert [line.split("|")[0].strip() for line in table[1:]] == [
        "forgetting",
        "backward transfer",
        "final minus start",
        "mean drop below best",
    ]


@pytest.mark.parametrize(
    "sts, forgetting, mean_drop",
    [
        ([0.8, 0.5, 0.5, 0.5, 0.8], -0.3, 0.225),  # a dip the run recovers from: none
        ([0.8, 0.8, 0.8, 0.8, 0.5], 0.3, 0.075),  # a loss at the end: all of it forgotten
        ([0.84, 0.80, 0.60, 0.70], 0.10, (0.04 + 0.24 + 0.14) / 3),  # not 0.14: the start's
    ],
)
def test_forgetting_at_the_end_is_not_the_mean_drop(sts, forgetting, mean_drop):
    """Chaudhry et al.'s forgetting (the best trained model before the last stage, less the
    last; the untouched model is not among them) and the run's mean drop below its best
    (the untouched model included) disagree either way on these STS sequences."""
    rows = [{"sts": {"pearson": s}, "tasks": ["sts"] if k else []} for k, s in enumerate(sts)]
    m = E.forgetting(rows, ("sts",))["sts"]
    assert m["forgetting"] == pytest.approx(forgetting)
    assert m["mean_drop_below_best"] == pytest.approx(mean_drop)
    assert m["final_minus_start"] == pytest.approx(sts[-1] - sts[0])
    one_stage = E.forgetting(rows[:2], ("sts",))["sts"]  # nothing trained before the last
    assert one_stage["forgetting"] is None and one_stage["backward_transfer"] is None


def test_best_threshold_matches_a_scan_of_every_cut():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        scores = np.round(rng.normal(size=n), 1)  # ties included
        labels = rng.integers(0, 2, size=n)
        t = E.best_threshold(scores, labels)
        cuts = np.concatenate([[scores.min() - 1], scores])  # every split of the sorted scores
        best = max(np.mean((scores > c) == labels) for c in cuts)
        assert np.mean((scores > t) == labels) == pytest.approx(best)
    assert E.best_threshold(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 0.5


def test_roc_auc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    for n in (2, 9, 200):
        scores = np.round(rng.normal(size=n), 1)  # many ties
        labels = np.arange(n) % 2
        assert E.roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    assert math.isnan(E.roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_halves_of_dev_split_every_task_by_id_and_score_each_half():
    rng = np.random.default_rng(3)
    ids = [f"id{i}" for i in range(200)]
    labels, preds = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    scores, gold = rng.normal(size=200), rng.normal(size=200)
    results = {
        "sst": E.TaskResult({}, ids, preds.tolist(), labels.tolist()),
        "sts": E.TaskResult({}, ids, scores.tolist(), gold.tolist()),
    }
    halves = [E.half_of(results, k) for k in (0, 1)]
    for task in results:
        a, b = (set(h[task].ids) for h in halves)
        assert not a & b and a | b == set(ids) and 70 < len(a) < 130  # a split, near even
    for h in halves:
        keep = [ids.index(i) for i in h["sst"].ids]
        assert h["sst"].metrics["accuracy"] == pytest.approx(np.mean(preds[keep] == labels[keep]))
        r = np.corrcoef(scores[keep], gold[keep])[0, 1]
        assert h["sts"].metrics["pearson"] == pytest.approx(r)
    assert E.half_of(results, 0)["sst"].ids == halves[0]["sst"].ids  # the same every time


def test_selection_gap_chooses_on_one_half_and_scores_the_other():
    def row(a, b):  # overall on each half
        return {"overall": (a + b) / 2, "halves": [{"overall": a}, {"overall": b}]}

    rows = [row(0.5, 0.5), row(0.70, 0.60), row(0.65, 0.72), row(0.60, 0.66)]
    gap = outputs.selection_gap(rows)
    # half 0 picks stage 1 (0.70): half 1 scores it 0.60, its own best is 0.72;
    # half 1 picks stage 2 (0.72): half 0 scores it 0.65, its own best is 0.70
    assert gap["held"] == pytest.approx((0.60 + 0.65) / 2)
    assert gap["chosen"] == pytest.approx((0.72 + 0.70) / 2)
    assert gap["gap"] == pytest.approx((0.72 + 0.70 - 0.60 - 0.65) / 2)


def test_nan_in_is_nan_out_wherever_it_sits():
    """One rule: a metric or a measure of scores holding a NaN is NaN. scipy agrees on
    Spearman; sklearn refuses NaN scores outright; before the rule, ranks put NaN last and
    Python's max kept or dropped it by its position."""
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    x, y = np.array([1.0, 2.0, np.nan, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    assert np.isnan(E.spearman_rho(x, y)) and np.isnan(spearmanr(x, y).statistic)
    with pytest.raises(ValueError):
        roc_auc_score([0, 1, 1], [0.1, np.nan, 0.3])
    assert np.isnan(E.roc_auc(np.array([0.1, np.nan, 0.3]), np.array([0, 1, 1])))

    def rows(sts):
        return [{"stage": str(k), "sts": {"pearson": v}} for k, v in enumerate(sts)]

    for sts in ([0.8, np.nan, 0.7, 0.6], [0.8, 0.7, np.nan, 0.6]):  # the NaN early or late
        measures = E.forgetting(rows(sts), ["sts"])["sts"]
        assert np.isnan(measures["forgetting"]) and np.isnan(measures["mean_drop_below_best"])
    halves = [
        {"halves": [{"sst": {"accuracy": a}}, {"sst": {"accuracy": b}}], "sst": {}}
        for a, b in ((0.2, 0.2), (0.5, np.nan), (0.4, 0.3))
    ]
    gap = outputs.selection_gap(halves)
    assert np.isnan(gap["chosen"]) and np.isnan(gap["gap"])


def test_pair_scores_sort_by_length_and_return_each_pair_in_its_place(tiny_env):
    """Batches are cut from the pairs sorted longest first; each pair's score and label
    still sit at its own index, equal to the pair scored alone (in float64; pair_scores
    returns float32), for any n and batch size."""
    from engine.runtime import Runtime
    from helpers import embeddings, tiny_model_and_data

    model, task_data = tiny_model_and_data(tiny_env)
    model.double().eval()
    pairs, rt = task_data["para"].train, Runtime(torch.device("cpu"), None, None)
    assert len(set(pairs.lengths)) > 1  # the order matters here
    with torch.no_grad():
        alone = [E.cosine(*embeddings(model, pairs.collate([i]))).item() for i in range(len(pairs))]
    labels_of = [int(pairs.collate([i])["labels"]) for i in range(len(pairs))]
    collate, cut = pairs.collate, []
    pairs.collate = lambda rows: cut.append(list(rows)) or collate(rows)
    for n, size in ((None, 5), (7, 3), (len(pairs) + 4, 64)):
        cut.clear()
        scores, labels = E.pair_scores(model, pairs, rt, size, n)
        count = min(n or len(pairs), len(pairs))
        np.testing.assert_allclose(scores, alone[:count], rtol=0, atol=1e-6)  # z.float()
        assert labels.tolist() == labels_of[:count]
        seen = [pairs.lengths[i] for rows in cut for i in rows]
        assert seen == sorted(seen, reverse=True) and len(seen) == count
        assert [len(rows) for rows in cut[:-1]] == [size] * (len(cut) - 1)
