"""Vocabulary both sides of serving share: queue, group and task names, and the worker registry
(workers write heartbeats, web processes read them)."""
