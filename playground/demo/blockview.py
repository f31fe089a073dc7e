"""What of a worker's full KV snapshot the public demo page may see: its own simulated users' blocks.

A full snapshot names every running request (the staff memory view's data). The demo page gets the same
block map with each block's owners reduced to the demo's own users (by name); blocks that only other users'
requests hold keep their state but are attributed to "others", and only the demo's block tables are kept.
"""
from typing import Any

OTHERS = "others"


def demo_blocks(snapshot: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """`names`: request id -> simulated user's name, for the requests of the current demo run."""
    block_map = snapshot["block_map"]
    owners = {}
    for block_id, holders in block_map["owners"].items():
        own = [names[r] for r in holders if r in names]
        owners[block_id] = own + ([OTHERS] if len(own) < len(holders) else [])
    requests = [{**r, "request_id": names[r["request_id"]]} for r in snapshot["requests"] if r["request_id"] in names]
    return {
        "type": "blocks",
        "worker": snapshot["worker"],
        "stamps": snapshot["stamps"],
        "block_size": snapshot["metrics"]["block_size"],
        "block_map": {"states": block_map["states"], "ref_counts": block_map["ref_counts"], "owners": owners},
        "requests": requests,
    }
