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
   *          onAbort: (worker: string, requestId: string) => void, onReset: (worker: string) => void}} deps
   */
  constructor(worker, { template, tooltip, onAbort, onReset }) {
    this.worker = worker;
    this.el = template.content.firstElementChild.cloneNode(true);
    this.el.dataset.worker = worker;
    this.q = (selector) => this.el.querySelector(selector);
    this.q(".worker-name").textContent = worker;
    this.q(".reset-cache").addEventListener("click", () => onReset(worker));
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
    const requests = snapshot.requests ?? [];
    const blockSize = m.block_size ?? 16;
    renderReservation(this.q(".reservation"), {
      pagedBlocks: m.num_blocks_used ?? counts.used + counts.shared,
      contiguousBlocks: snapshot.contiguous_reserved_blocks ?? 0,
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

  /** Refresh the "live / quiet for" badge; the page calls this every second. */
  tick() {
    if (this.lastTime === null) return;
    const seconds = (Date.now() - this.lastTime) / 1000;
    const badge = this.q(".worker-age");
    badge.textContent = ago(seconds);
    badge.classList.toggle("live", seconds < 2);
  }
}
