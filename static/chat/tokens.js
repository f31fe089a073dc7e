/**
 * A finished reply shown as its tokens, with their probabilities: when the request asked for `logprobs`
 * (the settings' "Token probabilities" toggle), each `done` output carries, per generated token,
 * `{token, logprob, top: [{token, logprob}, ...]}` (docs/protocol.md). Each sample gets a "Tokens" button that
 * swaps its text for its tokens; a token's background shows how unlikely it was (the less likely, the
 * stronger), and hovering or focusing it shows its probability and the alternatives'.
 *
 * Token texts are model output: they reach the page through textContent only, never as markup.
 */

let tipCount = 0;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A probability as a percent: one decimal, and "<0.1%" below that. */
export function percent(logprob) {
  if (logprob === null || logprob === undefined) return "–";
  const p = 100 * Math.exp(logprob);
  return p < 0.05 ? "<0.1%" : `${p.toFixed(1)}%`;
}

/** A token as the tip shows it: quoted, with whitespace and control characters written out (JSON's way). */
function quoted(token) {
  return JSON.stringify(token);
}

/** The tip's content for one token: its own probability, then the alternatives, the chosen one marked. */
function fillTip(tip, entry) {
  const list = el("ol", "tok-alts");
  for (const alt of entry.top ?? []) {
    const row = el("li", alt.token === entry.token ? "tok-alt chosen" : "tok-alt");
    row.append(el("span", "tok-alt-text", quoted(alt.token)), el("span", "tok-alt-p", percent(alt.logprob)));
    list.append(row);
  }
  const head = el("p", "tok-chosen");
  head.append(el("span", "tok-alt-text", quoted(entry.token)), el("span", "tok-alt-p", percent(entry.logprob)));
  tip.replaceChildren(head, el("p", "tok-tip-title", "Most likely at this step:"), list);
}

/**
 * The tokens of one sample: one focusable span per token, and one tip for them all (shown beside the token
 * hovered or focused; Escape hides it).
 * @param {{token: string, logprob: number|null, top: {token: string, logprob: number}[]}[]} entries
 */
export function tokenView(entries) {
  const box = el("div", "token-view");
  box.append(el("p", "token-legend",
    "One box per token; the less likely the model found a token, the stronger its background. Hover or focus " +
    "a token (Tab) for its probability and the alternatives."));
  const line = el("div", "token-line");
  const tip = el("div", "tok-tip");
  tip.id = `tok-tip-${(tipCount += 1)}`;
  tip.setAttribute("role", "tooltip");
  tip.hidden = true;
  entries.forEach((entry, i) => {
    const token = el("span", "tok", entry.token === "" ? "∅" : entry.token);
    token.tabIndex = 0;
    token.dataset.index = String(i);
    const p = entry.logprob === null || entry.logprob === undefined ? 1 : Math.exp(entry.logprob);
    token.dataset.p = p.toFixed(4);
    token.style.setProperty("--p", String(p));
    token.setAttribute("aria-describedby", tip.id);
    line.append(token);
  });
  const show = (token) => {
    if (!token) return;
    fillTip(tip, entries[Number(token.dataset.index)]);
    tip.hidden = false;
    tip.style.left = `${token.offsetLeft}px`;
    tip.style.top = `${token.offsetTop + token.offsetHeight + 4}px`;
  };
  const hide = () => { tip.hidden = true; };
  line.addEventListener("mouseover", (event) => show(event.target.closest(".tok")));
  line.addEventListener("focusin", (event) => show(event.target.closest(".tok")));
  line.addEventListener("mouseleave", () => { if (!line.contains(document.activeElement)) hide(); });
  line.addEventListener("focusout", (event) => { if (!line.contains(event.relatedTarget)) hide(); });
  line.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !tip.hidden) {
      event.stopPropagation();
      hide();
    }
  });
  box.append(line, tip);
  return box;
}

/**
 * Give each sample of a finished reply that came with logprobs a "Tokens" button that shows it as tokens
 * (and back). `outputs` are the `done` frame's; each sample gets its own tokens.
 * @param {import("./transcript.js").ReplyView} view
 * @param {object[]} outputs
 */
export function offerTokens(view, outputs) {
  for (const output of outputs ?? []) {
    const index = output.index ?? 0;
    const sample = view.sampleEls[index];
    if (!sample || !Array.isArray(output.logprobs) || output.logprobs.length === 0) continue;
    const body = view.bodies[index];
    const tokens = tokenView(output.logprobs);
    tokens.hidden = true;
    body.after(tokens);
    const toggle = el("button", "btn btn-link btn-small show-tokens", "Tokens");
    toggle.type = "button";
    toggle.title = "Show this reply as tokens, with their probabilities";
    toggle.setAttribute("aria-pressed", "false");
    toggle.addEventListener("click", () => {
      const on = tokens.hidden;
      tokens.hidden = !on;
      body.hidden = on;
      toggle.setAttribute("aria-pressed", String(on));
    });
    (sample.querySelector(".sample-head") ?? view.actions).append(toggle);
  }
}
