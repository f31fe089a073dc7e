/**
 * The composer's context meter: conversation + draft + the reply's max_tokens against the model's window.
 *
 * The window and the estimate's figures come from the server (playground/chat/window.py, in the page's config).
 * The window is null until a worker has loaded its model and reported the max_model_len it derived; the meter
 * then counts tokens without a bar, and takes the window from the first reply's `done` frame.
 * After a reply the worker's `done` frame says exactly how many tokens the conversation took
 * (`context.conversation_tokens`, plus the reply's completion tokens); that count is used for as long as the
 * conversation it measured is unchanged. Anything newer (the draft, a system prompt just edited, a conversation
 * opened from the history) is estimated and the total is shown with "~".
 */

const number = (n) => Math.round(n).toLocaleString("en-US");

export class ContextMeter {
  /**
   * @param {HTMLElement} el  the meter's container (role="meter")
   * @param {{window: ?number, chars_per_token: number, tokens_per_message: number}} figures
   */
  constructor(el, figures) {
    this.el = el;
    this.window = figures.window;
    this.charsPerToken = figures.chars_per_token;
    this.tokensPerMessage = figures.tokens_per_message;
    this.measured = null; // {key, tokens}: the worker's exact count of the conversation `key` names
    this.bar = el.querySelector(".meter-fill");
    this.label = el.querySelector(".meter-label");
    el.setAttribute("aria-valuemin", "0");
  }

  /** Estimated tokens of one message's text, its template markers included. */
  estimate(text) {
    return Math.ceil(text.length / this.charsPerToken) + this.tokensPerMessage;
  }

  /**
   * Remember the worker's count for this conversation (messages sent + the reply), and the window it used
   * (a worker's max_model_len is the authority).
   */
  measure(messages, context, completionTokens) {
    this.window = context.window;
    this.measured = { key: keyOf(messages), tokens: context.conversation_tokens + completionTokens + this.tokensPerMessage };
  }

  /** Redraw for the conversation `messages` (system prompt first, if any), the draft text and max_tokens. */
  update(messages, draft, maxTokens) {
    const exact = this.measured !== null && this.measured.key === keyOf(messages);
    const conversation = exact ? this.measured.tokens : messages.reduce((sum, m) => sum + this.estimate(m.content), 0);
    const draftTokens = draft.trim() ? this.estimate(draft) : 0;
    const used = conversation + draftTokens + maxTokens;
    const approx = !exact || draftTokens > 0 ? "~" : "";
    const parts = `conversation ${exact ? "" : "~"}${number(conversation)} · draft ~${number(draftTokens)} · ` +
      `reply ${number(maxTokens)}`;
    this.el.dataset.used = String(used);
    if (this.window == null) {
      this.el.dataset.state = "unknown";
      this.el.removeAttribute("aria-valuemax");
      this.el.removeAttribute("aria-valuenow");
      this.bar.style.width = "0";
      this.show(`Context ${approx}${number(used)} tokens · ${parts} — window known once a worker has loaded the model`);
      return;
    }
    const over = used - this.window;
    this.el.dataset.state = over > 0 ? "over" : used > 0.8 * this.window ? "high" : "ok";
    this.el.setAttribute("aria-valuemax", String(this.window));
    this.el.setAttribute("aria-valuenow", String(Math.min(used, this.window)));
    this.bar.style.width = `${Math.min(100, (100 * used) / this.window)}%`;
    let text = `Context ${approx}${number(used)} / ${number(this.window)} tokens · ${parts}`;
    if (over > 0) text += ` — over by ~${number(over)}: the oldest turns will be dropped`;
    this.show(text);
  }

  show(text) {
    this.label.textContent = text;
    this.el.setAttribute("aria-valuetext", text);
  }
}

/** A conversation's identity for the meter: its roles and texts. */
function keyOf(messages) {
  return JSON.stringify(messages.map((m) => [m.role, m.content]));
}
