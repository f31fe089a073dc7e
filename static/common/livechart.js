/**
 * A rolling time-series chart on top of the vendored uPlot (static/vendor/uplot, loaded by a classic
 * <script> tag, so it is `window.uPlot`). Both the chat page's KV panel and the admin memory view use it.
 *
 * The chart keeps the last `windowS` seconds of points, follows its container's width, and records how many
 * points it holds in `data-points` on the container, which makes "the chart gained points" observable.
 */

function cssVar(el, name, fallback) {
  const value = getComputedStyle(el).getPropertyValue(name).trim();
  return value || fallback;
}

function formatValue(v, unit, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return `${Number(v).toFixed(digits)}${unit}`;
}

/** Seconds since the epoch as local hh:mm:ss; live charts span minutes, so dates would only add noise. */
function clockTime(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

/** Whole-second tick steps: sub-second ticks would repeat the same hh:mm:ss label. */
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600];
/** Whole-number tick steps for counts (requests, preemptions). */
const COUNT_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];

export class LiveChart {
  /**
   * @param {HTMLElement} container  element the chart fills (its width is tracked)
   * @param {{title: string, series: {label: string, color: string}[], unit?: string, digits?: number,
   *          yMax?: number|null, windowS?: number, height?: number}} options
   *   yMax fixes the top of the y axis (e.g. 100 for percentages); null lets it follow the data.
   */
  constructor(container, { title, series, unit = "", digits = 1, yMax = null, windowS = 120, height = 130 }) {
    const uPlot = window.uPlot;
    if (!uPlot) throw new Error("uPlot is not loaded: include static/vendor/uplot/uPlot.iife.min.js first");
    this.container = container;
    this.windowS = windowS;
    this.data = [[], ...series.map(() => [])];
    const axis = cssVar(container, "--chart-axis", "#6b7280");
    const grid = cssVar(container, "--chart-grid", "rgba(127,127,127,0.15)");
    const opts = {
      title,
      width: Math.max(container.clientWidth, 200),
      height,
      cursor: { drag: { x: false, y: false } },
      legend: { live: true },
      scales: {
        x: { time: true },
        y: { range: (_u, _min, max) => [0, yMax ?? Math.max(1, max * 1.15)] },
      },
      series: [
        {},
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 2,
          points: { show: false },
          // With the cursor off the chart the legend shows the latest value instead of a dash.
          value: (u, v, seriesIdx, idx) => formatValue(idx === null ? u.data[seriesIdx].at(-1) : v, unit, digits),
        })),
      ],
      axes: [
        { stroke: axis, grid: { stroke: grid }, ticks: { stroke: grid }, space: 70, incrs: TIME_STEPS,
          values: (_u, ticks) => ticks.map(clockTime) },
        { stroke: axis, grid: { stroke: grid }, ticks: { stroke: grid }, size: 52,
          ...(digits === 0 ? { incrs: COUNT_STEPS } : {}),
          values: (_u, ticks) => ticks.map((t) => `${t}${unit}`) },
      ],
    };
    this.plot = new uPlot(opts, this.data, container);
    this.resizer = new ResizeObserver(() => {
      const width = Math.max(container.clientWidth, 200);
      if (width !== this.plot.width) this.plot.setSize({ width, height });
    });
    this.resizer.observe(container);
    container.dataset.points = "0";
  }

  /** Append one point per series at time `t` (seconds since the epoch) and drop points older than the window. */
  push(t, values) {
    const [xs, ...ys] = this.data;
    if (xs.length > 0 && t <= xs[xs.length - 1]) return; // a duplicate or out-of-order snapshot
    xs.push(t);
    ys.forEach((col, i) => col.push(values[i] ?? null));
    while (xs.length > 1 && xs[0] < t - this.windowS) {
      xs.shift();
      ys.forEach((col) => col.shift());
    }
    this.plot.setData(this.data);
    this.container.dataset.points = String(xs.length);
  }

  destroy() {
    this.resizer.disconnect();
    this.plot.destroy();
  }
}
