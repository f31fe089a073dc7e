/**
 * Replaying a lab recording without a model: the block map rebuilt from the engine's events alone.
 *
 * The same rules as inference/events.py's BlockMapReplay (ref counts, hashes, block tables per sequence),
 * so a recording exported by the lab redraws the pool exactly as it stood after every step.
 */

export class BlockMapReplay {
  /** From a recording's initial pool (a live worker's recording starts mid-run), or an empty one. */
  constructor(numBlocks, initial = null) {
    this.refCounts = initial ? [...initial.ref_counts] : new Array(numBlocks).fill(0);
    this.hashes = initial ? [...initial.hashes] : new Array(numBlocks).fill(null);
    this.tables = new Map(); // seq id -> physical block ids
    this.owners = new Map(); // seq id -> request label
    for (const [seq, table] of Object.entries(initial?.tables ?? {})) {
      this.tables.set(Number(seq), [...table]);
      this.owners.set(Number(seq), initial.owners[seq]);
    }
  }

  apply(e) {
    switch (e.kind) {
      case "allocated": {
        const table = this.table(e.seq_id, e.request_id);
        if (e.index === table.length) table.push(e.block_id);
        else table[e.index] = e.block_id;
        this.refCounts[e.block_id] = 1;
        break;
      }
      case "touched":
        this.table(e.seq_id, e.request_id).push(e.block_id);
        this.refCounts[e.block_id] += 1;
        break;
      case "forked":
        this.tables.set(e.child_seq_id, [...e.block_ids]);
        this.owners.set(e.child_seq_id, e.request_id);
        for (const b of e.block_ids) this.refCounts[b] += 1;
        break;
      case "copy_on_write":
        this.refCounts[e.src_block_id] -= 1;
        break;
      case "freed":
        for (const b of e.block_ids) this.refCounts[b] -= 1;
        this.tables.delete(e.seq_id);
        this.owners.delete(e.seq_id);
        break;
      case "cached":
        this.hashes[e.block_id] = e.block_hash;
        break;
      case "evicted":
        this.hashes[e.block_id] = null;
        break;
      case "cache_reset":
        for (const b of e.block_ids) this.hashes[b] = null;
        break;
      default:
        break; // request_added, scheduled, preempted, finished change no block
    }
  }

  table(seqId, label) {
    if (!this.tables.has(seqId)) this.tables.set(seqId, []);
    this.owners.set(seqId, label);
    return this.tables.get(seqId);
  }

  /** The pool as the live view draws it: one entry per physical block. */
  blocks() {
    const owners = new Map();
    for (const [seq, table] of this.tables) {
      for (const b of table) {
        const list = owners.get(b) || [];
        const label = this.owners.get(seq);
        if (!list.includes(label)) list.push(label);
        owners.set(b, list);
      }
    }
    return this.refCounts.map((ref, id) => ({
      id, ref_count: ref, hash: this.hashes[id], owners: owners.get(id) || [],
      state: ref ? "used" : this.hashes[id] !== null ? "cached" : "free",
    }));
  }

  /** Block tables grouped by request, as the live view's requests list. */
  requests() {
    const byLabel = new Map();
    for (const [seq, table] of this.tables) {
      const label = this.owners.get(seq);
      if (!byLabel.has(label)) byLabel.set(label, { label, status: "running", seqs: [] });
      byLabel.get(label).seqs.push({ index: byLabel.get(label).seqs.length, block_table: [...table] });
    }
    return [...byLabel.values()].sort((a, b) => a.label.localeCompare(b.label));
  }
}

/** Per step: the pool, tables and that step's events, for a slider to jump to any step. */
export function replaySteps(recording) {
  if (recording?.format !== "paged-playground-recording/1" || !Array.isArray(recording.events)) {
    throw new Error("not a Paged Playground recording");
  }
  const replay = new BlockMapReplay(recording.num_blocks, recording.initial);
  const steps = [];
  let current = null;
  let events = [];
  const close = () => steps.push({ step: current, blocks: replay.blocks(), requests: replay.requests(), events });
  for (const e of recording.events) {
    if (current !== null && e.step !== current) {
      close();
      events = [];
    }
    current = e.step;
    replay.apply(e);
    events.push(e);
  }
  if (current !== null) close();
  return steps;
}
