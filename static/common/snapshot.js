/**
 * Reading worker snapshots (the `/ws/memory/` feed and the chat page's metrics events).
 *
 * `chartValues()` is the one place that maps a snapshot onto the numbers the charts plot; `decodeBlockMap()`
 * expands the compact block map (one state character per physical block) into per-block records.
 *
 * Snapshot shape:
 *   {"type": "snapshot", "worker": str, "time": float (epoch seconds),
 *    "metrics": {num_blocks_total, num_blocks_used, num_blocks_free, num_blocks_cached, kv_cache_usage,
 *                kv_slot_utilization, num_requests_running, num_requests_waiting, num_preemptions_total,
 *                prefix_cache_queries_total, prefix_cache_hits_total, generation_tokens_total, block_size, ...},
 *    "tokens_per_s": float,
 *    "block_map": {"states": "fuscc...", "ref_counts": [int...], "owners": {"<block id>": [request ids]}},
 *    "requests": [{"request_id", "block_table": [int...], "context_len", "max_len"}],
 *    "contiguous_reserved_blocks": int}
 */

export const BLOCK_STATES = { f: "free", u: "used", s: "shared", c: "cached" };

/** A fraction in [0, 1] (as metrics() reports them) as a percentage. */
function percent(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return null;
  return value * 100;
}

/** Prefix-cache hit rate in %, over the interval since `previous` when it had fewer queries, else overall. */
export function hitRate(metrics, previousMetrics = null) {
  const queries = metrics.prefix_cache_queries_total ?? 0;
  const hits = metrics.prefix_cache_hits_total ?? 0;
  if (previousMetrics) {
    const dq = queries - (previousMetrics.prefix_cache_queries_total ?? 0);
    const dh = hits - (previousMetrics.prefix_cache_hits_total ?? 0);
    if (dq > 0) return (100 * dh) / dq;
  }
  return queries > 0 ? (100 * hits) / queries : null;
}

/**
 * The chart values of one snapshot. `previous` (the worker's previous snapshot) turns the cumulative
 * prefix-cache counters into a recent hit rate; without it the rate is the all-time one.
 */
export function chartValues(snapshot, previous = null) {
  const m = snapshot.metrics ?? {};
  return {
    time: snapshot.time ?? Date.now() / 1000,
    kvUsagePct: percent(m.kv_cache_usage),
    slotUtilPct: percent(m.kv_slot_utilization),
    hitRatePct: hitRate(m, previous?.metrics ?? null),
    running: m.num_requests_running ?? 0,
    waiting: m.num_requests_waiting ?? 0,
    preemptions: m.num_preemptions_total ?? 0,
    tokensPerS: snapshot.tokens_per_s ?? null,
  };
}

/**
 * Expand the compact block map into `[{id, state, refCount, owners}]`, one record per physical block.
 * Throws on a malformed map so a schema drift shows up as a clear console error, not a wrong picture.
 */
export function decodeBlockMap(blockMap) {
  const { states = "", ref_counts: refCounts = [], owners = {} } = blockMap ?? {};
  if (typeof states !== "string") throw new Error("block_map.states must be a string");
  if (refCounts.length !== 0 && refCounts.length !== states.length) {
    throw new Error(`block_map has ${states.length} states but ${refCounts.length} ref counts`);
  }
  return Array.from(states, (ch, id) => {
    const state = BLOCK_STATES[ch];
    if (!state) throw new Error(`block_map.states has unknown state ${JSON.stringify(ch)} at block ${id}`);
    return { id, state, refCount: refCounts[id] ?? 0, owners: owners[String(id)] ?? [] };
  });
}
