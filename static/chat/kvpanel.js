/**
 * The chat page's small live KV panel: headline figures and three charts for one worker.
 * With several workers a selector picks which one to watch; each worker's previous snapshot is kept so the
 * hit rate is a recent one (see chartValues()).
 */

import { chartValues } from "../common/snapshot.js";
import { KvCharts, renderFigures } from "../common/kvcharts.js";

export class KvPanel {
  /** @param {{figures: HTMLElement, charts: HTMLElement, worker: HTMLElement, idle: HTMLElement}} els */
  constructor(els) {
    this.els = els;
    this.charts = null;
    this.previous = new Map(); // worker -> last snapshot
    this.watched = null;
    this.select = null;
  }

  /** Feed one worker snapshot (any worker; only the watched one is drawn). */
  update(snapshot) {
    const worker = snapshot.worker ?? "worker";
    const values = chartValues(snapshot, this.previous.get(worker));
    const isNew = !this.previous.has(worker);
    this.previous.set(worker, snapshot);
    if (isNew) this.renderWorkerPicker();
    if (this.watched === null) this.watch(worker);
    if (worker !== this.watched) return;
    this.els.idle.hidden = true;
    this.charts ??= new KvCharts(this.els.charts, ["memory", "requests", "throughput"], { height: 110 });
    this.charts.push(values);
    renderFigures(this.els.figures, values);
  }

  /** Switch to another worker; its charts start afresh. */
  watch(worker) {
    this.watched = worker;
    if (this.select) this.select.value = worker;
    this.charts?.destroy();
    this.charts = null;
    this.els.charts.replaceChildren();
  }

  renderWorkerPicker() {
    const workers = [...this.previous.keys()];
    if (workers.length < 2) {
      this.els.worker.textContent = workers[0] ?? "";
      return;
    }
    if (!this.select) {
      this.select = document.createElement("select");
      this.select.setAttribute("aria-label", "Worker");
      this.select.addEventListener("change", () => this.watch(this.select.value));
      this.els.worker.replaceChildren(this.select);
    }
    this.select.replaceChildren(
      ...workers.map((w) => {
        const option = document.createElement("option");
        option.value = w;
        option.textContent = w;
        return option;
      }),
    );
    this.select.value = this.watched ?? workers[0];
  }
}
