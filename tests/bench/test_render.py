"""BENCHMARKS.md and README's headline are the rendering of the committed result records, and the rendering
reads rounds honestly: spread shown, a lead inside the noise band not called a win, lower-is-better inverted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import render


def test_committed_pages_equal_the_rendering_of_the_committed_records():
    records = render.load_records()
    assert render.PAGE.read_text() == render.render_page(records), "run python -m bench.render"
    readme = render.README.read_text()
    assert readme == render.with_headline(readme, render.render_headline(records)), "run python -m bench.render"
    assert len(render.PAGE.read_text().splitlines()) < 400


def test_every_record_names_its_command_machine_date_commit_and_source():
    for record in render.load_records():
        for key in ("command", "machine", "date", "commit", "source"):
            assert record[key].strip(), (record["title"], key)


def write(folder: Path, name: str, **fields) -> None:
    record = {"capability": "c", "title": "t", "command": "python -m bench", "machine": "m", "date": "d",
              "commit": "abc", "source": "s", "columns": ["ours", "peer"], **fields}
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_rounds_that_straddle_the_noise_band_read_as_disagreeing(tmp_path):
    write(tmp_path, "a", rows=[{"figure": "chat", "unit": "tok/s", "better": "higher",
                                "rounds": [[104, 100], [110, 100], [99, 100]]}])
    table = render.render_table(render.load_records(tmp_path)[0])
    assert table[-1] == "| chat | 104 tok/s | 100 tok/s | **1.04x** | 0.99–1.10x | 3 | rounds disagree |"


def test_a_time_is_inverted_so_above_one_means_ours_is_faster(tmp_path):
    write(tmp_path, "a", rows=[{"figure": "step", "unit": "ms", "better": "lower", "rounds": [[40, 50], [40, 48]]}])
    row = render.load_records(tmp_path)[0]["rows"][0]
    assert row.ratios() == [1.25, 1.2]
    assert render.reading(row.ratios()) == "ahead in every round"
    assert render.reading([1.02, 0.97]) == "tied (within 5%) in every round"
    assert render.reading([0.5]) == "behind, one round"


def test_rounds_can_come_from_raw_result_files(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "REPO", tmp_path)
    (tmp_path / "raw").mkdir()
    for i, (ours, peer) in enumerate([(80.0, 40.0), (90.0, 30.0)]):
        raw = {"engines": {"ours": {"tps": ours}, "hf": {"tps": peer}}}
        (tmp_path / "raw" / f"run{i}.json").write_text(json.dumps(raw))
    write(tmp_path, "a", raw=["raw/run0.json", "raw/run1.json"],
          rows=[{"figure": "chat", "better": "higher", "paths": ["engines.ours.tps", "engines.hf.tps"]}])
    assert render.load_records(tmp_path)[0]["rows"][0].rounds == [[80.0, 40.0], [90.0, 30.0]]


def test_a_raw_file_with_rounds_inside_gives_one_round_each(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "REPO", tmp_path)
    rounds = [{"ours": {"decode_128": {"step_s": 0.040}}, "vllm": {"decode_128": {"step_s": 0.044}}},
              {"ours": {"decode_128": {"step_s": 0.042}}, "vllm": {"decode_128": {"step_s": 0.042}}}]
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "run.json").write_text(json.dumps({"vs_vllm": {"rounds": rounds}}))
    write(tmp_path, "a", raw=["raw/run.json"], rows=[{"figure": "step", "better": "lower", "paths": [
        "vs_vllm.rounds.*.ours.decode_128.step_s", "vs_vllm.rounds.*.vllm.decode_128.step_s"]}])
    row = render.load_records(tmp_path)[0]["rows"][0]
    assert row.rounds == [[0.040, 0.044], [0.042, 0.042]]
    assert row.ratios() == pytest.approx([1.1, 1.0])


@pytest.mark.parametrize("broken, message", [
    ({"commit": None}, "missing commit"),
    ({"rows": [{"figure": "chat", "rounds": [[1, 2]]}]}, "needs better"),
    ({"rows": [{"figure": "chat", "better": "higher", "rounds": [[1, 2], [3]]}]}, "needs 2 value"),
])
def test_a_record_without_its_provenance_or_with_ragged_rounds_is_refused(tmp_path, broken, message):
    write(tmp_path, "bad", **{"rows": [], **broken})
    record = json.loads((tmp_path / "bad.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({k: v for k, v in record.items() if v is not None}))
    with pytest.raises(ValueError, match=message):
        render.load_records(tmp_path)


def test_a_raw_path_the_result_does_not_hold_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "REPO", tmp_path)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "run.json").write_text(json.dumps({"engines": {"ours": {"tps": 1.0}}}))
    write(tmp_path, "a", raw=["raw/run.json"],
          rows=[{"figure": "chat", "better": "higher", "paths": ["engines.ours.tps", "engines.hf.tps"]}])
    with pytest.raises(ValueError, match="raw/run.json has no 'hf'"):
        render.load_records(tmp_path)


def test_the_readme_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        render.with_headline("# README\n", "x")
