/**
 * Presets: the user's named system prompt, sampling settings and model choice (where the page has a model
 * picker), kept by the server under /api/presets/ for their owner (docs/protocol.md, "JSON endpoints").
 *
 * Applying a preset only fills the page's controls (system prompt, sampling form, model picker), as typing
 * into them would: the conversation on screen and its saved messages are untouched, and the next reply is
 * generated with the new settings. The server checks what is saved with the one sampling table, so the page
 * keeps no ranges here; its refusals name the field and are shown as they come.
 *
 * Every action is a real button or select, so the picker works from the keyboard; overwrite and delete ask
 * first.
 */

import { requestJson, sending } from "./conversations.js";

/** The presets endpoints, rooted at `baseUrl` ("/api/presets/"). */
export class PresetApi {
  constructor(baseUrl) {
    this.baseUrl = baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`;
  }

  /** The caller's presets, by name: [{id, name, system_prompt, params, model, updated_at}]. */
  async list() {
    return (await requestJson(this.baseUrl)).presets;
  }

  /** Save a new preset ({name, system_prompt, params, model}); the preset as stored. */
  async create(preset) {
    return requestJson(this.baseUrl, sending("POST", JSON.stringify(preset)));
  }

  /** Rename and/or overwrite; the preset as stored. */
  async update(id, changes) {
    return requestJson(this.url(id), sending("PATCH", JSON.stringify(changes)));
  }

  async remove(id) {
    await requestJson(this.url(id), sending("DELETE"));
  }

  url(id) {
    return `${this.baseUrl}${encodeURIComponent(id)}/`;
  }
}

export class PresetPicker {
  /**
   * @param {HTMLElement} root  the settings panel's presets section (templates/chat/index.html)
   * @param {{url: string, paramsForm: import("./params.js").ParamsForm, system: HTMLTextAreaElement,
   *          model: HTMLSelectElement}} controls  what a preset fills in, and where presets are kept
   */
  constructor(root, { url, paramsForm, system, model }) {
    this.api = new PresetApi(url);
    this.paramsForm = paramsForm;
    this.system = system;
    this.model = model;
    const part = (id) => root.querySelector(`#${id}`);
    this.select = part("preset-select");
    this.buttons = { apply: part("preset-apply"), overwrite: part("preset-overwrite"),
      rename: part("preset-rename"), remove: part("preset-delete") };
    this.saveButton = part("preset-save");
    this.nameForm = part("preset-name-form");
    this.nameInput = part("preset-name");
    this.status = part("preset-status");
    /** The presets listed, by id. */
    this.presets = new Map();
    /** "save" or "rename" while the name form is open. */
    this.nameMode = null;

    this.select.addEventListener("change", () => this.updateButtons());
    this.buttons.apply.addEventListener("click", () => this.apply());
    this.buttons.overwrite.addEventListener("click", () => this.overwrite());
    this.buttons.rename.addEventListener("click", () => this.openNameForm("rename"));
    this.buttons.remove.addEventListener("click", () => this.remove());
    this.saveButton.addEventListener("click", () => this.openNameForm("save"));
    this.nameForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submitName();
    });
    part("preset-name-cancel").addEventListener("click", () => this.closeNameForm());
    this.nameForm.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      event.stopPropagation(); // the page's Escape stops a reply; here it only closes the form
      this.closeNameForm();
    });
    this.updateButtons();
  }

  /** Fetch the list and show it, choosing `chooseId` (default: the preset chosen now) if it is still there. */
  async load(chooseId = this.select.value) {
    try {
      const presets = await this.api.list();
      this.presets = new Map(presets.map((p) => [p.id, p]));
      this.select.replaceChildren(new Option("No preset chosen", ""), ...presets.map((p) => new Option(p.name, p.id)));
      this.select.value = this.presets.has(chooseId) ? chooseId : "";
    } catch (err) {
      this.say(`Could not load the presets (${err.message}).`, { error: true });
    }
    this.updateButtons();
  }

  chosen() {
    return this.presets.get(this.select.value) ?? null;
  }

  updateButtons() {
    const none = this.chosen() === null;
    for (const button of Object.values(this.buttons)) button.disabled = none;
  }

  /** A line under the picker: what an action did, or why it failed. */
  say(message, { error = false } = {}) {
    this.status.textContent = message;
    this.status.classList.toggle("error", error);
    this.status.hidden = !message;
  }

  /** The page's current settings as a preset's fields, or null (said why) when the sampling form has errors. */
  current() {
    const { params, errors } = this.paramsForm.read();
    const bad = Object.keys(errors);
    if (bad.length > 0) {
      this.say(`Fix the sampling settings first: ${bad.map((k) => `${k} ${errors[k]}`).join("; ")}.`, { error: true });
      return null;
    }
    const picking = this.model.closest("[hidden]") === null && this.model.value !== "";
    return { system_prompt: this.system.value, params, model: picking ? this.model.value : null };
  }

  /** Fill the controls from the chosen preset; the input and change events let the page follow (the system
   * prompt's summary, the context meter, the remembered settings). */
  apply() {
    const preset = this.chosen();
    if (!preset) return;
    this.system.value = preset.system_prompt;
    this.system.dispatchEvent(new Event("input", { bubbles: true }));
    this.paramsForm.fill(preset.params);
    let note = "";
    if (preset.model) {
      if ([...this.model.options].some((option) => option.value === preset.model)) {
        this.model.value = preset.model;
        this.model.dispatchEvent(new Event("change", { bubbles: true }));
      } else {
        note = ` Its model “${preset.model}” is not served now; the model choice stays.`;
      }
    }
    this.say(`Applied “${preset.name}”.${note}`);
  }

  openNameForm(mode) {
    const preset = this.chosen();
    if (mode === "rename" && !preset) return;
    this.nameMode = mode;
    this.nameInput.value = mode === "rename" ? preset.name : "";
    this.nameInput.removeAttribute("aria-invalid");
    this.nameForm.hidden = false;
    this.nameInput.focus();
    this.nameInput.select();
  }

  closeNameForm() {
    const opener = this.nameMode === "rename" ? this.buttons.rename : this.saveButton;
    this.nameForm.hidden = true;
    this.nameMode = null;
    opener.focus();
  }

  /** Save the current settings under the name typed, or rename the chosen preset to it. */
  async submitName() {
    const mode = this.nameMode;
    const name = this.nameInput.value;
    let saved;
    try {
      if (mode === "rename") {
        saved = await this.api.update(this.chosen().id, { name });
      } else {
        const settings = this.current();
        if (!settings) return;
        saved = await this.api.create({ name, ...settings });
      }
    } catch (err) {
      this.say(err.message, { error: true });
      this.nameInput.setAttribute("aria-invalid", "true");
      this.nameInput.focus();
      return;
    }
    this.nameForm.hidden = true;
    this.nameMode = null;
    await this.load(saved.id);
    this.say(mode === "rename" ? `Renamed to “${saved.name}”.` : `Saved “${saved.name}”.`);
    this.select.focus();
  }

  /** Replace the chosen preset's settings with the page's current ones, after asking. */
  async overwrite() {
    const preset = this.chosen();
    if (!preset) return;
    const settings = this.current();
    if (!settings) return;
    if (!window.confirm(`Overwrite the preset “${preset.name}” with the current system prompt and settings?`)) return;
    try {
      await this.api.update(preset.id, settings);
    } catch (err) {
      this.say(`Could not overwrite it: ${err.message}`, { error: true });
      return;
    }
    await this.load(preset.id);
    this.say(`Saved the current settings as “${preset.name}”.`);
  }

  /** Delete the chosen preset, after asking. */
  async remove() {
    const preset = this.chosen();
    if (!preset) return;
    if (!window.confirm(`Delete the preset “${preset.name}”?`)) return;
    try {
      await this.api.remove(preset.id);
    } catch (err) {
      this.say(`Could not delete it: ${err.message}`, { error: true });
      return;
    }
    await this.load("");
    this.say(`Deleted “${preset.name}”.`);
    this.select.focus();
  }
}
