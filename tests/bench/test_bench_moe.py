"""The MoE-against-dense decode bench (bench/moe.py) on a tiny config: both models measured at every batch
size in every round (rounds alternating which goes first), the active parameters equal but for the router,
and a record that `bench.render` reads back into one row per batch size. Not timed: the rates only exist."""

from __future__ import annotations

import json

from bench import moe, render


def test_moe_bench_measures_both_models_and_writes_a_record_render_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(moe, "REPO", tmp_path)  # the record's raw path is read from the "repository" root
    monkeypatch.setattr(render, "REPO", tmp_path)
    out, rec = tmp_path / "raw" / "run.json", tmp_path / "results" / "90-moe-1-decode.json"
    rec.parent.mkdir()
    hidden, layers, experts = 64, 1, 4
    moe.main(["--hidden", str(hidden), "--layers", str(layers), "--heads", "2", "--kv-heads", "1",
              "--experts", str(experts), "--top-k", "2", "--expert-intermediate", "32", "--batch", "1,2",
              "--tokens", "3", "--rounds", "2", "--kv-blocks", "32", "--out", str(out), "--record", str(rec)])
    result = json.loads(out.read_text())
    assert [list(r) for r in result["rounds"]] == [["moe", "dense"], ["dense", "moe"]]
    for r in result["rounds"]:
        for name in moe.MODELS:
            assert set(r[name]) == {"decode_batch1_tok_s", "decode_batch2_tok_s"}
            assert all(v > 0 for v in r[name].values())
    models = result["models"]
    assert models["dense"]["active_params"] == models["dense"]["total_params"]
    assert models["moe"]["total_params"] > models["moe"]["active_params"]
    # Same active parameters: the MoE's extra is its router alone (E x H per layer).
    assert models["moe"]["active_params"] - models["dense"]["total_params"] == layers * experts * hidden
    [record] = render.load_records(rec.parent)
    assert record["raw"] == ["raw/run.json"] and record["columns"][0] == "MoE top-2 of 4"
    assert [row.figure for row in record["rows"]] == ["decode, batch 1", "decode, batch 2"]
    assert record["rows"][1].rounds == [[r["moe"]["decode_batch2_tok_s"], r["dense"]["decode_batch2_tok_s"]]
                                        for r in result["rounds"]]
    assert "| decode, batch 1 | " in "\n".join(render.render_table(record))
