/**
 * The chat page controller: it owns the conversation state and wires the socket, the transcript, the
 * sampling form, the history list and the KV panel together. The protocol is in docs/protocol.md.
 *
 * One generation runs at a time on this page. Its reply streams into a ReplyView; the `done` frame's full
 * texts replace the streamed ones and become the assistant turn that later requests send back. A Compare run
 * (compare.js: one prompt under settings A and B, not saved) counts as that one.
 */

import { JsonSocket } from "../common/socket.js";
import { ReplyStream } from "./stream.js";
import { Transcript, finishReply, turnTools } from "./transcript.js";
import { ParamsForm } from "./params.js";
import { ConversationApi, ConversationList } from "./conversations.js";
import { KvPanel } from "./kvpanel.js";
import { ResponseFormatControl } from "./format.js";
import { ContextMeter } from "./meter.js";
import { PresetPicker } from "./presets.js";
import { CodeDialog } from "./viewcode.js";
import { Compare } from "./compare.js";
import { installShortcuts } from "./shortcuts.js";

const config = JSON.parse(document.getElementById("chat-config").textContent);
const $ = (id) => document.getElementById(id);

const els = {
  app: $("chat-app"),
  messages: $("messages"),
  empty: $("empty-state"),
  prompt: $("prompt"),
  composer: $("composer"),
  send: $("send"),
  stop: $("stop"),
  error: $("composer-error"),
  system: $("system-prompt"),
  systemSummary: $("system-summary"),
  title: $("chat-title"),
  conn: $("conn"),
  params: $("params"),
  markdown: $("markdown-toggle"),
  modelPicker: $("model-picker"),
  model: $("model"),
};

/** How long to wait for the server's `done` after a cancel before giving up on it locally. */
const CANCEL_GRACE_MS = 5000;

const state = {
  conversationId: null,
  /** Turns after the system prompt: {role, content, el, id?, siblings?, samples?, finish_reason?, usage?,
   * timing?}; `el` is the turn's element in the transcript, `id` the saved message's and `siblings` the ids of
   * the branches at that point (docs/protocol.md). */
  messages: [],
  /** The generation in flight: {stream, view, requestId, cancelTimer, cancelRequested} or null. */
  active: null,
};

const paramsForm = new ParamsForm(els.params, config.sampling ?? []);
const formatControl = new ResponseFormatControl($("response-format"));
const meter = new ContextMeter($("context-meter"), config.context);
showModelPicker(config.models ?? []);
const compare = new Compare($("compare"), {
  specs: config.sampling ?? [],
  models: config.models ?? [],
  send: (frame) => socket.send(frame),
  settings: paramsForm,
  model: els.model,
  onShow: (open) => {
    els.app.classList.toggle("comparing", open);
    els.send.textContent = open ? "Compare" : "Send";
    $("compare-toggle").setAttribute("aria-pressed", String(open));
    if (!open) els.prompt.focus();
  },
  onBusy: () => setBusy(busy()),
  onUse: updateMeter,
});
const presets = new PresetPicker($("presets"), { url: config.urls?.presets ?? "/api/presets/", paramsForm,
  system: els.system, model: els.model });

/** The model picker, shown only when the server serves LoRA adapters beside the base model (listed first). */
function showModelPicker(models) {
  for (const name of models) els.model.append(new Option(name, name));
  els.modelPicker.hidden = models.length < 2;
}
/**
 * Generate frames whose reply was abandoned (New chat, another conversation opened) before their `started`
 * arrived. The server answers `started` in the order it received the frames, so the next ones to arrive
 * belong to these and are cancelled at once.
 */
let abandonedStarts = 0;

const api = new ConversationApi(config.urls?.conversations ?? "/api/conversations/");
const replyTurns = new Map(); // ReplyView -> its assistant turn in state.messages

const transcript = new Transcript(els.messages, {
  onChoose: (view, index) => {
    view.markChosen(index);
    const turn = replyTurns.get(view);
    if (turn?.samples) turn.content = turn.samples[index];
  },
  onRegenerate: (view) => regenerate(view),
});

const historyList = new ConversationList($("conv-list"), $("conv-empty"), {
  onOpen: (id) => openConversation(id, { push: true }),
  onDelete: (id) => deleteConversation(id),
  onPin: (id, pinned) => pinConversation(id, pinned),
  onRename: (id, title) => renameConversation(id, title),
});

/** The sidebar list's search and paging: `next` is the cursor of the page after the ones shown; `generation`
 * counts reloads from the first page, so a page that arrives after a newer reload is dropped. */
const history = { query: "", next: null, loading: false, generation: 0 };
const SEARCH_DELAY_MS = 250;

const kvPanel = new KvPanel({ figures: $("kv-figures"), charts: $("kv-charts"), worker: $("kv-worker"),
  idle: $("kv-idle") });

/** Worker snapshot summaries for the KV panel come on their own read-only feed (docs/metrics.md). */
const kvFeed = new JsonSocket("/ws/kv/", {
  onMessage: (msg) => (msg.type === "snapshot" ? kvPanel.update(msg) : console.warn("unknown frame", msg)),
});

const socket = new JsonSocket(config.ws_path ?? "/ws/chat/", {
  onMessage: handleFrame,
  onStatus: (status) => {
    els.conn.dataset.status = status;
    els.conn.textContent = { open: "connected", connecting: "connecting", closed: "reconnecting" }[status];
    if (status !== "closed") return;
    abandonedStarts = 0; // the server aborts a closed socket's generations itself
    compare.abandoned = 0;
    if (state.active) failActive("The connection to the server was lost; the reply stopped.");
    compare.fail("The connection to the server was lost; the reply stopped.");
  },
});

// ---------------------------------------------------------------- UI state

function showError(message) {
  els.error.textContent = message;
  els.error.hidden = !message;
}

/** Something streams: a chat reply or a Compare run. */
function busy() {
  return state.active !== null || compare.running;
}

function setBusy(isBusy) {
  els.send.hidden = isBusy;
  els.stop.hidden = !isBusy;
  els.stop.disabled = false;
  transcript.setRegenerable(!isBusy);
}

function updateEmptyState() {
  els.empty.hidden = state.messages.length > 0 || state.active !== null;
}

function updateSystemSummary() {
  const text = els.system.value.trim();
  els.systemSummary.textContent = text ? `· ${text.length > 60 ? `${text.slice(0, 60)}…` : text}` : "· none";
}

function scrollToEnd() {
  const scroller = $("transcript");
  const nearBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
  if (nearBottom) scroller.scrollTop = scroller.scrollHeight;
}

function autoGrow() {
  els.prompt.style.height = "auto";
  els.prompt.style.height = `${Math.min(els.prompt.scrollHeight, 220)}px`;
}

/** The context meter for the conversation, the draft and the max_tokens the form holds now. */
function updateMeter() {
  meter.update(transcriptPayload(), els.prompt.value, paramsForm.read().params.max_tokens ?? 0);
}

/**
 * Mark the turns the latest reply's prompt left out (the oldest `dropped` after the system prompt), so the
 * transcript shows what the model did not see.
 */
function markOutOfWindow(dropped) {
  state.messages.forEach((turn, i) => {
    turn.el?.classList.toggle("out-of-window", i < dropped);
    if (i < dropped) turn.el?.setAttribute("title", "Left out of the model's context window for the latest reply");
    else turn.el?.removeAttribute("title");
  });
}

// ---------------------------------------------------------------- generation

function transcriptPayload() {
  const system = els.system.value.trim();
  const turns = state.messages.map(({ role, content }) => ({ role, content }));
  return system ? [{ role: "system", content: system }, ...turns] : turns;
}

/** Validate the form; on errors open the settings and say which fields are wrong. */
function currentParams() {
  const { params, errors } = paramsForm.read();
  const bad = Object.keys(errors);
  if (bad.length > 0) {
    els.app.classList.add("show-settings");
    showError(`Fix the sampling settings first: ${bad.map((k) => `${k} ${errors[k]}`).join("; ")}.`);
    return null;
  }
  const { error } = formatControl.read();
  if (error) {
    els.app.classList.add("show-settings");
    showError(`Fix the response format first: ${error}.`);
    return null;
  }
  return params;
}

/** Send the current transcript (which ends with a user turn) and stream the answer into a new reply. */
function startGeneration(params) {
  const n = params.n ?? 1;
  const view = transcript.addReply(n);
  const { format } = formatControl.read();
  state.active = { stream: new ReplyStream(n), view, requestId: null, cancelRequested: false, cancelTimer: null,
    json: format !== null, showMask: formatControl.showMask.checked };
  setBusy(true);
  updateEmptyState();
  scrollToEnd();
  const frame = { type: "generate", conversation_id: state.conversationId, messages: transcriptPayload(), params,
    ...(format ? { response_format: format } : {}) };
  if (els.model.value) frame.model = els.model.value;
  const sent = socket.send(frame);
  if (!sent) failActive("Not connected to the server; try again in a moment.");
}

function send() {
  const text = els.prompt.value.trim();
  if (!text || busy()) return;
  if (compare.isOpen) {
    runCompare(text);
    return;
  }
  const params = currentParams();
  if (!params) return;
  showError("");
  addUserTurn({ role: "user", content: text });
  els.prompt.value = "";
  autoGrow();
  updateMeter();
  startGeneration(params);
}

/** Answer the conversation and `text` under Compare's A and B; the prompt stays in the box (nothing is saved). */
function runCompare(text) {
  const { error } = formatControl.read();
  if (error) {
    els.app.classList.add("show-settings");
    showError(`Fix the response format first: ${error}.`);
    return;
  }
  showError("");
  compare.run([...transcriptPayload(), { role: "user", content: text }],
    { format: formatControl.read().format, showMask: formatControl.showMask.checked });
}

/** Regenerate `view`'s reply: it and what follows leave the page (the server keeps them as a branch). */
function regenerate(view) {
  if (busy()) return;
  const params = currentParams();
  if (!params) return;
  const at = state.messages.findIndex((turn) => turn.el === view.el);
  if (at >= 0) truncateTurns(at);
  else transcript.truncateFrom(view.el); // a reply that failed, never a turn
  if (state.messages.length === 0 || state.messages[state.messages.length - 1].role !== "user") return;
  showError("");
  startGeneration(params);
}

/** Drop turn `at` and every later one from the page and the transcript sent next. */
function truncateTurns(at) {
  const dropped = new Set(state.messages.slice(at));
  for (const [view, turn] of replyTurns) if (dropped.has(turn)) replyTurns.delete(view);
  transcript.truncateFrom(state.messages[at].el);
  state.messages = state.messages.slice(0, at);
}

function addUserTurn(turn) {
  turn.el = transcript.addUser(turn.content);
  state.messages.push(turn);
  decorate(turn);
}

/** A turn's branch arrows, Edit and Delete. */
function decorate(turn) {
  turnTools(turn.el, turn, {
    onBranch: (id) => changeConversation(() => api.showBranch(state.conversationId, id)),
    onEdit: () => editTurn(turn),
    onDelete: (id) => {
      if (window.confirm("Delete this message and everything after it on this branch?")) {
        changeConversation(() => api.removeMessage(state.conversationId, id));
      }
    },
  });
}

/** Edit a user turn in place; sending it starts a new branch from there. */
function editTurn(turn) {
  if (busy() || turn.el.querySelector(".edit-form")) return;
  const body = turn.el.querySelector(".msg-body");
  const form = document.createElement("form");
  form.className = "edit-form";
  const area = document.createElement("textarea");
  area.value = turn.content;
  area.rows = Math.min(8, turn.content.split("\n").length + 1);
  area.setAttribute("aria-label", "Edit the message");
  const sendButton = Object.assign(document.createElement("button"), { type: "submit", className: "btn btn-primary btn-small edit-send", textContent: "Send" });
  const cancel = Object.assign(document.createElement("button"), { type: "button", className: "btn btn-small edit-cancel", textContent: "Cancel" });
  form.append(area, sendButton, cancel);
  body.hidden = true;
  turn.el.append(form);
  area.focus();
  const close = () => {
    form.remove();
    body.hidden = false;
  };
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") close();
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = area.value.trim();
    const params = text && !busy() ? currentParams() : null;
    if (!params) return;
    truncateTurns(state.messages.indexOf(turn));
    addUserTurn({ role: "user", content: text });
    updateMeter();
    startGeneration(params);
  });
}

/** Run a request that answers with the conversation (branch switch, delete) and show its answer. */
async function changeConversation(request) {
  if (busy()) return;
  try {
    showConversation(await request());
  } catch (err) {
    showError(`Could not change the conversation (${err.message}).`);
  }
}

/** Give the turns on the page the ids and branches the server has for them (after a reply was saved). */
async function syncTree() {
  const id = state.conversationId;
  try {
    const conv = await api.get(id);
    const turns = (conv.messages ?? []).filter((m) => m.role !== "system");
    if (id !== state.conversationId || state.active || turns.length !== state.messages.length) return;
    turns.forEach((m, i) => {
      Object.assign(state.messages[i], { id: m.id, siblings: m.siblings });
      decorate(state.messages[i]);
    });
  } catch (err) {
    console.warn(err);
  }
}

function stop() {
  if (compare.running) {
    compare.stop();
    els.stop.disabled = true;
    return;
  }
  const active = state.active;
  if (!active || active.cancelRequested) return;
  active.cancelRequested = true;
  els.stop.disabled = true;
  if (active.requestId) socket.send({ type: "cancel", request_id: active.requestId });
  active.cancelTimer = setTimeout(() => {
    if (state.active === active) failActive("Cancelled; the server did not confirm in time.");
  }, CANCEL_GRACE_MS);
}

function endActive() {
  clearTimeout(state.active?.cancelTimer);
  state.active = null;
  setBusy(busy());
  updateEmptyState();
}

/** Stop caring about the generation in flight (its reply is being cleared from the page) and cancel it. */
function abandonActive() {
  const active = state.active;
  if (!active) return;
  if (active.requestId) socket.send({ type: "cancel", request_id: active.requestId });
  else abandonedStarts += 1;
  endActive();
}

function failActive(message) {
  const { stream, view } = state.active;
  stream.fail("error");
  view.fail(message);
  endActive();
}

// ---------------------------------------------------------------- server frames

function handleStarted(msg) {
  if (abandonedStarts > 0) {
    abandonedStarts -= 1;
    socket.send({ type: "cancel", request_id: msg.request_id });
    return;
  }
  const active = state.active;
  if (!active || active.requestId !== null) return;
  active.requestId = msg.request_id;
  active.stream.start(msg.request_id);
  active.view.el.dataset.requestId = msg.request_id;
  if (msg.conversation_id && msg.conversation_id !== state.conversationId) {
    state.conversationId = msg.conversation_id;
    window.history.pushState({ id: msg.conversation_id }, "", `/c/${msg.conversation_id}/`);
    historyList.setActive(msg.conversation_id);
  }
  if (active.cancelRequested) socket.send({ type: "cancel", request_id: msg.request_id });
}

function handleToken(msg) {
  const active = state.active;
  if (!active) return;
  const index = active.stream.applyToken(msg);
  if (index === null) return;
  active.view.setText(index, active.stream.texts[index]);
  scrollToEnd();
}

function handleDone(msg) {
  const active = state.active;
  if (!active || msg.request_id !== active.requestId) return;
  const { stream, view } = active;
  finishReply(view, stream, msg, active);
  const turn = {
    el: view.el,
    role: "assistant",
    content: stream.texts[view.chosen],
    samples: stream.texts.length > 1 ? [...stream.texts] : null,
    finish_reason: stream.finishReasons[0],
    usage: stream.usage,
    timing: stream.timing,
  };
  state.messages.push(turn);
  replyTurns.set(view, turn);
  if (stream.context) {
    meter.measure(transcriptPayload(), stream.context, stream.usage?.completion_tokens ?? 0);
    markOutOfWindow(stream.context.dropped_messages);
  }
  endActive();
  updateMeter();
  scrollToEnd();
  loadHistory();
  syncTree();
}

/**
 * An error with a request_id is that generation's; one without answers the oldest generate frame still
 * waiting for `started` (an abandoned one first: handleFrame drops those, as handleStarted cancels them, and a
 * waiting Compare run takes its refusal), else it is about some other frame.
 */
function handleError(msg) {
  const active = state.active;
  const ours = active && (msg.request_id ? msg.request_id === active.requestId : active.requestId === null);
  if (ours) failActive(msg.message ?? "The generation failed.");
  else showError(msg.message ?? "The server reported an error.");
}

function handleFrame(msg) {
  if (msg.type === "error" && !msg.request_id && abandonedStarts > 0) { // an abandoned generate's (handleError)
    abandonedStarts -= 1;
    return;
  }
  if (compare.handle(msg)) return;
  switch (msg.type) {
    case "started": return handleStarted(msg);
    case "token": return handleToken(msg);
    case "done": return handleDone(msg);
    case "error": return handleError(msg);
    default: return console.warn("unknown frame", msg);
  }
}

// ---------------------------------------------------------------- conversations

/** Reload the sidebar list from its first page (or, with `more`, add the next page below it). */
async function loadHistory({ more = false } = {}) {
  if (more && (!history.next || history.loading)) return;
  const generation = more ? history.generation : ++history.generation;
  history.loading = true;
  try {
    const page = await api.list({ query: history.query, cursor: more ? history.next : null });
    if (generation !== history.generation) return;
    historyList.render(page.conversations, { append: more });
    history.next = page.next;
    $("conv-more").hidden = !page.next;
    $("conv-empty").textContent = history.query ? "No conversation matches." : "No conversations yet.";
    const current = page.conversations.find((c) => c.id === state.conversationId);
    if (current) showTitle(current.title);
  } catch (err) {
    console.warn(err);
  } finally {
    if (generation === history.generation) history.loading = false;
  }
}

function showTitle(title) {
  els.title.textContent = title || "Untitled";
  document.title = `${title || "Untitled"} · Chat · Paged Playground`;
}

/** A line under the sidebar's tools: what an import did, or why a sidebar action failed. */
function showHistoryStatus(message, { error = false } = {}) {
  const status = $("conv-status");
  status.textContent = message;
  status.classList.toggle("error", error);
  status.hidden = !message;
}

/** Point the toolbar's export links at the conversation shown (hidden for a new chat). */
function showExportLinks(id) {
  $("conv-export").hidden = !id;
  if (!id) return;
  $("export-json").href = api.exportUrl(id, "json");
  $("export-markdown").href = api.exportUrl(id, "markdown");
}

function resetConversation() {
  abandonActive();
  compare.reset();
  state.conversationId = null;
  state.messages = [];
  replyTurns.clear();
  transcript.clear();
  els.system.value = "";
  updateSystemSummary();
  els.title.textContent = "New chat";
  showExportLinks(null);
  historyList.setActive(null);
  showError("");
  updateEmptyState();
  updateMeter();
}

/** Render a conversation in the API's JSON shape (GET /api/conversations/<id>/). */
function showConversation(conv) {
  resetConversation();
  state.conversationId = conv.id;
  els.system.value = conv.system_prompt ?? "";
  updateSystemSummary();
  els.title.textContent = conv.title || "Untitled";
  showExportLinks(conv.id);
  historyList.setActive(conv.id);
  for (const m of conv.messages ?? []) {
    if (m.role === "system") continue;
    if (m.role === "user") {
      addUserTurn({ role: "user", content: m.content, id: m.id, siblings: m.siblings });
      continue;
    }
    const texts = m.samples?.length ? m.samples : [m.content];
    const view = transcript.addReply(texts.length);
    const chosen = Math.max(0, texts.indexOf(m.content));
    view.markChosen(chosen);
    view.finish({ texts, finishReasons: texts.map((_t, i) => (i === chosen ? m.finish_reason : null)),
      usage: m.usage, timing: m.timing });
    const turn = { ...m, role: "assistant", el: view.el };
    state.messages.push(turn);
    replyTurns.set(view, turn);
    decorate(turn);
  }
  transcript.setRegenerable(true);
  updateEmptyState();
  updateMeter();
  $("transcript").scrollTop = $("transcript").scrollHeight;
}

async function openConversation(id, { push }) {
  els.app.classList.remove("show-history");
  try {
    const conv = await api.get(id);
    showConversation(conv);
    if (push) window.history.pushState({ id }, "", `/c/${id}/`);
  } catch (err) {
    showError(`Could not open that conversation (${err.message}).`);
  }
}

async function deleteConversation(id) {
  if (!window.confirm("Delete this conversation?")) return;
  try {
    await api.remove(id);
  } catch (err) {
    showError(`Could not delete it (${err.message}).`);
    return;
  }
  if (id === state.conversationId) {
    resetConversation();
    window.history.pushState({}, "", "/");
  }
  loadHistory();
}

/** Save a new title (the list's inline rename); rejects with the server's reason, which the list shows. */
async function renameConversation(id, title) {
  const summary = await api.update(id, { title });
  if (id === state.conversationId) showTitle(summary.title);
  return summary;
}

/** Pin or unpin; the list reloads (pinned ones first) and the keyboard focus stays on that button. */
async function pinConversation(id, pinned) {
  try {
    await api.update(id, { pinned });
  } catch (err) {
    showHistoryStatus(`Could not ${pinned ? "pin" : "unpin"} it (${err.message}).`, { error: true });
    return;
  }
  await loadHistory();
  $("conv-list").querySelector(`li[data-id="${CSS.escape(id)}"] .conv-pin`)?.focus();
}

async function importConversations(file) {
  try {
    const made = await api.importFile(await file.text());
    showHistoryStatus(`Imported ${made.length} conversation${made.length === 1 ? "" : "s"}.`);
  } catch (err) {
    showHistoryStatus(`Nothing was imported: ${err.message}`, { error: true });
    return;
  }
  $("conv-search").value = "";
  history.query = "";
  await loadHistory();
}

function wireHistory() {
  const search = $("conv-search");
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      history.query = search.value.trim();
      loadHistory();
    }, SEARCH_DELAY_MS);
  });
  const more = $("conv-more");
  more.addEventListener("click", () => loadHistory({ more: true }));
  // Infinite scroll: the next page loads as the "Load more" button scrolls into view.
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) loadHistory({ more: true });
  }).observe(more);
  $("export-all-json").href = api.exportUrl(null, "json");
  $("export-all-markdown").href = api.exportUrl(null, "markdown");
  const fileInput = $("import-file");
  $("import-button").addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", () => {
    const [file] = fileInput.files;
    fileInput.value = "";
    if (file) importConversations(file);
  });
}

// ---------------------------------------------------------------- wiring

function togglePanel(name) {
  const cls = `show-${name}`;
  const open = !els.app.classList.contains(cls);
  els.app.classList.remove("show-history", "show-settings");
  els.app.classList.toggle(cls, open);
  document.querySelector(`.toggle-${name}`).setAttribute("aria-expanded", String(open));
}

function wire() {
  els.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  els.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  els.prompt.addEventListener("input", () => {
    autoGrow();
    updateMeter();
  });
  els.params.addEventListener("input", updateMeter);
  els.stop.addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    resetConversation();
    window.history.pushState({}, "", "/");
    els.app.classList.remove("show-history");
    els.prompt.focus();
  });
  $("reset-params").addEventListener("click", () => paramsForm.reset());
  els.markdown.addEventListener("change", () => {
    transcript.setMarkdown(els.markdown.checked);
    compare.setMarkdown(els.markdown.checked);
  });
  $("compare-toggle").addEventListener("click", () => compare.toggle());
  els.system.addEventListener("input", () => {
    updateSystemSummary();
    updateMeter();
  });
  document.querySelector(".toggle-history").addEventListener("click", () => togglePanel("history"));
  document.querySelector(".toggle-settings").addEventListener("click", () => togglePanel("settings"));
  $("scrim").addEventListener("click", () => els.app.classList.remove("show-history", "show-settings"));
  window.addEventListener("popstate", () => {
    const match = window.location.pathname.match(/^\/c\/([^/]+)\/$/);
    if (match) openConversation(decodeURIComponent(match[1]), { push: false });
    else resetConversation();
  });
}

/** View code (viewcode.js) and the keyboard shortcuts (their one table: shortcuts.js). */
function wireTools() {
  const codeDialog = new CodeDialog({
    specs: config.sampling ?? [],
    endpoint: new URL("/v1/chat/completions", window.location.origin).href,
    current: () => {
      const draft = els.prompt.value.trim();
      return {
        model: els.model.value || (config.models ?? [])[0] || "",
        messages: draft ? [...transcriptPayload(), { role: "user", content: draft }] : transcriptPayload(),
        params: paramsForm.read().params,
        responseFormat: formatControl.read().format ?? null,
        note: draft ? " and the message being written" : "",
      };
    },
  });
  $("view-code").addEventListener("click", () => codeDialog.open());
  const shortcuts = installShortcuts({
    focusComposer: () => els.prompt.focus(),
    stop: () => (busy() ? stop() : false),
    regenerate: () => {
      const last = transcript.replies.at(-1);
      return last && !busy() ? regenerate(last) : false;
    },
    newChat: () => $("new-chat").click(),
    settings: () => togglePanel("settings"),
    viewCode: () => codeDialog.open(),
    compare: () => compare.toggle(),
  });
  $("show-shortcuts").addEventListener("click", () => shortcuts.open());
}

function init() {
  wire();
  wireTools();
  wireHistory();
  updateSystemSummary();
  if (config.conversation) showConversation(config.conversation);
  updateEmptyState();
  updateMeter();
  setBusy(false);
  socket.connect();
  kvFeed.connect();
  loadHistory();
  presets.load();
  els.prompt.focus();
}

init();
