/**
 * Structured replies on the chat page: the "response format" control (plain text, any JSON object, or a
 * JSON schema typed in an editor), a JSON reply shown formatted, and the grammar mask's work per token.
 *
 * The control checks only that the schema is a JSON object; the server's engine is the judge of the
 * schema itself (keywords it cannot enforce, bad patterns) and answers an `error` frame naming the problem.
 * The choice and the schema text are remembered in localStorage.
 */

import { loadSaved } from "./params.js";

const STORAGE_KEY = "paged-playground.response-format.v1";
const EXAMPLE_SCHEMA = {
  type: "object",
  properties: { name: { type: "string", maxLength: 40 }, age: { type: "integer", minimum: 0, maximum: 120 } },
  required: ["name", "age"],
};

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class ResponseFormatControl {
  /** @param {HTMLElement} container */
  constructor(container) {
    const saved = loadSaved(STORAGE_KEY);
    this.select = el("select");
    this.select.name = "response_format";
    this.select.setAttribute("aria-label", "Response format");
    for (const [value, label] of [["text", "Text"], ["json_object", "JSON"], ["json_schema", "JSON schema"]]) {
      const option = el("option", "", label);
      option.value = value;
      this.select.append(option);
    }
    this.select.value = saved.type ?? "text";
    this.schema = el("textarea", "schema-editor");
    this.schema.rows = 8;
    this.schema.spellcheck = false;
    this.schema.setAttribute("aria-label", "JSON schema");
    this.schema.value = saved.schema ?? JSON.stringify(EXAMPLE_SCHEMA, null, 2);
    this.error = el("span", "param-error");
    this.help = el("span", "param-help");
    this.showMask = el("input");
    this.showMask.type = "checkbox";
    this.showMask.checked = saved.showMask ?? false;
    const maskSwitch = el("label", "switch");
    maskSwitch.append(this.showMask, " Show what the grammar mask removed, per token");
    container.append(this.select, this.schema, this.error, this.help, maskSwitch);
    container.addEventListener("input", () => { this.read(); this.save(); });
    container.addEventListener("change", () => { this.read(); this.save(); });
    this.read();
  }

  save() {
    localStorage.setItem(STORAGE_KEY, JSON.stringify({ type: this.select.value, schema: this.schema.value,
      showMask: this.showMask.checked }));
  }

  /** `{format}` to send (null for plain text) or `{error}`; marks the editor while it is wrong. */
  read() {
    const type = this.select.value;
    this.schema.hidden = type !== "json_schema";
    this.help.textContent = type === "text" ? "" : "Replies are constrained by a grammar mask: they always parse.";
    let result = { format: null };
    if (type === "json_object") result = { format: { type: "json_object" } };
    if (type === "json_schema") {
      try {
        const schema = JSON.parse(this.schema.value);
        if (schema === null || typeof schema !== "object" || Array.isArray(schema)) throw new Error("a JSON schema is an object");
        result = { format: { type: "json_schema", json_schema: { name: "schema", schema } } };
      } catch (exc) {
        result = { error: `the schema is not valid: ${exc.message}` };
      }
    }
    this.error.textContent = result.error ?? "";
    this.schema.toggleAttribute("aria-invalid", Boolean(result.error));
    return result;
  }
}

/** The reply as indented JSON when it is JSON, else null (a reply cut short by max tokens is not). */
export function formatJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return null;
  }
}

/**
 * The mask's work on one sample: a bar per generated token whose height is how many tokens were left
 * allowed (log scale: one allowed token is a forced step, the whole vocabulary is a free one).
 * @param {{removed: number[], vocab_size: number}} mask
 */
export function maskView(mask) {
  const { removed, vocab_size: vocab } = mask;
  const box = el("details", "mask-view");
  const mean = removed.reduce((a, b) => a + b, 0) / Math.max(removed.length, 1);
  const forced = removed.filter((r) => r === vocab - 1).length;
  box.append(el("summary", "", `Grammar mask: removed ${Math.round(mean).toLocaleString()} of ${vocab.toLocaleString()} `
    + `tokens per step on average; ${forced} of ${removed.length} steps had one choice left`));
  const bars = el("div", "mask-bars");
  removed.forEach((r, step) => {
    const allowed = vocab - r;
    const bar = el("span", "mask-bar");
    bar.style.height = `${Math.max(4, (100 * Math.log(allowed)) / Math.log(vocab))}%`;
    bar.title = `token ${step + 1}: ${allowed.toLocaleString()} allowed, ${r.toLocaleString()} removed`;
    bars.append(bar);
  });
  box.append(bars);
  return box;
}
