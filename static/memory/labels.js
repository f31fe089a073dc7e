/**
 * How a request is labelled on the memory view: a colour that stays the same in the block map and in the
 * block-table rows for as long as the page is open, and a shortened id.
 *
 * Colours are handed out in order of first appearance, each hue a golden angle (≈137.5°) from the previous
 * one, so requests that are live at the same time get clearly different colours (hashing ids to hues
 * makes near-collisions common with only a handful of requests).
 */

const GOLDEN_ANGLE = 137.508;
const REMEMBERED = 1000; // colours kept for this many most recent requests
const colors = new Map(); // request id -> colour, oldest first
let handedOut = 0;

/** The colour of a request's own (unshared) blocks. */
export function requestColor(requestId) {
  const id = String(requestId);
  let color = colors.get(id);
  if (color === undefined) {
    const hue = Math.round((handedOut * GOLDEN_ANGLE + 200) % 360);
    const lightness = 46 + (handedOut % 3) * 6;
    color = `hsl(${hue} 68% ${lightness}%)`;
    handedOut += 1;
    colors.set(id, color);
    if (colors.size > REMEMBERED) colors.delete(colors.keys().next().value);
  }
  return color;
}

/** Request ids are 32 hex digits; the first 8 tell the live requests apart (the full id is in a tooltip). */
export function shortId(requestId) {
  const id = String(requestId);
  return id.length > 10 ? `${id.slice(0, 8)}…` : id;
}
