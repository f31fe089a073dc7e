/**
 * One worker's card on the memory view: headline figures, block map, contiguous-vs-paged bars, charts and
 * in-flight requests, all redrawn from each snapshot that worker publishes.
 */

import { chartValues, decodeBlockMap } from "../common/snapshot.js";
import { KvCharts, renderFigures } from "../common/kvcharts.js";
import { BlockMap } from "./blockmap.js";
import { RequestTable } from "./requests.js";
import { renderReservation } from "./reservation.js";

function ago(seconds) {
  if (seconds < 2) return "live";
  if (seconds < 60) return `quiet for ${Math.floor(seconds)} s`;
  return `quiet for ${Math.floor(seconds / 60)} min`;
}

export class WorkerCard {
  /**
   * @param {string} worker
   * @param {{template: HTMLTemplateElement, tooltip: HTMLElement,
   *          onAbort: (worker: string, requestId: string) => void, onReset: (worker: string) => void,
   *          onRecord: (worker: string, action: "start" | "stop") => void}} deps
   */
  constructor(worker, { template, tooltip, onAbort, onReset, onRecord }) {
    this.worker = worker;
    this.el = template.content.firstElementChild.cloneNode(true);
    this.el.dataset.worker = worker;
    this.q = (selector) => this.el.querySelector(selector);
    this.q(".worker-name").textContent = worker;
    this.q(".reset-cache").addEventListener("click", () => onReset(worker));
    this.q(".record").addEventListener("click", () =>
      onRecord(worker, this.q(".record").dataset.recording === "recording" ? "stop" : "start"));
    this.blockMap = new BlockMap(this.q(".blockmap"), tooltip);
    this.requests = new RequestTable(this.q(".requests tbody"), this.q(".no-requests"), {
      onAbort: (requestId) => onAbort(worker, requestId),
      onHover: (blockIds) => this.blockMap.highlight(blockIds),
    });
    this.charts = null; // created once the card is in the document and has a width
    this.previous = null;
    this.lastTime = null;
  }

  update(snapshot) {
    const values = chartValues(snapshot, this.previous);
    this.previous = snapshot;
    this.lastTime = Date.now();
    this.tick();
    renderFigures(this.q(".kv-figures"), values);

    const blocks = decodeBlockMap(snapshot.block_map);
    const counts = this.blockMap.update(blocks);
    for (const [state, n] of Object.entries(counts)) this.q(`[data-count="${state}"]`).textContent = String(n);

    const m = snapshot.metrics ?? {};
    // What quantization bought: the weights' bytes beside the KV pool's; under tensor parallelism, how many
    // ranks share them and what one rank holds.
    if (m.weight_bytes != null) {
      const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
      const ranks = m.tensor_parallel_size ?? 1;
      const perRank = ranks > 1
        ? ` · TP=${ranks}: ${mib(m.weight_bytes_per_rank)} weights + ${mib(m.kv_pool_bytes_per_rank)} KV per rank`
        : "";
      this.q(".worker-weights").textContent =
        `${m.quantization ?? "float"} weights ${mib(m.weight_bytes)} · KV pool ${mib(m.kv_pool_bytes ?? 0)}` +
        (m.kv_bytes_per_token ? ` · ${(m.kv_bytes_per_token / 1024).toFixed(1)} KiB KV per token` : "") + perRank;
    }
    const requests = snapshot.requests ?? [];
    const blockSize = m.block_size ?? 16;
    renderReservation(this.q(".reservation"), {
      pagedBlocks: m.num_blocks_used ?? counts.used + counts.shared,
      contiguous: m.contiguous,
      totalBlocks: m.num_blocks_total ?? blocks.length,
      blockSize,
      tokensHeld: requests.reduce((sum, r) => sum + r.context_len, 0),
      slotUtilization: m.kv_slot_utilization ?? null,
    });
    this.requests.update(requests, blocks, blockSize, snapshot.stamps?.block_map);

    this.charts ??= new KvCharts(this.q(".charts-grid"), ["memory", "requests", "preemptions", "throughput"],
      { height: 150, windowS: 300 });
    this.charts.push(values);
  }

  /** The worker's answer to Record / Stop: `recording`, `ready` (a download link), `idle` or `error`. */
  recordingState({ state, events, truncated }) {
    const button = this.q(".record");
    button.dataset.recording = state;
    button.textContent = state === "recording" ? "Stop recording" : "Record";
    const link = this.q(".recording-link");
    link.hidden = state !== "ready";
    if (state === "ready") {
      link.href = `/memory/recording/${encodeURIComponent(this.worker)}/`;
      link.textContent = `Download recording (${events} events${truncated ? ", truncated" : ""})`;
      link.title = "Replay it on the lab page: Import recording";
    }
  }

  /** Refresh the "live / quiet for" badge; the page calls this every second. */
  tick() {
    if (this.lastTime === null) return;
    const seconds = (Date.now() - this.lastTime) / 1000;
    const badge = this.q(".worker-age");
    badge.textContent = ago(seconds);
    badge.classList.toggle("live", seconds < 2);
  }
}
