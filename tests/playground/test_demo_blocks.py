"""The demo page's block map: the demo's own requests by user name, everyone else's blocks as "others",
nothing that names another request."""
from playground.serving.worker import kv_snapshot
from playground.demo.blockview import OTHERS, demo_blocks


def test_only_the_demos_requests_are_named():
    block_map = [
        {"state": "used", "ref_count": 2, "owners": ["demo-1", "secret-req"]},  # shared by both
        {"state": "used", "ref_count": 1, "owners": ["demo-1"]},
        {"state": "used", "ref_count": 1, "owners": ["secret-req"]},
        {"state": "cached", "ref_count": 0, "owners": []},
        {"state": "free", "ref_count": 0, "owners": []},
    ]
    full = {
        "type": "snapshot", "worker": "w1", "stamps": {"counters": 3, "block_map": 3},
        "metrics": {"block_size": 16},
        "block_map": kv_snapshot.encode_block_map(block_map),
        "requests": [
            {"request_id": "demo-1", "index": 0, "block_table": [0, 1], "context_len": 20, "max_len": 80},
            {"request_id": "secret-req", "index": 0, "block_table": [0, 2], "context_len": 30, "max_len": 90},
        ],
    }
    view = demo_blocks(full, {"demo-1": "Ada"})
    assert view["block_map"] == {"states": "suucf", "ref_counts": {"0": 2},
                                 "owners": {"0": ["Ada", OTHERS], "1": ["Ada"], "2": [OTHERS]}}
    assert view["requests"] == [{"request_id": "Ada", "index": 0, "block_table": [0, 1], "context_len": 20,
                                 "max_len": 80}]
    assert "secret-req" not in str(view) and view["type"] == "blocks" and view["block_size"] == 16
