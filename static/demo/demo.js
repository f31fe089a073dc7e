/**
 * The presenter page: starts and stops a demo run over /ws/demo/ and shows every simulated user's stream,
 * the worker's KV figures and charts, and paged-vs-contiguous memory. Frames from the server:
 *   {"type": "state", "run", "users"}                 on connect: the run so far
 *   {"type": "event", "kind": "run"|"user"|"tokens", ...}  live changes (see playground/demo/runner.py)
 *   {"type": "snapshot", "worker", "time", "metrics", "tokens_per_s", ...}  a worker's summary snapshot
 *                                                     (playground/serving/worker/kv_snapshot.py), a few per second
 *   {"type": "error", "message"}
 * Model text is only ever set with textContent: it renders as text, never as HTML.
 */

import { JsonSocket } from "../common/socket.js";
import { chartValues } from "../common/snapshot.js";
import { KvCharts, renderFigures } from "../common/kvcharts.js";
import { POLICIES } from "../memory/reservation.js";
import { BlockMap } from "../memory/blockmap.js";
import { decodeBlockMap } from "../common/snapshot.js";

const config = JSON.parse(document.getElementById("demo-config").textContent);
const $ = (id) => document.getElementById(id);
const streamsEl = $("streams");
const cardTemplate = $("stream-card");
const cards = new Map(); // user number -> card element
let charts = null;
let previousSnapshot = null;
let watchedWorker = null;

function showError(message) {
  const el = $("demo-error");
  el.textContent = message;
  el.hidden = !message;
}

function cardFor(user) {
  let card = cards.get(user.user);
  if (!card) {
    card = cardTemplate.content.firstElementChild.cloneNode(true);
    card.dataset.user = String(user.user);
    card.querySelector(".stream-name").textContent = user.name;
    card.querySelector(".stream-prompt").textContent = user.prompt;
    cards.set(user.user, card);
    streamsEl.append(card);
  }
  return card;
}

function renderUser(user) {
  const card = cardFor(user);
  card.dataset.state = user.state;
  card.querySelector(".stream-state").textContent = user.state;
  card.querySelector(".stream-text").textContent = user.error ?? user.text;
  const stats = [];
  if (user.usage) {
    stats.push(`${user.usage.prompt_tokens} prompt`, `${user.usage.cached_tokens} cached`,
               `${user.usage.completion_tokens} generated`);
  }
  if (user.timing?.ttft_ms != null) stats.push(`TTFT ${Math.round(user.timing.ttft_ms)} ms`);
  if (user.finish_reason) stats.push(user.finish_reason);
  card.querySelector(".stream-stats").textContent = stats.join(" · ");
}

function appendTokens(userNumber, text) {
  const card = cards.get(userNumber);
  if (!card) return;
  card.dataset.state = "streaming";
  card.querySelector(".stream-state").textContent = "streaming";
  card.querySelector(".stream-text").append(text);
}

function renderRun(run) {
  const status = $("run-status");
  if (!run) {
    status.textContent = "No run yet.";
    return;
  }
  const salt = run.cache_salt ? ", per-user cache salt" : "";
  status.textContent = `Run ${run.run_id}: ${run.users} users at ${run.rate}/s, ${run.max_tokens} tokens each${salt} (${run.state}).`;
  status.dataset.state = run.state;
}

function resetRun(state) {
  cards.clear();
  streamsEl.replaceChildren();
  streamsEl.dataset.runId = state.run?.run_id ?? "";
  renderRun(state.run);
  state.users.forEach(renderUser);
}

/** Paged memory actually held vs what a contiguous allocator would reserve for the same live requests, under
 *  both policies the engine computes (metrics.contiguous; inference/counterfactual.py). */
function renderBars(metrics) {
  const total = metrics.num_blocks_total || 1;
  const paged = metrics.num_blocks_used ?? 0;
  const reserved = Object.fromEntries(POLICIES.map((p) => [p, metrics.contiguous?.[p]?.reserved_blocks ?? 0]));
  const scale = Math.max(total, paged, ...Object.values(reserved), 1);
  $("bar-paged").style.width = `${(100 * paged) / scale}%`;
  $("label-paged").textContent = `${paged} blocks`;
  for (const [policy, blocks] of Object.entries(reserved)) {
    $(`bar-${policy}`).style.width = `${(100 * blocks) / scale}%`;
    $(`label-${policy}`).textContent = `${blocks} blocks${blocks > total ? " (more than the pool!)" : ""}`;
  }
}

function onSnapshot(snapshot) {
  watchedWorker ??= snapshot.worker;
  if (snapshot.worker !== watchedWorker) return;
  const values = chartValues(snapshot, previousSnapshot);
  previousSnapshot = snapshot;
  charts ??= new KvCharts($("charts"), ["memory", "requests", "throughput", "preemptions"], { height: 140 });
  charts.push(values);
  renderFigures($("figures"), values);
  const m = snapshot.metrics;
  const extra = [["blocks_used", "Blocks used", m.num_blocks_used], ["blocks_shared", "Blocks shared", m.num_blocks_shared],
                 ["blocks_cached", "Blocks cached", m.num_blocks_cached], ["preemptions", "Preemptions", m.num_preemptions_total]];
  for (const [name, label, value] of extra) {
    const item = document.createElement("div");
    item.dataset.figure = name;
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.textContent = String(value ?? "–");
    item.append(dt, dd);
    $("figures").append(item);
  }
  renderBars(m);
  // Observable for tests and curious presenters: the highest KV usage seen so far.
  const memory = $("charts").querySelector('[data-chart="memory"]');
  const peak = Math.max(Number(memory.dataset.peakUsage ?? 0), values.kvUsagePct ?? 0);
  memory.dataset.peakUsage = String(peak);
}

/** The block map of the demo's own requests (the server attributes everyone else's blocks to "others"). */
let blockMap = null;
function onBlocks(msg) {
  if (msg.worker !== watchedWorker) return;
  blockMap ??= new BlockMap($("demo-blockmap"), $("demo-tooltip"));
  const counts = blockMap.update(decodeBlockMap(msg.block_map));
  $("demo-blockmap-counts").textContent =
    `${counts.used} used · ${counts.shared} shared · ${counts.cached} cached · ${counts.free} free, ` +
    `${msg.requests.length} of the demo's sequences running`;
}

function onFrame(msg) {
  switch (msg.type) {
    case "state":
      return resetRun(msg);
    case "snapshot":
      return onSnapshot(msg);
    case "blocks":
      return onBlocks(msg);
    case "error":
      return showError(msg.message);
    case "event":
      if (msg.kind === "run") {
        if (!msg.run || msg.run.run_id !== streamsEl.dataset.runId) resetRun(msg);
        else renderRun(msg.run);
        return;
      }
      if (msg.kind === "user") return renderUser(msg.user);
      if (msg.kind === "tokens") return appendTokens(msg.user, msg.text);
      return;
    default:
      return;
  }
}

const socket = new JsonSocket(config.ws_path, {
  onMessage: onFrame,
  onStatus: (status) => {
    $("conn").dataset.status = status;
    $("conn").textContent = status;
  },
});
socket.connect();

$("controls").addEventListener("submit", (event) => {
  event.preventDefault();
  showError("");
  const form = new FormData($("controls"));
  const frame = {
    type: "start",
    users: Number.parseInt(form.get("users"), 10),
    rate: Number.parseFloat(form.get("rate")),
    max_tokens: Number.parseInt(form.get("max_tokens"), 10),
    cache_salt: form.get("cache_salt") === "on",
  };
  if (!socket.send(frame)) showError("Not connected.");
});
$("stop").addEventListener("click", () => {
  if (!socket.send({ type: "stop" })) showError("Not connected.");
});
