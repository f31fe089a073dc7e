/**
 * The admin memory view: one card per worker, side by side, fed by `/ws/memory/` snapshots
 * (shape in common/snapshot.js). Actions go back over the same socket:
 *   {"type": "abort", "worker", "request_id"}, {"type": "reset_prefix_cache", "worker"} and
 *   {"type": "record", "worker", "action": "start" | "stop"} (answered by the worker with a `recording` frame);
 * the server reports failures as {"type": "error", "message"} and may confirm with {"type": "ack", "message"}.
 */

import { JsonSocket } from "../common/socket.js";
import { WorkerCard } from "./worker.js";

/** The feed's path is fixed by issue 6; the view needs no context from Django. */
const FEED_PATH = "/ws/memory/";
const $ = (id) => document.getElementById(id);
const workersEl = $("workers");
const template = $("worker-card");
const tooltip = $("block-tip");
const toastEl = $("toast");
const conn = $("conn");

const cards = new Map(); // worker name -> WorkerCard
let toastTimer = null;

function toast(message, isError = false) {
  toastEl.textContent = message;
  toastEl.classList.toggle("error", isError);
  toastEl.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { toastEl.hidden = true; }, 4000);
}

function send(message, description) {
  if (!socket.send(message)) toast(`Not connected; could not ${description}.`, true);
}

function cardFor(worker) {
  let card = cards.get(worker);
  if (!card) {
    card = new WorkerCard(worker, {
      template,
      tooltip,
      onAbort: (w, requestId) => send({ type: "abort", worker: w, request_id: requestId }, "abort the request"),
      onReset: (w) => send({ type: "reset_prefix_cache", worker: w }, "reset the prefix cache"),
      onRecord: (w, action) => send({ type: "record", worker: w, action }, `${action} the recording`),
    });
    cards.set(worker, card);
    const sorted = [...cards.keys()].sort();
    workersEl.insertBefore(card.el, cards.get(sorted[sorted.indexOf(worker) + 1])?.el ?? null);
    $("no-workers").hidden = true;
  }
  return card;
}

function handleFrame(msg) {
  switch (msg.type) {
    case "snapshot":
      return cardFor(msg.worker ?? "worker").update(msg);
    case "recording":
      if (msg.state === "error") toast(msg.message, true);
      return cardFor(msg.worker).recordingState(msg);
    case "ack":
      return toast(msg.message ?? "Done.");
    case "error":
      return toast(msg.message ?? "The server reported an error.", true);
    default:
      return console.warn("unknown frame", msg);
  }
}

const socket = new JsonSocket(FEED_PATH, {
  onMessage: handleFrame,
  onStatus: (status) => {
    conn.dataset.status = status;
    conn.textContent = { open: "live", connecting: "connecting", closed: "reconnecting" }[status];
  },
});

setInterval(() => cards.forEach((card) => card.tick()), 1000);
socket.connect();
