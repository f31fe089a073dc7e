"""Vocabulary both sides of serving share: queue, group and task names, the worker registry (workers write
heartbeats, web processes read them) and the KV dashboard's channel-layer messages (kv_feed)."""
