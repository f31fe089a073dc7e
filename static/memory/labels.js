/**
 * Stable colours: a request keeps its colour in the block map and in the block-table rows, on every
 * snapshot and every worker, because the colour is derived from its id alone.
 */

/** A 32-bit FNV-1a hash of a string. */
function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** The colour of a request's own (unshared) blocks. */
export function requestColor(requestId) {
  const h = hash(String(requestId));
  const hue = h % 360;
  const lightness = 48 + ((h >>> 9) % 12);
  return `hsl(${hue} 68% ${lightness}%)`;
}
