/**
 * The message list: user turns, and assistant replies whose n samples sit side by side with their stats.
 *
 * Every piece of model or user text reaches the page through renderInto() (Markdown built from DOM nodes, or
 * textContent), never through innerHTML, so a reply that contains `<script>` is shown, not run.
 */

import { renderInto } from "../common/markdown.js";
import { formatJson, maskView } from "./format.js";
import { offerTokens } from "./tokens.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, className, onClick, title) {
  const b = el("button", `btn btn-link btn-small ${className}`, label);
  b.type = "button";
  if (title) b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

const FINISH_LABELS = { stop: "finished", length: "length limit", abort: "cancelled", error: "error" };

/** One stat as `label value`, marked with data-stat so tests and styles can find it. */
function stat(name, label, value) {
  const item = el("span", "stat");
  item.dataset.stat = name;
  item.append(el("span", "stat-label", label), el("span", "stat-value", value));
  return item;
}

function formatMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

function formatRate(rate) {
  return rate === null || rate === undefined ? "–" : `${rate.toFixed(1)} tok/s`;
}

/** What the worker fitted into the context window for this reply (docs/protocol.md, `done.context`). */
function contextView(context) {
  const box = el("div", "receipt-context");
  box.dataset.dropped = String(context.dropped_messages);
  box.append(
    stat("context_window", "window", `${context.prompt_tokens} prompt + ${context.reply_room} reply room of ` +
      `${context.window} tokens`),
    stat("context_dropped_tokens", "dropped",
      `${context.dropped_messages} messages (${context.dropped_turns} turns, ${context.dropped_tokens} tokens)`),
  );
  const note = context.dropped_messages > 0
    ? "The oldest turns did not fit and were left out, whole. That changes the prompt right after the system " +
      "prompt, so the kept turns' blocks have new hashes: they are computed again, not served from the prefix " +
      "cache, unless this very prompt was computed before (a regeneration)."
    : "The whole conversation fitted.";
  box.append(el("p", "receipt-legend", `Policy: ${context.policy}. ${note}`));
  return box;
}

/** An assistant reply: n samples, a stats line and actions. */
export class ReplyView {
  /**
   * @param {{n: number, markdown: boolean, onChoose: (view: ReplyView, index: number) => void,
   *          onRegenerate?: (view: ReplyView) => void}} options  no onRegenerate: no Regenerate action (a
   *          compare pane's reply, which is not a turn of the conversation)
   */
  constructor({ n, markdown, onChoose, onRegenerate }) {
    this.markdown = markdown;
    this.texts = Array.from({ length: n }, () => "");
    this.chosen = 0;
    this.json = false; // a JSON reply (response format): shown indented once it parses
    this.pending = new Set();
    this.frame = null;
    this.el = el("article", "msg msg-assistant");
    this.el.dataset.state = "streaming";
    this.el.setAttribute("aria-busy", "true"); // screen readers announce the reply once, when it is complete
    this.samplesEl = el("div", "samples");
    this.samplesEl.style.setProperty("--n", String(n));
    this.samplesEl.classList.toggle("multi", n > 1);
    this.bodies = [];
    this.sampleEls = [];
    this.finishBadges = [];
    this.useButtons = [];
    for (let i = 0; i < n; i += 1) {
      const sample = el("section", "sample");
      sample.dataset.index = String(i);
      const badge = el("span", "finish-badge");
      this.finishBadges.push(badge);
      const body = el("div", "msg-body");
      body.append(el("span", "typing", "…"));
      this.bodies.push(body);
      if (n > 1) {
        const head = el("div", "sample-head");
        const use = button("Continue with this", "use", () => onChoose(this, i),
          "Use this sample as the assistant turn of the conversation");
        this.useButtons.push(use);
        head.append(el("span", "sample-name", `Sample ${i + 1}`), badge, this.copyButton(i), use);
        sample.append(head);
      }
      sample.append(body);
      this.sampleEls.push(sample);
      this.samplesEl.append(sample);
    }
    this.meta = el("div", "reply-meta");
    this.notice = el("p", "reply-notice");
    this.notice.hidden = true;
    this.actions = el("div", "reply-actions");
    this.regenerate = onRegenerate ? button("↻ Regenerate", "regenerate", () => onRegenerate(this),
      "Sample this reply again (the old one stays as a branch)") : null;
    if (this.regenerate) this.actions.append(this.regenerate);
    if (n === 1) this.actions.append(this.copyButton(0));
    this.el.append(this.samplesEl, this.notice, this.meta, this.actions);
    this.markChosen(0);
  }

  copyButton(index) {
    return button("Copy", "copy", () => navigator.clipboard?.writeText(this.texts[index]), "Copy the text");
  }

  /** Replace sample `index`'s text; rendering is batched to one pass per animation frame. */
  setText(index, text) {
    this.texts[index] = text;
    this.pending.add(index);
    if (this.frame === null) {
      this.frame = requestAnimationFrame(() => this.flush());
    }
  }

  /** Render pending samples now (also called when the stream ends, so the final text never waits). */
  flush() {
    if (this.frame !== null) cancelAnimationFrame(this.frame);
    this.frame = null;
    for (const i of this.pending) {
      const pretty = this.json ? formatJson(this.texts[i]) : null;
      if (pretty === null) renderInto(this.bodies[i], this.texts[i], { markdown: this.markdown });
      else this.bodies[i].replaceChildren(el("pre", "json-reply", pretty));
    }
    this.pending.clear();
  }

  setMarkdown(markdown) {
    this.markdown = markdown;
    this.texts.forEach((_t, i) => this.pending.add(i));
    this.flush();
  }

  markChosen(index) {
    this.chosen = index;
    [...this.samplesEl.children].forEach((s, i) => s.classList.toggle("chosen", i === index));
    this.useButtons.forEach((b, i) => { b.hidden = i === index; });
  }

  /** Show the final texts, finish reasons and stats of a finished stream (or a saved reply). */
  finish({ texts, finishReasons, usage, timing, gaps = 0, json = false, masks = [], receipt = null,
           promptSegments = null, context = null }) {
    this.json = json;
    texts.forEach((t, i) => this.setText(i, t));
    masks.forEach((mask, i) => { if (mask && this.sampleEls[i]) this.sampleEls[i].append(maskView(mask)); });
    this.flush();
    this.el.dataset.state = "done";
    this.el.removeAttribute("aria-busy");
    finishReasons.forEach((reason, i) => {
      this.finishBadges[i].textContent = reason ? FINISH_LABELS[reason] ?? reason : "";
      this.finishBadges[i].dataset.reason = reason ?? "";
    });
    const items = [];
    if (usage) {
      items.push(
        stat("prompt_tokens", "prompt", String(usage.prompt_tokens ?? "–")),
        stat("completion_tokens", "completion", String(usage.completion_tokens ?? "–")),
        stat("cached_tokens", "cached prefix", String(usage.cached_tokens ?? "–")),
      );
    }
    if (timing) {
      items.push(
        stat("ttft", "TTFT", formatMs(timing.ttft_ms)),
        stat("tokens_per_s", "", formatRate(timing.tokens_per_s)),
      );
    }
    if (finishReasons.length === 1 && finishReasons[0]) {
      items.push(stat("finish_reason", "finish", finishReasons[0]));
    }
    if (context?.dropped_messages > 0) {
      items.push(stat("context_dropped", "left out", `${context.dropped_messages} oldest messages (window)`));
    }
    if (receipt) items.push(this.receiptToggle(receipt, promptSegments, context));
    this.meta.replaceChildren(...items);
    if (gaps > 0) this.showNotice(`${gaps} streamed update(s) were lost in transit; the final text above is complete.`);
  }

  /** "Cache receipt": where the prompt's K/V came from (coloured by block) and where the time went. */
  receiptToggle(receipt, segments, context) {
    const details = el("details", "receipt");
    details.append(el("summary", "", "cache receipt"));
    const figures = el("div", "receipt-figures");
    figures.append(
      stat("receipt_cached", "cached", `${receipt.cached_tokens} tokens (${receipt.cached_blocks} blocks)`),
      stat("receipt_recomputed", "recomputed", String(receipt.recomputed_tokens)),
      stat("receipt_preemptions", "preemptions", String(receipt.preemptions)),
      stat("receipt_queue", "queue", formatMs(receipt.queue_ms)),
      stat("receipt_prefill", "prefill", formatMs(receipt.prefill_ms)),
      stat("receipt_decode", "decode", formatMs(receipt.decode_ms)),
      stat("receipt_ttft", "TTFT", formatMs(receipt.ttft_ms)),
      stat("receipt_tpot", "TPOT", formatMs(receipt.tpot_ms)),
    );
    details.append(figures);
    if (context) details.append(contextView(context));
    if (segments && segments.length) {
      const prompt = el("pre", "provenance");
      let block = -1;
      for (const segment of segments) {
        const piece = el("span", `prov prov-${segment.source}`, segment.text);
        piece.dataset.source = segment.source;
        piece.dataset.block = segment.block;
        if (segment.block !== block) piece.classList.add("prov-block-start");
        piece.title = `block ${segment.block}: ${segment.source}`;
        block = segment.block;
        prompt.append(piece);
      }
      details.append(el("p", "receipt-legend",
        "The prompt as the engine saw it, one box per KV block: green came from the prefix cache, " +
        "plain was computed, red was recomputed after a preemption."), prompt);
    }
    return details;
  }

  /** The generation failed: keep the partial text and say why. */
  fail(message) {
    this.flush();
    this.el.dataset.state = "error";
    this.el.removeAttribute("aria-busy");
    this.bodies.forEach((body, i) => {
      if (this.texts[i] === "") body.replaceChildren();
    });
    this.showNotice(message, true);
  }

  showNotice(message, isError = false) {
    this.notice.textContent = message;
    this.notice.classList.toggle("error", isError);
    this.notice.hidden = false;
  }

  /** Any reply can be regenerated, while nothing is streaming. */
  setRegenerable(enabled) {
    if (this.regenerate) this.regenerate.hidden = !enabled;
  }
}

/**
 * Show a stream's `done` frame `msg` in its view: the final texts, stats, cache receipt and, when asked for, the
 * grammar masks (`showMask`) and token probabilities; the same for a chat reply and a compare pane.
 * @param {ReplyView} view
 * @param {import("./stream.js").ReplyStream} stream
 * @param {{json: boolean, showMask: boolean}} options  how the response format asked the reply to be shown
 */
export function finishReply(view, stream, msg, { json, showMask }) {
  stream.finish(msg);
  view.finish({ texts: stream.texts, finishReasons: stream.finishReasons, usage: stream.usage,
    timing: stream.timing, gaps: stream.gaps, json,
    masks: showMask ? (msg.outputs ?? []).map((o) => o.grammar_mask ?? null) : [],
    receipt: stream.receipt, promptSegments: stream.promptSegments, context: stream.context });
  offerTokens(view, msg.outputs);
}

/**
 * A turn's tools: ‹ k/n › between its branches (when it has siblings), Edit (user turns) and Delete (saved turns).
 * @param {HTMLElement} turnEl
 * @param {{siblings: number[], id: number|null, role: string}} turn
 * @param {{onBranch: (id: number) => void, onEdit: () => void, onDelete: (id: number) => void}} handlers
 */
export function turnTools(turnEl, turn, { onBranch, onEdit, onDelete }) {
  turnEl.querySelector(":scope > .turn-tools")?.remove();
  const tools = el("div", "turn-tools");
  const siblings = turn.siblings ?? [];
  const at = siblings.indexOf(turn.id);
  if (siblings.length > 1 && at >= 0) {
    const nav = el("span", "branch-nav");
    const prev = button("‹", "branch-prev", () => onBranch(siblings[at - 1]), "Previous branch");
    const next = button("›", "branch-next", () => onBranch(siblings[at + 1]), "Next branch");
    prev.disabled = at === 0;
    next.disabled = at === siblings.length - 1;
    prev.setAttribute("aria-label", "Previous branch");
    next.setAttribute("aria-label", "Next branch");
    nav.append(prev, el("span", "branch-count", `${at + 1}/${siblings.length}`), next);
    tools.append(nav);
  }
  if (turn.role === "user") tools.append(button("Edit", "edit", onEdit, "Edit and send again (a new branch)"));
  if (turn.id !== null && turn.id !== undefined) {
    tools.append(button("Delete", "delete", () => onDelete(turn.id), "Delete this message and what follows it"));
  }
  turnEl.append(tools);
}

/** The list of turns of the open conversation. */
export class Transcript {
  /**
   * @param {HTMLElement} container
   * @param {{onChoose: (view: ReplyView, index: number) => void, onRegenerate: (view: ReplyView) => void}} handlers
   */
  constructor(container, handlers) {
    this.container = container;
    this.handlers = handlers;
    this.markdown = true;
    this.replies = [];
  }

  clear() {
    this.container.replaceChildren();
    this.replies = [];
  }

  /** Returns the element, so the caller can remove it again (an edit drops it and what follows). */
  addUser(text) {
    const msg = el("article", "msg msg-user");
    const body = el("div", "msg-body plain", text);
    msg.append(body);
    this.container.append(msg);
    return msg;
  }

  addReply(n) {
    const view = new ReplyView({ n, markdown: this.markdown, ...this.handlers });
    this.replies.push(view);
    this.container.append(view.el);
    return view;
  }

  setMarkdown(markdown) {
    this.markdown = markdown;
    this.replies.forEach((r) => r.setMarkdown(markdown));
  }

  /** Show the regenerate action on every reply, only when `enabled`; the turn tools likewise. */
  setRegenerable(enabled) {
    this.replies.forEach((r) => r.setRegenerable(enabled));
    this.container.classList.toggle("busy", !enabled);
  }

  /** Drop `el` and every turn after it (an edit or a regeneration replaces them with a new branch). */
  truncateFrom(el) {
    const doomed = new Set();
    for (let node = el; node; node = node.nextElementSibling) doomed.add(node);
    this.replies = this.replies.filter((r) => !doomed.has(r.el));
    doomed.forEach((node) => node.remove());
  }
}
