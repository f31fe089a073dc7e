/**
 * The chat page's keyboard shortcuts: one table, from which both the key handling and the list in the "?"
 * dialog come, so the two cannot disagree. Each entry names an action; the page (main.js) supplies the
 * actions, and one that does not apply now (nothing to stop, no reply to regenerate) returns false and
 * leaves the key to the browser.
 *
 * Keys act only while the user is not typing in a field (except those marked `inFields`) and while no
 * dialog is open (a dialog has its own keys: Escape closes it).
 */

import { Dialog } from "./dialog.js";

/** @type {{key: string, shown?: string, label: string, action: string, inFields?: boolean}[]} */
export const SHORTCUTS = [
  { key: "?", label: "Show the keyboard shortcuts", action: "help" },
  { key: "/", label: "Write a message (focus the message box)", action: "focusComposer" },
  { key: "Escape", shown: "Esc", label: "Stop the reply being written (also while typing)", action: "stop",
    inFields: true },
  { key: "r", label: "Regenerate the last reply", action: "regenerate" },
  { key: "n", label: "Start a new chat", action: "newChat" },
  { key: "s", label: "Open or close the settings", action: "settings" },
  { key: "c", label: "View code: this chat as a curl command and a Python call", action: "viewCode" },
  { key: "b", label: "Compare: open or close settings A and B side by side", action: "compare" },
];

function typingIn(target) {
  return target instanceof HTMLElement
    && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

/**
 * Listen for the shortcuts on the page and build the "?" dialog listing them.
 * @param {Record<string, () => (boolean|void)>} actions  one per action the table names, but "help"
 * @returns {Dialog} the shortcuts dialog
 */
export function installShortcuts(actions) {
  const dialog = new Dialog("Keyboard shortcuts", "shortcuts-dialog");
  const list = document.createElement("dl");
  list.className = "shortcut-list";
  for (const shortcut of SHORTCUTS) {
    const keys = document.createElement("dt");
    const kbd = document.createElement("kbd");
    kbd.textContent = shortcut.shown ?? shortcut.key;
    keys.append(kbd);
    const what = document.createElement("dd");
    what.textContent = shortcut.label;
    list.append(keys, what);
  }
  const hint = document.createElement("p");
  hint.className = "muted";
  hint.textContent = "Keys work when you are not typing in a field. Escape closes this dialog.";
  dialog.body.append(list, hint);
  const run = { ...actions, help: () => dialog.open() };

  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.isComposing || event.ctrlKey || event.metaKey || event.altKey) return;
    if (document.querySelector("dialog[open]")) return;
    const shortcut = SHORTCUTS.find((s) => s.key === event.key);
    if (!shortcut || (!shortcut.inFields && typingIn(event.target))) return;
    if (run[shortcut.action]() !== false) event.preventDefault();
  });
  return dialog;
}
