/**
 * "Contiguous allocation would reserve" versus paged: the blocks the same live requests would pin if each
 * pre-allocated its room up front (as pre-PagedAttention servers did) against the blocks paging holds now.
 * Two contiguous policies are shown, both computed by the engine (inference/counterfactual.py, carried as
 * metrics.contiguous): every sequence reserving max_model_len, and every sequence reserving its prompt plus
 * max_tokens. All bars share one scale with the pool size, so a reservation that would not fit runs past the
 * pool mark. Each bar also says how much of what it holds is empty: internal fragmentation, which paging
 * confines to the last, partly filled block of each sequence.
 */

export const POLICIES = ["max_model_len", "prompt_plus_max_tokens"];

function pct(part, whole) {
  return whole > 0 ? (100 * part) / whole : 0;
}

/**
 * @param {HTMLElement} root  holds [data-bar=...], [data-label=...] for "paged" and each policy, and .pool-mark's
 * @param {{pagedBlocks: number, contiguous: Object<string, {reserved_blocks: number}>, totalBlocks: number,
 *          blockSize: number, tokensHeld: number, slotUtilization: number | null}} figures
 *   tokensHeld: the live requests' context lengths summed; slotUtilization: the engine's filled share of the
 *   slots of its used blocks (0..1).
 */
export function renderReservation(root, figures) {
  const { pagedBlocks, contiguous, totalBlocks, blockSize, tokensHeld, slotUtilization } = figures;
  const reserved = Object.fromEntries(POLICIES.map((p) => [p, contiguous?.[p]?.reserved_blocks ?? 0]));
  const scale = Math.max(totalBlocks, ...Object.values(reserved), 1);
  root.querySelector('[data-bar="paged"]').style.width = `${pct(pagedBlocks, scale)}%`;
  for (const mark of root.querySelectorAll(".pool-mark")) mark.style.left = `${pct(totalBlocks, scale)}%`;

  const pagedEmpty = pagedBlocks > 0 && slotUtilization !== null
    ? ` · ${(100 * (1 - slotUtilization)).toFixed(1)}% of its slots empty`
    : "";
  root.querySelector('[data-label="paged"]').textContent =
    `${pagedBlocks} blocks · ${pct(pagedBlocks, totalBlocks).toFixed(1)}% of the pool${pagedEmpty}`;
  let over = false;
  for (const policy of POLICIES) {
    const blocks = reserved[policy];
    root.querySelector(`[data-bar="${policy}"]`).style.width = `${pct(blocks, scale)}%`;
    const reservedSlots = blocks * blockSize;
    const empty = reservedSlots > 0 ? ` · ${(100 - pct(tokensHeld, reservedSlots)).toFixed(1)}% of it empty` : "";
    const tooBig = blocks > totalBlocks;
    over ||= tooBig;
    root.querySelector(`[data-label="${policy}"]`).textContent =
      `${blocks} blocks · ${pct(blocks, totalBlocks).toFixed(1)}% of the pool${empty}` +
      (tooBig ? ` — would not fit (${(blocks / totalBlocks).toFixed(1)}× the pool)` : "");
  }
  root.classList.toggle("overflow", over);
  const tightest = reserved.prompt_plus_max_tokens;
  root.querySelector('[data-label="saving"]').textContent = pagedBlocks > 0 && tightest > pagedBlocks
    ? `Paging holds ${(tightest / pagedBlocks).toFixed(1)}× less memory than even prompt + max_tokens reservations.`
    : "";
}
