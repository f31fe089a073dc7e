/**
 * Past conversations: the sidebar list and the JSON endpoints behind it (docs/protocol.md, "JSON endpoints").
 * Conversations open in place (history.pushState to /c/<id>/) so the live charts keep their history.
 */

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** A request the server refused; `message` is the server's own (it names the field at fault). */
export class RequestError extends Error {}

export async function requestJson(url, options = {}) {
  const response = await fetch(url, { credentials: "same-origin", ...options });
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw new RequestError(body?.error ?? `${options.method ?? "GET"} ${url} failed: ${response.status}`);
  }
  return response.status === 204 ? null : response.json();
}

export function sending(method, body) {
  return { method, headers: { "X-CSRFToken": csrfToken(), "Content-Type": "application/json" }, body };
}

/** The conversations endpoints, rooted at `baseUrl` ("/api/conversations/"). */
export class ConversationApi {
  constructor(baseUrl) {
    this.baseUrl = baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`;
  }

  /** One page: {conversations, next}; `next` is the cursor of the page after, null on the last. */
  async list({ query = "", cursor = null } = {}) {
    const params = new URLSearchParams();
    if (query) params.set("q", query);
    if (cursor) params.set("cursor", cursor);
    const search = params.toString();
    return requestJson(search ? `${this.baseUrl}?${search}` : this.baseUrl);
  }

  async get(id) {
    return requestJson(this.url(id));
  }

  /** Rename and/or pin: `changes` is {title?, pinned?}; the conversation's summary as it is then. */
  async update(id, changes) {
    return requestJson(this.url(id), sending("PATCH", JSON.stringify(changes)));
  }

  /** Import an exported JSON file's text; the summaries of the conversations it made. */
  async importFile(text) {
    return (await requestJson(`${this.baseUrl}import/`, sending("POST", text))).conversations;
  }

  /** Where one conversation (or, without an id, all of them) downloads as "json" or "markdown". */
  exportUrl(id, format) {
    return `${id ? this.url(id) : this.baseUrl}export/?format=${format}`;
  }

  /** Show the branch through message `messageId`; the conversation as it is then. */
  async showBranch(id, messageId) {
    return requestJson(this.messageUrl(id, messageId), { method: "POST", headers: { "X-CSRFToken": csrfToken() } });
  }

  /** Delete a message and what follows it; the conversation as it is then. */
  async removeMessage(id, messageId) {
    return requestJson(this.messageUrl(id, messageId), { method: "DELETE", headers: { "X-CSRFToken": csrfToken() } });
  }

  url(id) {
    return `${this.baseUrl}${encodeURIComponent(id)}/`;
  }

  messageUrl(id, messageId) {
    return `${this.url(id)}messages/${encodeURIComponent(messageId)}/`;
  }

  async remove(id) {
    await requestJson(this.url(id), { method: "DELETE", headers: { "X-CSRFToken": csrfToken() } });
  }
}

function relativeTime(iso) {
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (!Number.isFinite(seconds)) return "";
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleDateString();
}

function iconButton(className, text, label) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `conv-action ${className}`;
  button.title = label;
  button.setAttribute("aria-label", label);
  button.textContent = text;
  return button;
}

/**
 * The sidebar list; it only draws, edits titles in place and reports what was asked, the controller decides
 * what it does. Every action is a real button, so the list is usable from the keyboard.
 */
export class ConversationList {
  /**
   * @param {HTMLUListElement} listEl
   * @param {HTMLElement} emptyEl  shown when there is nothing to list
   * @param {{onOpen: (id: string) => void, onDelete: (id: string) => void,
   *          onPin: (id: string, pinned: boolean) => void,
   *          onRename: (id: string, title: string) => Promise<object>}} handlers
   *   onRename resolves with the saved summary, or rejects with the reason shown under the field
   */
  constructor(listEl, emptyEl, { onOpen, onDelete, onPin, onRename }) {
    this.listEl = listEl;
    this.emptyEl = emptyEl;
    this.activeId = null;
    this.onRename = onRename;
    /** The summaries shown, by id. */
    this.items = new Map();
    listEl.addEventListener("click", (event) => {
      const item = event.target.closest("li[data-id]");
      if (!item || event.target.closest(".conv-rename-form")) return;
      const { id } = item.dataset;
      if (event.target.closest(".conv-delete")) {
        event.preventDefault();
        onDelete(id);
      } else if (event.target.closest(".conv-pin")) {
        onPin(id, !this.items.get(id).pinned);
      } else if (event.target.closest(".conv-rename")) {
        this.startRename(item);
      } else if (event.target.closest("a") && !event.metaKey && !event.ctrlKey && !event.shiftKey) {
        event.preventDefault();
        onOpen(id);
      }
    });
  }

  /**
   * @param {{id: string, title: string, pinned: boolean, updated_at: string}[]} conversations
   * @param {{append?: boolean}} options  append: add a further page below what is shown
   */
  render(conversations, { append = false } = {}) {
    if (!append) this.items.clear();
    const items = conversations.filter((c) => !this.items.has(c.id)).map((c) => {
      this.items.set(c.id, c);
      return this.item(c);
    });
    if (append) this.listEl.append(...items);
    else this.listEl.replaceChildren(...items);
    this.emptyEl.hidden = this.items.size > 0;
    this.setActive(this.activeId);
  }

  /** Redraw one conversation after it changed (a new title). */
  update(summary) {
    const old = this.listEl.querySelector(`li[data-id="${CSS.escape(summary.id)}"]`);
    if (!old) return;
    this.items.set(summary.id, summary);
    old.replaceWith(this.item(summary));
    this.setActive(this.activeId);
  }

  item({ id, title, pinned, updated_at: updatedAt }) {
    const name = title || "Untitled";
    const li = document.createElement("li");
    li.dataset.id = id;
    li.classList.toggle("pinned", pinned);
    const a = document.createElement("a");
    a.href = `/c/${encodeURIComponent(id)}/`;
    const titleEl = document.createElement("span");
    titleEl.className = "conv-title";
    titleEl.textContent = name;
    const when = document.createElement("span");
    when.className = "conv-time";
    when.textContent = relativeTime(updatedAt);
    a.append(titleEl, when);
    const pin = iconButton("conv-pin", pinned ? "★" : "☆", `${pinned ? "Unpin" : "Pin"} “${name}”`);
    pin.setAttribute("aria-pressed", String(pinned));
    li.append(a, pin, iconButton("conv-rename", "✎", `Rename “${name}”`),
      iconButton("conv-delete", "×", `Delete “${name}”`));
    return li;
  }

  /** Swap the item's link for a title field: Enter or Save saves, Escape or Cancel gives up. */
  startRename(item) {
    const summary = this.items.get(item.dataset.id);
    const form = document.createElement("form");
    form.className = "conv-rename-form";
    const input = document.createElement("input");
    input.type = "text";
    input.value = summary.title;
    input.setAttribute("aria-label", "Conversation title");
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "btn btn-small btn-primary";
    save.textContent = "Save";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "btn btn-small";
    cancel.textContent = "Cancel";
    const error = document.createElement("p");
    error.className = "conv-rename-error";
    error.setAttribute("role", "alert");
    error.hidden = true;
    form.append(input, save, cancel, error);
    const restore = () => {
      this.update(this.items.get(summary.id));
      this.listEl.querySelector(`li[data-id="${CSS.escape(summary.id)}"] .conv-rename`)?.focus();
    };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        this.items.set(summary.id, await this.onRename(summary.id, input.value));
        restore();
      } catch (err) {
        error.textContent = err.message;
        error.hidden = false;
        input.setAttribute("aria-invalid", "true");
        input.focus();
      }
    });
    cancel.addEventListener("click", restore);
    form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.stopPropagation();
        restore();
      }
    });
    item.replaceChildren(form);
    input.focus();
    input.select();
  }

  setActive(id) {
    this.activeId = id;
    for (const li of this.listEl.children) {
      const active = li.dataset.id === id;
      li.classList.toggle("active", active);
      li.querySelector("a")?.toggleAttribute("aria-current", active);
    }
  }
}
