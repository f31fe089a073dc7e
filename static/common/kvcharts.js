/**
 * The KV-cache charts and headline figures shared by the chat page's panel and the admin memory view.
 * Each chart plots fields of chartValues() (common/snapshot.js); a page picks which charts it shows.
 */

import { LiveChart } from "./livechart.js";

const COLORS = {
  indigo: "#6366f1",
  teal: "#14b8a6",
  amber: "#f59e0b",
  rose: "#f43f5e",
  sky: "#0ea5e9",
};

export const CHART_SPECS = {
  memory: {
    title: "KV memory",
    unit: "%",
    yMax: 100,
    series: [
      { field: "kvUsagePct", label: "KV usage", color: COLORS.indigo },
      { field: "slotUtilPct", label: "slot utilisation", color: COLORS.teal },
      { field: "hitRatePct", label: "prefix hit rate", color: COLORS.amber },
    ],
  },
  requests: {
    title: "Requests",
    digits: 0,
    series: [
      { field: "running", label: "running", color: COLORS.indigo },
      { field: "waiting", label: "waiting", color: COLORS.rose },
    ],
  },
  preemptions: {
    title: "Preemptions (total)",
    digits: 0,
    series: [{ field: "preemptions", label: "preemptions", color: COLORS.rose }],
  },
  throughput: {
    title: "Generation throughput",
    unit: "",
    series: [{ field: "tokensPerS", label: "tokens/s", color: COLORS.sky }],
  },
};

function fmtPct(v) {
  return v === null || v === undefined ? "–" : `${v.toFixed(1)}%`;
}

/** The headline numbers above the charts, as [name, label, text] triples. */
export function headlineFigures(values) {
  return [
    ["kv_usage", "KV usage", fmtPct(values.kvUsagePct)],
    ["slot_util", "Slot utilisation", fmtPct(values.slotUtilPct)],
    ["hit_rate", "Prefix hit rate", fmtPct(values.hitRatePct)],
    ["requests", "Running / waiting", `${values.running} / ${values.waiting}`],
    ["tokens_per_s", "Tokens/s", values.tokensPerS === null ? "–" : values.tokensPerS.toFixed(1)],
  ];
}

/** Fill a <dl> with the headline figures (each <div data-figure=name> holds a <dt> and a <dd>). */
export function renderFigures(dl, values) {
  dl.replaceChildren(
    ...headlineFigures(values).map(([name, label, text]) => {
      const item = document.createElement("div");
      item.dataset.figure = name;
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.textContent = text;
      item.append(dt, dd);
      return item;
    }),
  );
}

/** A group of live charts, one per key of CHART_SPECS, fed with chartValues() records. */
export class KvCharts {
  /**
   * @param {HTMLElement} container  each chart gets its own child <div class="chart" data-chart=key>
   * @param {string[]} keys          which of CHART_SPECS to show, in order
   * @param {{height?: number, windowS?: number}} options
   */
  constructor(container, keys, { height = 120, windowS = 120 } = {}) {
    this.charts = keys.map((key) => {
      const spec = CHART_SPECS[key];
      if (!spec) throw new Error(`unknown chart ${key}`);
      const box = document.createElement("div");
      box.className = "chart";
      box.dataset.chart = key;
      container.append(box);
      const chart = new LiveChart(box, { ...spec, height, windowS });
      return { spec, chart };
    });
  }

  push(values) {
    for (const { spec, chart } of this.charts) {
      chart.push(values.time, spec.series.map((s) => values[s.field]));
    }
  }

  destroy() {
    this.charts.forEach(({ chart }) => chart.destroy());
  }
}
