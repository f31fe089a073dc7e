/**
 * Compare: the next prompt answered twice at once, under settings A and B (sampling settings and model: the base
 * model against a LoRA adapter, say), in two panes side by side. Each pane is an ordinary reply view
 * (transcript.js) fed by its own ReplyStream (stream.js), so it streams, renders Markdown inertly and ends
 * with the same stats and cache receipt as a chat reply. The forms are ParamsForms built from the server's one
 * table of sampling fields, like the settings panel's.
 *
 * On the socket it is one `compare` frame (docs/protocol.md): the server checks both sides by the rules of a
 * generate frame (a bad field is refused naming its side), admits both or neither (a concurrency limit that
 * allows one stream refuses the run with an error, and no slot stays taken), and answers `compare_started`
 * with both request ids; each side's frames are then those of any generation.
 *
 * Nothing is saved: a compare run tries settings on a prompt, and the conversation keeps one line of replies.
 * The prompt stays in the message box; "Use A's settings" copies A's settings and model into the settings panel
 * and closes Compare, so Send then continues the conversation with the settings chosen.
 *
 * Stop (the composer's button, or Esc) stops both sides; a pane's own Stop stops that side alone. A stopped side
 * ends with its `done` (finish "cancelled"), keeping its text and its receipt.
 */

import { ParamsForm } from "./params.js";
import { ReplyStream } from "./stream.js";
import { ReplyView, finishReply } from "./transcript.js";

const SIDES = ["A", "B"];

/** One side: its settings form and model, and the reply streaming in its pane. */
class Side {
  constructor(root, name, models) {
    const part = (selector) => root.querySelector(selector);
    this.name = name;
    this.formEl = part(".params-form");
    this.settingsBox = part(".compare-settings");
    this.form = null; // built when Compare first opens (build())
    this.model = part(".compare-model select");
    for (const model of models) this.model.append(new Option(model, model));
    part(".compare-model").hidden = models.length < 2;
    this.summary = part(".compare-summary");
    this.pane = part(".compare-pane");
    this.stopButton = part(".compare-stop");
    this.useButton = part(".compare-use");
    this.error = part(".compare-error");
    /** The run shown: {stream, view, requestId, cancelRequested, json, showMask}; `ended` once it is over. */
    this.run = null;
  }

  /** Build the settings form from `specs`, holding `params`, and take `model`. */
  build(specs, params, model) {
    this.form = new ParamsForm(this.formEl, specs, { storageKey: null });
    this.form.fill(params);
    this.model.value = model;
  }

  get streaming() {
    return this.run !== null && !this.run.ended;
  }

  /** The side's settings for the compare frame, or null after marking the bad fields. */
  read() {
    const { params, errors } = this.form.read();
    const bad = Object.keys(errors);
    this.showError(bad.length ? `Fix settings ${this.name} first: ${bad.map((k) => `${k} ${errors[k]}`).join("; ")}.` : "");
    if (bad.length) return null;
    return { params, ...(this.model.value ? { model: this.model.value } : {}) };
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = !message;
  }

  /** A fresh reply view in the pane for a run of `n` samples; the settings fold away (the header sums them up). */
  begin(n, markdown, display) {
    const view = new ReplyView({ n, markdown, onChoose: (v, index) => v.markChosen(index) });
    this.pane.replaceChildren(view.el);
    this.settingsBox.open = false;
    this.run = { stream: new ReplyStream(n), view, requestId: null, cancelRequested: false, ended: false, ...display };
    this.showError("");
    this.stopButton.hidden = false;
    this.stopButton.disabled = false;
  }

  end() {
    this.run.ended = true;
    this.stopButton.hidden = true;
  }

  fail(message) {
    if (!this.streaming) return;
    this.run.stream.fail("error");
    this.run.view.fail(message);
    this.end();
  }
}

export class Compare {
  /**
   * @param {HTMLElement} root  the Compare section of templates/chat/index.html
   * @param {{specs: object[], models: string[], send: (frame: object) => boolean,
   *          settings: import("./params.js").ParamsForm, model: HTMLSelectElement,
   *          onShow: (open: boolean) => void, onBusy: () => void, onUse: () => void}} page  the sampling specs
   *          and served models; how to send a frame; the settings panel's form and model picker (A and B start
   *          from them, "Use" fills them); onShow: Compare was opened or closed; onBusy: a run started or ended;
   *          onUse: a side's settings went into the settings panel
   */
  constructor(root, { specs, models, send, settings, model, onShow, onBusy, onUse }) {
    this.root = root;
    this.send = send;
    this.settings = settings;
    this.model = model;
    this.onShow = onShow;
    this.onBusy = onBusy;
    this.onUse = onUse;
    this.specs = specs;
    this.markdown = true;
    /** compare frames whose run was dropped (reset) before their `compare_started`: cancelled on arrival. */
    this.abandoned = 0;
    this.prompt = root.querySelector(".compare-prompt");
    this.sides = SIDES.map((name) => new Side(root.querySelector(`.compare-side[data-side="${name}"]`), name,
      models));
    for (const side of this.sides) {
      side.stopButton.addEventListener("click", () => this.stopSide(side));
      side.useButton.addEventListener("click", () => this.use(side));
      side.formEl.addEventListener("input", () => this.summarize());
      side.model.addEventListener("change", () => this.summarize());
    }
    root.querySelector(".compare-close").addEventListener("click", () => this.close());
  }

  get isOpen() {
    return !this.root.hidden;
  }

  /** A run is in flight: sent and not yet answered, or a side still streaming. */
  get running() {
    return this.sides.some((side) => side.streaming);
  }

  /**
   * Show Compare; the first time, A and B are built as copies of the settings panel's settings and model (not
   * before: until Compare is used, the page holds one set of sampling controls).
   */
  open() {
    if (this.sides[0].form === null) {
      const { params } = this.settings.read();
      this.sides.forEach((side) => side.build(this.specs, params, this.model.value));
    }
    this.root.hidden = false;
    this.summarize();
    this.onShow(true);
    this.root.querySelector(".compare-settings summary").focus();
  }

  /** Hide Compare; a run in flight is stopped first. */
  close() {
    this.stop();
    this.root.hidden = true;
    this.onShow(false);
  }

  toggle() {
    if (this.isOpen) this.close();
    else this.open();
  }

  /**
   * Answer `messages` (the conversation and the prompt) under A and B. Returns false, sending nothing, when a
   * side's settings are invalid (the side says which field) or a run is in flight.
   * @param {{format: object|null, showMask: boolean}} responseFormat  the settings panel's, shared by A and B
   */
  run(messages, { format, showMask }) {
    if (this.running) return false;
    const sides = this.sides.map((side) => side.read());
    if (sides.includes(null)) return false;
    if (format) sides.forEach((side) => { side.response_format = format; });
    const last = messages[messages.length - 1];
    this.prompt.textContent = last.content;
    this.prompt.hidden = false;
    this.sides.forEach((side, i) => side.begin(sides[i].params.n ?? 1, this.markdown,
      { json: format !== null, showMask }));
    this.onBusy();
    if (!this.send({ type: "compare", messages, sides })) this.fail("Not connected to the server; try again in a moment.");
    return true;
  }

  /** Stop both sides. */
  stop() {
    this.sides.forEach((side) => this.stopSide(side));
  }

  stopSide(side) {
    if (!side.streaming || side.run.cancelRequested) return;
    side.run.cancelRequested = true;
    side.stopButton.disabled = true;
    if (side.run.requestId) this.send({ type: "cancel", request_id: side.run.requestId });
  }

  /** Clear the panes (a new chat or another conversation was opened); a run in flight is cancelled. */
  reset() {
    if (this.sides.some((side) => side.streaming && side.run.requestId === null)) this.abandoned += 1;
    for (const side of this.sides) {
      if (side.streaming && side.run.requestId) this.send({ type: "cancel", request_id: side.run.requestId });
      if (side.run) side.end();
      side.run = null;
      side.pane.replaceChildren();
      side.showError("");
    }
    this.prompt.hidden = true;
    this.onBusy();
  }

  /** Every side still streaming fails with `message` (the socket was lost, the server refused the run). */
  fail(message) {
    const was = this.running;
    this.sides.forEach((side) => side.fail(message));
    if (was) this.onBusy();
  }

  setMarkdown(markdown) {
    this.markdown = markdown;
    this.sides.forEach((side) => side.run?.view.setMarkdown(markdown));
  }

  /** Copy `side`'s settings and model into the settings panel and close Compare: Send continues with them. */
  use(side) {
    const { params, errors } = side.form.read();
    if (Object.keys(errors).length) {
      side.read();
      return;
    }
    this.settings.fill(params);
    if ([...this.model.options].some((option) => option.value === side.model.value)) {
      this.model.value = side.model.value;
    }
    this.close();
    this.onUse(side.name);
  }

  /** Each side's header names what differs from the other side (settings and model). */
  summarize() {
    if (this.sides.some((side) => side.form === null)) return; // still being built
    const [a, b] = this.sides.map((side) => ({ ...side.form.read().params, model: side.model.value }));
    const shown = (value) => (Array.isArray(value) ? value.join(" | ") : String(value ?? "unset"));
    const names = [...new Set([...Object.keys(a), ...Object.keys(b)])]
      .filter((name) => shown(a[name]) !== shown(b[name]));
    [a, b].forEach((values, i) => {
      this.sides[i].summary.textContent = names.length
        ? names.map((name) => `${name} ${shown(values[name])}`).join(" · ")
        : "same settings as the other side";
    });
  }

  /**
   * A frame from the chat socket: returns true when it was this run's (`compare_started`, a side's frames, or the
   * refusal of the compare frame while it waits for `compare_started`), false to leave it to the page.
   */
  handle(msg) {
    if (msg.type === "compare_started") {
      this.started(msg.request_ids ?? []);
      return true;
    }
    const side = msg.request_id ? this.sides.find((s) => s.run && s.run.requestId === msg.request_id) : null;
    if (!side) {
      if (msg.type !== "error" || msg.request_id) return false;
      if (this.abandoned > 0) { // answers come in order: a run dropped before its answer was sent first
        this.abandoned -= 1;
        return true;
      }
      const waiting = this.sides.some((s) => s.streaming && s.run.requestId === null);
      if (waiting) this.fail(msg.message ?? "The server refused the comparison.");
      return waiting;
    }
    if (!side.streaming) return true;
    const { stream, view } = side.run;
    if (msg.type === "token") {
      const index = stream.applyToken(msg);
      if (index !== null) view.setText(index, stream.texts[index]);
    } else if (msg.type === "done") {
      finishReply(view, stream, msg, side.run);
      side.end();
      this.onBusy();
    } else if (msg.type === "error") {
      side.fail(msg.message ?? "The generation failed.");
      this.onBusy();
    }
    return true;
  }

  started(requestIds) {
    if (this.abandoned > 0) {
      this.abandoned -= 1;
      requestIds.forEach((id) => this.send({ type: "cancel", request_id: id }));
      return;
    }
    this.sides.forEach((side, i) => {
      if (!side.streaming || side.run.requestId !== null) return;
      side.run.requestId = requestIds[i];
      side.run.stream.start(requestIds[i]);
      side.run.view.el.dataset.requestId = requestIds[i];
      if (side.run.cancelRequested) this.send({ type: "cancel", request_id: requestIds[i] });
    });
  }
}
