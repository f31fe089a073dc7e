/**
 * Past conversations: the sidebar list and the JSON endpoints behind it (docs/protocol.md, "JSON endpoints").
 * Conversations open in place (history.pushState to /c/<id>/) so the live charts keep their history.
 */

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function requestJson(url, options = {}) {
  const response = await fetch(url, { credentials: "same-origin", ...options });
  if (!response.ok) throw new Error(`${options.method ?? "GET"} ${url} failed: ${response.status}`);
  return response.status === 204 ? null : response.json();
}

/** The conversations endpoints, rooted at `baseUrl` ("/api/conversations/"). */
export class ConversationApi {
  constructor(baseUrl) {
    this.baseUrl = baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`;
  }

  async list() {
    return (await requestJson(this.baseUrl)).conversations;
  }

  async get(id) {
    return requestJson(`${this.baseUrl}${encodeURIComponent(id)}/`);
  }

  /** Show the branch through message `messageId`; the conversation as it is then. */
  async showBranch(id, messageId) {
    return requestJson(this.messageUrl(id, messageId), { method: "POST", headers: { "X-CSRFToken": csrfToken() } });
  }

  /** Delete a message and what follows it; the conversation as it is then. */
  async removeMessage(id, messageId) {
    return requestJson(this.messageUrl(id, messageId), { method: "DELETE", headers: { "X-CSRFToken": csrfToken() } });
  }

  messageUrl(id, messageId) {
    return `${this.baseUrl}${encodeURIComponent(id)}/messages/${encodeURIComponent(messageId)}/`;
  }

  async remove(id) {
    await requestJson(`${this.baseUrl}${encodeURIComponent(id)}/`, {
      method: "DELETE",
      headers: { "X-CSRFToken": csrfToken() },
    });
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

/** The sidebar list; it only draws and reports clicks, the controller decides what they do. */
export class ConversationList {
  /**
   * @param {HTMLUListElement} listEl
   * @param {HTMLElement} emptyEl  shown when there is nothing to list
   * @param {{onOpen: (id: string) => void, onDelete: (id: string) => void}} handlers
   */
  constructor(listEl, emptyEl, { onOpen, onDelete }) {
    this.listEl = listEl;
    this.emptyEl = emptyEl;
    this.activeId = null;
    listEl.addEventListener("click", (event) => {
      const item = event.target.closest("li[data-id]");
      if (!item) return;
      if (event.target.closest(".conv-delete")) {
        event.preventDefault();
        onDelete(item.dataset.id);
      } else if (event.target.closest("a") && !event.metaKey && !event.ctrlKey && !event.shiftKey) {
        event.preventDefault();
        onOpen(item.dataset.id);
      }
    });
  }

  /** @param {{id: string, title: string, updated_at: string}[]} conversations */
  render(conversations) {
    const items = conversations.map(({ id, title, updated_at: updatedAt }) => {
      const li = document.createElement("li");
      li.dataset.id = id;
      const a = document.createElement("a");
      a.href = `/c/${encodeURIComponent(id)}/`;
      const name = document.createElement("span");
      name.className = "conv-title";
      name.textContent = title || "Untitled";
      const when = document.createElement("span");
      when.className = "conv-time";
      when.textContent = relativeTime(updatedAt);
      a.append(name, when);
      const del = document.createElement("button");
      del.type = "button";
      del.className = "conv-delete";
      del.title = "Delete conversation";
      del.setAttribute("aria-label", `Delete “${title || "Untitled"}”`);
      del.textContent = "×";
      li.append(a, del);
      return li;
    });
    this.listEl.replaceChildren(...items);
    this.emptyEl.hidden = items.length > 0;
    this.setActive(this.activeId);
  }

  setActive(id) {
    this.activeId = id;
    for (const li of this.listEl.children) {
      const active = li.dataset.id === id;
      li.classList.toggle("active", active);
      li.querySelector("a").toggleAttribute("aria-current", active);
    }
  }
}
