/**
 * Sampling controls: the server's list of sampling fields (`chat_config.sampling`, built from the one table
 * in playground/serving/web/sampling.py, caps applied) builds the form, validates it and reads it back; the
 * page keeps no copy of a field or a range. The server validates again and answers an `error` event, but
 * checking here lets the user fix a field before anything is sent. The last valid values are remembered in
 * localStorage.
 *
 * A spec: {name, label, kind, min, max, min_open, step, value, help, advanced, max_length?}. kind "range":
 * slider plus number box; "int": number box; "optional-int": blank means unset (null); "lines": textarea,
 * one string per non-empty line (at most `max` lines of at most `max_length` characters); "toggle": a
 * checkbox that sends `on` when checked and leaves the field out (its default) when not. `advanced` fields
 * sit in a collapsed "More options" group so the KV panel below stays in view. Compare's settings A and B
 * (compare.js) are two more forms built from the same specs; they are not remembered.
 */

const STORAGE_KEY = "paged-playground.params.v1";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function field(spec) {
  const wrap = el("label", `param param-${spec.kind}`);
  wrap.append(el("span", "param-label", spec.label));
  if (spec.kind === "toggle") {
    const box = el("input");
    Object.assign(box, { type: "checkbox", name: spec.name });
    wrap.prepend(box);
  } else if (spec.kind === "lines") {
    const area = el("textarea");
    area.name = spec.name;
    area.rows = 2;
    wrap.append(area);
  } else {
    const row = el("span", "param-inputs");
    if (spec.kind === "range") {
      const slider = el("input");
      Object.assign(slider, { type: "range", min: spec.min, max: spec.max, step: spec.step, tabIndex: -1 });
      slider.dataset.mirror = spec.name;
      slider.setAttribute("aria-hidden", "true");
      row.append(slider);
    }
    const box = el("input");
    Object.assign(box, { type: "number", name: spec.name, min: spec.min, max: spec.max, step: spec.step ?? 1 });
    if (spec.kind === "optional-int") box.placeholder = "random";
    row.append(box);
    wrap.append(row);
  }
  if (spec.help) wrap.append(el("span", "param-help", spec.help));
  const error = el("span", "param-error");
  error.dataset.errorFor = spec.name;
  wrap.append(error);
  return wrap;
}

/** Parse one field's raw text; returns {value} or {error}. */
function parse(spec, raw) {
  if (spec.kind === "toggle") return { value: raw ? spec.on : null };
  if (spec.kind === "lines") {
    const lines = raw.split("\n").filter((s) => s.length > 0).map((s) => s.replace(/\\n/g, "\n"));
    if (lines.length > spec.max) return { error: `at most ${spec.max}` };
    if (lines.some((line) => line.length > spec.max_length)) return { error: `at most ${spec.max_length} characters each` };
    return { value: lines };
  }
  const text = raw.trim();
  if (text === "") return spec.kind === "optional-int" ? { value: null } : { error: "is required" };
  const value = Number(text);
  if (!Number.isFinite(value)) return { error: "is not a number" };
  if (spec.kind !== "range" && !Number.isInteger(value)) return { error: "must be a whole number" };
  if (value < spec.min || value > spec.max || (spec.min_open && value === spec.min)) {
    return { error: spec.min_open ? `must be above ${spec.min}, at most ${spec.max}` : `must be between ${spec.min} and ${spec.max}` };
  }
  return { value };
}

/** The object saved under `key` in localStorage, or {} (nothing saved, or unreadable). */
export function loadSaved(key = STORAGE_KEY) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? {};
  } catch {
    return {};
  }
}

export class ParamsForm {
  /**
   * Build the controls into `form` and restore the last values.
   * @param {HTMLFormElement} form
   * @param {object[]} specs  `sampling` of chat_config
   * @param {{storageKey?: string|null}} options  where the values are remembered; null: nowhere
   */
  constructor(form, specs, { storageKey = STORAGE_KEY } = {}) {
    this.form = form;
    this.specs = specs;
    this.storageKey = storageKey;
    const basic = el("div", "params-grid");
    const more = el("details", "params-more");
    const moreGrid = el("div", "params-grid");
    more.append(el("summary", "", "More options"), moreGrid);
    form.append(basic, more);
    const saved = storageKey ? loadSaved(storageKey) : {};
    for (const spec of this.specs) {
      (spec.advanced ? moreGrid : basic).append(field(spec));
      this.setValue(spec, spec.name in saved ? saved[spec.name] : spec.value);
    }
    form.addEventListener("input", (event) => this.onInput(event));
    form.addEventListener("submit", (event) => event.preventDefault());
  }

  setValue(spec, value) {
    const input = this.form.elements[spec.name];
    if (spec.kind === "toggle") {
      input.checked = value !== null && value !== undefined;
    } else if (spec.kind === "lines") {
      const lines = typeof value === "string" ? [value] : value ?? [];
      input.value = lines.map((s) => s.replace(/\n/g, "\\n")).join("\n");
    } else {
      input.value = value === null || value === undefined ? "" : String(value);
    }
    const slider = this.form.querySelector(`[data-mirror="${spec.name}"]`);
    if (slider && input.value !== "") slider.value = input.value;
  }

  onInput(event) {
    const mirror = event.target.dataset.mirror;
    if (mirror) this.form.elements[mirror].value = event.target.value;
    else {
      const slider = this.form.querySelector(`[data-mirror="${event.target.name}"]`);
      if (slider) slider.value = event.target.value;
    }
    const { params, errors } = this.read();
    if (this.storageKey && Object.keys(errors).length === 0) {
      const stored = Object.fromEntries(this.specs.map((s) => [s.name, params[s.name] ?? null]));
      localStorage.setItem(this.storageKey, JSON.stringify(stored));
    }
  }

  /** Set every control from `params` (as read() returns them: a field left out takes its default, which for an
   * optional field is unset), as typing would (an input event follows). */
  fill(params) {
    for (const spec of this.specs) this.setValue(spec, spec.name in params ? params[spec.name] : spec.value);
    this.form.dispatchEvent(new Event("input", { bubbles: true }));
  }

  /**
   * Read and validate every field, marking the bad ones: `{params, errors}`; errors maps a field name to a
   * message. Unset fields (blank seed, no stop sequences) are left out of params.
   */
  read() {
    const params = {};
    const errors = {};
    for (const spec of this.specs) {
      const input = this.form.elements[spec.name];
      const { value, error } = parse(spec, spec.kind === "toggle" ? input.checked : input.value);
      this.form.querySelector(`[data-error-for="${spec.name}"]`).textContent = error ?? "";
      input.toggleAttribute("aria-invalid", Boolean(error));
      if (error) {
        errors[spec.name] = error;
        input.closest("details")?.setAttribute("open", "");
      }
      else if (value !== null && !(Array.isArray(value) && value.length === 0)) params[spec.name] = value;
    }
    return { params, errors };
  }

  /** Put every control back to its default and forget the saved values. */
  reset() {
    for (const spec of this.specs) this.setValue(spec, spec.value);
    if (this.storageKey) localStorage.removeItem(this.storageKey);
    this.read();
  }
}
