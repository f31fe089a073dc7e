/**
 * Reading worker snapshots: the admin view's `/ws/memory/` feed and the chat page's `/ws/kv/` feed.
 *
 * `chartValues()` is the one place that maps a snapshot onto the numbers the charts plot; `decodeBlockMap()`
 * expands the compact block map (one state character per physical block) into per-block records.
 *
 * Snapshot shape (built by playground/serving/worker/kv_snapshot.py; `/ws/kv/` sends it without block_map and
 * requests):
 *   {"type": "snapshot", "worker": str, "time": float (epoch seconds),
 *    "metrics": {num_blocks_total, num_blocks_used, num_blocks_free, num_blocks_cached, kv_cache_usage,
 *                kv_slot_utilization, num_requests_running, num_requests_waiting, num_preemptions_total,
 *                prefix_cache_queries_total, prefix_cache_hits_total, generation_tokens_total, block_size,
 *                contiguous: {max_model_len: {reserved_blocks, admitted, requests}, prompt_plus_max_tokens: {...}},
 *                ...},
 *    "tokens_per_s": float,
 *    "block_map": {"states": "fuscc...", "ref_counts": {"<block id>": int}, "owners": {"<block id>": [ids]}},
 *    "requests": [{"request_id", "index", "block_table": [int...], "context_len", "max_len"}]}
 * Block states: f free, u used by one sequence, s shared by several, c cached and evictable. `requests` has
 * one entry per running sequence (sample `index` of a request with n > 1).
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

/** The ref count a state implies when the map does not list one: 1 for used, 0 for free and cached. */
const IMPLIED_REF_COUNT = { f: 0, u: 1, c: 0 };

/**
 * Expand the compact block map into `[{id, state, refCount, owners}]`, one record per physical block.
 * `ref_counts` is `{"<block id>": count}` for the shared blocks only: the other states imply their count.
 * Throws on a malformed map so a schema drift shows up as a clear console error, not a wrong picture.
 */
export function decodeBlockMap(blockMap) {
  const { states = "", ref_counts: refCounts = {}, owners = {} } = blockMap ?? {};
  if (typeof states !== "string") throw new Error("block_map.states must be a string");
  return Array.from(states, (ch, id) => {
    const state = BLOCK_STATES[ch];
    if (!state) throw new Error(`block_map.states has unknown state ${JSON.stringify(ch)} at block ${id}`);
    const refCount = refCounts[String(id)] ?? IMPLIED_REF_COUNT[ch];
    if (refCount === undefined) throw new Error(`block_map has no ref count for shared block ${id}`);
    return { id, state, refCount, owners: owners[String(id)] ?? [] };
  });
}
