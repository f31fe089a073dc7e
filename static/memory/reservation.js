/**
 * "Contiguous allocation would reserve" versus paged: the blocks the same live requests would pin if each
 * pre-allocated its maximum length (as pre-PagedAttention servers did) against the blocks paging holds now.
 * Both bars share one scale with the pool size, so a reservation that would not fit runs past the pool mark.
 */

function pct(part, whole) {
  return whole > 0 ? (100 * part) / whole : 0;
}

/**
 * @param {HTMLElement} root  holds [data-bar="paged"], [data-bar="contiguous"], [data-label=...] and .pool-mark's
 * @param {{pagedBlocks: number, contiguousBlocks: number, totalBlocks: number}} figures
 */
export function renderReservation(root, { pagedBlocks, contiguousBlocks, totalBlocks }) {
  const scale = Math.max(totalBlocks, contiguousBlocks, 1);
  root.querySelector('[data-bar="paged"]').style.width = `${pct(pagedBlocks, scale)}%`;
  root.querySelector('[data-bar="contiguous"]').style.width = `${pct(contiguousBlocks, scale)}%`;
  for (const mark of root.querySelectorAll(".pool-mark")) mark.style.left = `${pct(totalBlocks, scale)}%`;
  root.querySelector('[data-label="paged"]').textContent =
    `${pagedBlocks} blocks · ${pct(pagedBlocks, totalBlocks).toFixed(1)}% of the pool`;
  const over = contiguousBlocks > totalBlocks;
  root.querySelector('[data-label="contiguous"]').textContent =
    `${contiguousBlocks} blocks · ${pct(contiguousBlocks, totalBlocks).toFixed(1)}% of the pool` +
    (over ? ` — would not fit (${(contiguousBlocks / totalBlocks).toFixed(1)}× the pool)` : "");
  root.classList.toggle("overflow", over);
  const saving = root.querySelector('[data-label="saving"]');
  saving.textContent = pagedBlocks > 0 && contiguousBlocks > pagedBlocks
    ? `Paging holds ${(contiguousBlocks / pagedBlocks).toFixed(1)}× less memory for the same requests.`
    : "";
}
