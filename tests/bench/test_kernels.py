"""The GPU bench script's CPU path: same pipeline on tiny shapes, so the GPU run has no untested code paths."""

from __future__ import annotations

import re

import pytest

from bench import kernels as bench


def table_rows(output: str) -> list[list[str]]:
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_cpu_smoke_prints_a_table_with_triton_timed_and_correct(capsys):
    assert bench.main(["--cpu-smoke", "--skip-tests"]) == 0
    output = capsys.readouterr().out
    rows = table_rows(output)
    assert rows[0][:2] == ["shape", "triton ms"]
    body = rows[2:]
    assert [row[0].split()[0] for row in body] == ["decode", "prefill"]
    for row in body:
        triton_ms, reference_ms, contiguous_ms = (float(cell) for cell in row[1:4])
        assert min(triton_ms, reference_ms, contiguous_ms) > 0
        assert float(row[-1]) < 1e-4  # Triton ran (interpreted) and agrees with the reference on the bench's data
    assert re.search(r"copy bandwidth: \d+ GB/s", output)
    assert output.rstrip().splitlines()[-1].startswith("| ")  # the table is printed last


@pytest.mark.slow
def test_cpu_smoke_runs_the_kernel_tests(capsys, monkeypatch):
    # The bench's pytest run, on one kernel's tests: the suite runs them all itself (tests/kernels).
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k rms_norm")
    assert bench.main(["--cpu-smoke"]) == 0
    output = capsys.readouterr().out
    assert re.search(r"kernel tests \(CPU interpreter\): [1-9]\d* passed, \d+ deselected", output)
    assert "failed" not in output
