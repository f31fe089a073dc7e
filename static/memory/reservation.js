/**
 * "Contiguous allocation would reserve" versus paged: the blocks the same live requests would pin if each
 * pre-allocated its maximum length (as pre-PagedAttention servers did) against the blocks paging holds now.
 * Both bars share one scale with the pool size, so a reservation that would not fit runs past the pool mark.
 * Each bar also says how much of what it holds is empty: internal fragmentation, which paging confines to
 * the last, partly filled block of each sequence.
 */

function pct(part, whole) {
  return whole > 0 ? (100 * part) / whole : 0;
}

/**
 * @param {HTMLElement} root  holds [data-bar="paged"], [data-bar="contiguous"], [data-label=...] and .pool-mark's
 * @param {{pagedBlocks: number, contiguousBlocks: number, totalBlocks: number, blockSize: number,
 *          tokensHeld: number, slotUtilization: number | null}} figures
 *   tokensHeld: the live requests' context lengths summed; slotUtilization: the engine's filled share of the
 *   slots of its used blocks (0..1).
 */
export function renderReservation(root, figures) {
  const { pagedBlocks, contiguousBlocks, totalBlocks, blockSize, tokensHeld, slotUtilization } = figures;
  const scale = Math.max(totalBlocks, contiguousBlocks, 1);
  root.querySelector('[data-bar="paged"]').style.width = `${pct(pagedBlocks, scale)}%`;
  root.querySelector('[data-bar="contiguous"]').style.width = `${pct(contiguousBlocks, scale)}%`;
  for (const mark of root.querySelectorAll(".pool-mark")) mark.style.left = `${pct(totalBlocks, scale)}%`;

  const pagedEmpty = pagedBlocks > 0 && slotUtilization !== null
    ? ` · ${(100 * (1 - slotUtilization)).toFixed(1)}% of its slots empty`
    : "";
  root.querySelector('[data-label="paged"]').textContent =
    `${pagedBlocks} blocks · ${pct(pagedBlocks, totalBlocks).toFixed(1)}% of the pool${pagedEmpty}`;
  const over = contiguousBlocks > totalBlocks;
  const reservedSlots = contiguousBlocks * blockSize;
  const contiguousEmpty = reservedSlots > 0
    ? ` · ${(100 - pct(tokensHeld, reservedSlots)).toFixed(1)}% of it empty`
    : "";
  root.querySelector('[data-label="contiguous"]').textContent =
    `${contiguousBlocks} blocks · ${pct(contiguousBlocks, totalBlocks).toFixed(1)}% of the pool${contiguousEmpty}` +
    (over ? ` — would not fit (${(contiguousBlocks / totalBlocks).toFixed(1)}× the pool)` : "");
  root.classList.toggle("overflow", over);
  root.querySelector('[data-label="saving"]').textContent = pagedBlocks > 0 && contiguousBlocks > pagedBlocks
    ? `Paging holds ${(contiguousBlocks / pagedBlocks).toFixed(1)}× less memory for the same requests.`
    : "";
}
