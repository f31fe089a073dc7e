/**
 * The block map: every physical KV block of one worker as a cell, coloured by state — free, used by a
 * request (the request's colour), shared by several sequences (ref count > 1) or cached and evictable.
 *
 * It draws on a canvas so that a GPU-sized pool (tens of thousands of blocks) redraws a few times a second
 * without tens of thousands of DOM nodes. Hovering a cell shows its ref count and owners in a tooltip.
 * The canvas carries `data-used`, `data-shared`, `data-cached` and `data-free` counts of what it shows.
 */

import { requestColor, shortId } from "./labels.js";

const GAP = 2;

function cssVar(el, name) {
  return getComputedStyle(el).getPropertyValue(name).trim();
}

/** Cells shrink as the pool grows so the map stays about the same height. */
function cellSizeFor(count) {
  if (count <= 1024) return 12;
  if (count <= 4096) return 8;
  if (count <= 16384) return 5;
  return 3;
}

export class BlockMap {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {HTMLElement} tooltip  a floating element shared by all maps on the page
   */
  constructor(canvas, tooltip) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.blocks = [];
    this.highlighted = null; // Set of block ids to emphasise, or null
    this.cols = 1;
    this.cell = 12;
    canvas.addEventListener("mousemove", (event) => this.showTip(event));
    canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
  }

  /** @param {{id, state, refCount, owners}[]} blocks  decoded block map (common/snapshot.js) */
  update(blocks) {
    this.blocks = blocks;
    const counts = { free: 0, used: 0, shared: 0, cached: 0 };
    for (const b of blocks) counts[b.state] += 1;
    Object.entries(counts).forEach(([state, n]) => { this.canvas.dataset[state] = String(n); });
    this.draw();
    return counts;
  }

  /** Emphasise these blocks (e.g. one request's block table) and dim the rest; null clears it. */
  highlight(blockIds) {
    this.highlighted = blockIds ? new Set(blockIds) : null;
    this.draw();
  }

  fillFor(block, palette) {
    switch (block.state) {
      case "used": return requestColor(block.owners[0] ?? "?");
      case "shared": return palette.shared;
      case "cached": return palette.cached;
      default: return palette.free;
    }
  }

  draw() {
    const width = this.canvas.parentElement.clientWidth;
    if (width === 0) return;
    this.cell = cellSizeFor(this.blocks.length);
    const pitch = this.cell + GAP;
    this.cols = Math.max(1, Math.floor((width + GAP) / pitch));
    const rows = Math.max(1, Math.ceil(this.blocks.length / this.cols));
    const height = rows * pitch - GAP;
    const ratio = window.devicePixelRatio || 1;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(height * ratio);
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const palette = {
      free: cssVar(this.canvas, "--block-free"),
      shared: cssVar(this.canvas, "--block-shared"),
      cached: cssVar(this.canvas, "--block-cached"),
      ring: cssVar(this.canvas, "--block-ring"),
    };
    for (const block of this.blocks) {
      const x = (block.id % this.cols) * pitch;
      const y = Math.floor(block.id / this.cols) * pitch;
      ctx.globalAlpha = this.highlighted && !this.highlighted.has(block.id) ? 0.25 : 1;
      ctx.fillStyle = this.fillFor(block, palette);
      ctx.fillRect(x, y, this.cell, this.cell);
      if (block.state === "shared" && this.cell >= 8) {
        ctx.strokeStyle = palette.ring;
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x + 2.5, y + 2.5, this.cell - 5, this.cell - 5);
      } else if (block.state === "cached" && this.cell >= 8) {
        ctx.strokeStyle = palette.ring;
        ctx.lineWidth = 1;
        ctx.beginPath();
        ctx.moveTo(x + 1, y + this.cell - 1);
        ctx.lineTo(x + this.cell - 1, y + 1);
        ctx.stroke();
      }
    }
    ctx.globalAlpha = 1;
  }

  blockAt(event) {
    const rect = this.canvas.getBoundingClientRect();
    const pitch = this.cell + GAP;
    const col = Math.floor((event.clientX - rect.left) / pitch);
    const row = Math.floor((event.clientY - rect.top) / pitch);
    if (col < 0 || col >= this.cols) return null;
    return this.blocks[row * this.cols + col] ?? null;
  }

  showTip(event) {
    const block = this.blockAt(event);
    if (!block) {
      this.tooltip.hidden = true;
      return;
    }
    const owners = block.owners.length ? block.owners.map(shortId).join(", ") : "none";
    this.tooltip.textContent =
      `Block ${block.id} · ${block.state}\nref count ${block.refCount}\nowners: ${owners}`;
    this.tooltip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - this.tooltip.offsetWidth - 8);
    this.tooltip.style.left = `${x}px`;
    this.tooltip.style.top = `${event.clientY + 14}px`;
  }
}
