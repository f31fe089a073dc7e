"""The prepared GPU run's CPU path: every section on tiny shapes, so the GPU run has no untested code."""

from __future__ import annotations

import json

import pytest

from bench import gpu_suite


@pytest.mark.slow
def test_cpu_smoke_runs_every_section_and_the_oracle_holds(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_suite.main(["--out", str(out), "--cpu-smoke", "--skip-kernel-tests"]) == 0
    results = json.loads(out.read_text())
    sections = results["sections"]
    assert set(sections) == {"kernels", "oracle", "throughput_2048", "host"}
    assert all(s["ok"] for s in sections.values())
    assert results["machine"]["device"].startswith("cpu")
    for row in sections["kernels"]["attention"]:  # Triton (interpreted) agrees with the reference
        assert row["max_error"] < 1e-4 and row["triton_ms"] > 0
    tiny = sections["oracle"]["tiny"]
    for key in ("float32_vs_hf", "beam_float32_vs_hf"):
        assert tiny[key]["identical"] == tiny[key]["sequences"] == 3, key
        assert tiny[key]["first_difference"] == [None] * 3
    assert 0 <= tiny["bfloat16_vs_float32"]["position_agreement"] <= 1
    run = sections["throughput_2048"]
    assert run["kv_budget_tokens"] == 2048 and run["sized_by"] == "fixed"
    for engine in ("ours", "hf_static"):  # both generated the whole workload in the same KV slots
        assert run[engine]["output_tokens"] == run["workload"]["output_tokens"]
        assert run[engine]["kv_budget_tokens"] == 2048
    assert run["ratio_output_tokens_per_s"] == pytest.approx(
        run["ours"]["output_tokens_per_s"] / run["hf_static"]["output_tokens_per_s"])
    host = sections["host"]  # 8 prompts prefilled in one step, then 63 decode steps
    assert host["sequences"] == 8 and host["steps"] == 64
    assert host["step_ms"] == pytest.approx(sum(host["ms_per_step"].values())) and host["step_ms"] > 0
    printed = capsys.readouterr().out
    assert "ours / HF static" in printed and "host: " in printed


def test_a_failing_section_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("device lost")

    monkeypatch.setattr(gpu_suite, "oracle_section", broken)
    out = tmp_path / "gpu.json"
    assert gpu_suite.main(["--out", str(out), "--cpu-smoke", "--skip-kernel-tests",
                           "--sections", "oracle,kernels"]) == 1
    sections = json.loads(out.read_text())["sections"]
    assert not sections["oracle"]["ok"] and "RuntimeError: device lost" in sections["oracle"]["error"]
    assert sections["kernels"]["ok"] and sections["kernels"]["attention"]


def test_agreement_counts_identical_sequences_positions_and_first_differences():
    figures = gpu_suite.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])
    assert figures == {"identical": 1, "sequences": 2, "position_agreement": 5 / 6, "first_difference": [None, 1]}
