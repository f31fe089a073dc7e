/**
 * In-flight requests of one worker with their block tables: logical block i → physical block, the picture
 * PagedAttention is built on. Physical blocks that other sequences share are marked, hovering a row lights
 * the request's blocks up in the block map, and each row has an abort button.
 */

import { requestColor, shortId } from "./labels.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class RequestTable {
  /**
   * @param {HTMLTableSectionElement} tbody
   * @param {HTMLElement} emptyNote  shown when nothing is in flight
   * @param {{onAbort: (requestId: string) => void, onHover: (blockIds: number[] | null) => void}} handlers
   */
  constructor(tbody, emptyNote, { onAbort, onHover }) {
    this.tbody = tbody;
    this.emptyNote = emptyNote;
    this.onAbort = onAbort;
    this.onHover = onHover;
    this.aborting = new Set();
    this.hovered = null; // request id under the pointer
    this.tables = new Map(); // request id -> block table of the last update
    this.rows = new Map(); // "request id#sample index" -> its row, kept while the sequence is listed
    tbody.addEventListener("mouseover", (event) => {
      const id = event.target.closest("tr")?.dataset.requestId ?? null;
      if (id !== this.hovered) this.hover(id);
    });
    tbody.addEventListener("mouseleave", () => this.hover(null));
  }

  /** Rows are rebuilt with every new block map, so hovering is tracked by request id, not by row element. */
  hover(requestId) {
    this.hovered = requestId;
    this.onHover(requestId === null ? null : this.tables.get(requestId) ?? null);
  }

  /**
   * @param {{request_id: string, index?: number, adapter?: string | null, block_table: number[],
   *          context_len: number, max_len: number, outside_window?: number}[]} requests  one entry per sequence (sample `index` of the
   *          request; `adapter`: the LoRA adapter it runs under, null for the base model)
   * @param {{refCount: number}[]} blocks  the decoded block map, to mark shared physical blocks
   * @param {number} blockSize
   * @param {number | undefined} stamp  which worker sample the map and tables came from (snapshot.stamps):
   *   between block-map refreshes the snapshot repeats the last ones, and the rows (their buttons) stay put
   */
  update(requests, blocks, blockSize, stamp) {
    if (stamp !== undefined && stamp === this.stamp) return;
    this.stamp = stamp;
    const live = new Set(requests.map((r) => r.request_id));
    for (const id of this.aborting) if (!live.has(id)) this.aborting.delete(id);
    // A request with n samples has one entry per sample; hovering any of its rows lights up all its blocks.
    this.tables = new Map();
    for (const r of requests) {
      this.tables.set(r.request_id, [...(this.tables.get(r.request_id) ?? []), ...r.block_table]);
    }
    // A sequence keeps its row (and its Abort button) from one block map to the next, and only the other cells
    // are rebuilt: rebuilding whole rows with every map (each 250 ms while a request runs) left a pointer pressed
    // on a button that was no longer in the page, and the click was lost.
    const rows = new Map();
    for (const r of requests) {
      const key = `${r.request_id}#${r.index ?? 0}`;
      const tr = this.rows.get(key) ?? this.newRow(r);
      this.fill(tr, r, blocks, blockSize);
      rows.set(key, tr);
    }
    this.rows = rows;
    const order = [...rows.values()];
    if (order.length !== this.tbody.children.length || order.some((tr, i) => this.tbody.children[i] !== tr)) {
      this.tbody.replaceChildren(...order);
    }
    this.emptyNote.hidden = requests.length > 0;
    if (this.hovered !== null) this.hover(live.has(this.hovered) ? this.hovered : null);
  }

  /** A sequence's row with its Abort button; `fill` puts in the other cells. */
  newRow(request) {
    const tr = el("tr");
    tr.dataset.requestId = request.request_id;
    const actions = el("td", "req-actions");
    const abort = el("button", "btn btn-small", this.aborting.has(request.request_id) ? "Aborting…" : "Abort");
    abort.type = "button";
    abort.disabled = this.aborting.has(request.request_id);
    abort.addEventListener("click", () => {
      this.aborting.add(request.request_id);
      abort.disabled = true;
      abort.textContent = "Aborting…";
      this.onAbort(request.request_id);
    });
    actions.append(abort);
    tr.append(actions);
    return tr;
  }

  /** The row's name, size and block-table cells for this update, before its (kept) actions cell. */
  fill(tr, request, blocks, blockSize) {
    const name = el("td", "req-id");
    const swatch = el("span", "swatch");
    swatch.style.background = requestColor(request.request_id);
    const id = el("code", "", shortId(request.request_id));
    id.title = request.request_id;
    name.append(swatch, id);
    if (request.index) name.append(el("span", "muted", ` #${request.index}`));
    if (request.adapter) {
      const adapter = el("span", "req-adapter", request.adapter);
      adapter.title = `LoRA adapter ${request.adapter}: its blocks are shared only with requests of this adapter`;
      name.append(adapter);
    }

    const maxBlocks = Math.ceil(request.max_len / blockSize);
    const sizes = el("td", "req-size");
    sizes.append(
      el("span", "", `${request.context_len} / ${request.max_len} tokens`),
      el("span", "muted", `${request.block_table.length} of ${maxBlocks} blocks`),
    );

    const table = el("td", "req-table");
    const chips = el("div", "chips");
    chips.style.setProperty("--request-color", requestColor(request.request_id));
    request.block_table.forEach((physical, logical) => {
      const chip = el("span", "chip");
      const shared = (blocks[physical]?.refCount ?? 0) > 1;
      chip.classList.toggle("shared", shared);
      const sharing = shared ? ` (shared, ref ${blocks[physical].refCount})` : "";
      // A sliding-window model: every layer's window has passed this block; it stays held, never read again.
      const passed = logical < (request.outside_window ?? 0);
      chip.classList.toggle("outside-window", passed);
      const window = passed ? " (outside every layer's sliding window: kept, not read)" : "";
      chip.title = `logical ${logical} → physical ${physical}${sharing}${window}`;
      chip.append(
        el("span", "chip-l", String(logical)),
        el("span", "chip-arrow", "→"),
        el("span", "chip-p", String(physical)),
      );
      chips.append(chip);
    });
    table.append(chips);

    const actions = tr.querySelector(".req-actions");  // never detached: a press on its button must stay on the page
    while (tr.firstChild !== actions) tr.firstChild.remove();
    actions.before(name, sizes, table);
  }
}
