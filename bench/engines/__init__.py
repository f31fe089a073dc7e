"""One adapter per engine. Each runs a `Workload` (prompt token ids, exact output lengths, arrival times) and
returns an `EngineRun`: per-sequence token times, a KV timeline and counters, which `report` turns into the
same figures for every engine."""
