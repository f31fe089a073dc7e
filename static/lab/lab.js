/**
 * The lab page: one sandbox engine on a worker, driven step by step over /ws/lab/.
 *
 * Frames to the server: {type: "open", config} | {type: "open", scenario}, {type: "add", ...request},
 * {type: "step"}, {type: "abort", label}, {type: "answer", guess}, {type: "recording"}.
 * Frames from it: ready {limits, scenarios, scenario, snapshot}, snapshot {snapshot}, quiz {correct, answer},
 * recording {recording}, closed {message}, error {message}. The limits and scenarios come from the worker
 * (inference/lab.py): this page copies none of them. A comparison scenario's snapshot has `lanes` instead of
 * one pool (inference/lab_scenarios.py): each lane is drawn with the same views, side by side.
 */
import { JsonSocket } from "../common/socket.js";
import { replaySteps } from "./replay.js";

const config = JSON.parse(document.getElementById("lab-config").textContent);
const $ = (id) => document.getElementById(id);

const state = {
  limits: null,
  scenario: null,
  playing: false,
  waiting: false, // a step is in flight: never queue a second one
  idle: true,
  finished: false,
  lastOpen: { type: "open", config: {} },
  replay: [],
};

const COUNTERS = [
  ["num_blocks_used", "used"], ["num_blocks_free", "free"], ["num_blocks_cached", "cached"],
  ["num_blocks_shared", "shared"], ["cow_copies_total", "CoW copies"], ["num_preemptions_total", "preemptions"],
  ["evictions_total", "evictions"], ["prefix_cache_hits_total", "cached prompt tokens"],
];
// A comparison lane's figures (inference/lab_scenarios.py ScenarioRun._lane), then its pool's counters.
const LANE_FIGURES = [
  ["kv_bytes_per_token", "bytes per token"], ["num_blocks", "blocks"], ["token_slots", "token slots"],
  ["tokens_held", "tokens held"], ["running", "running"], ["waiting", "waiting"], ["finished", "finished"],
  ["num_blocks_used", "blocks used"], ["num_preemptions_total", "preemptions"],
];
const CONFIG_FIELDS = [
  ["num_blocks", "Blocks"], ["block_size", "Block size"], ["max_num_seqs", "Max sequences"],
  ["max_num_batched_tokens", "Token budget per step"], ["max_model_len", "Max model length"],
];

const socket = new JsonSocket(config.ws_path, {
  onMessage: handle,
  onStatus: (status) => {
    $("conn").dataset.status = status;
    $("conn").textContent = status;
    if (status === "open") send(state.lastOpen);
  },
});

function send(frame) {
  if (frame.type === "step") state.waiting = true;
  socket.send(frame);
}

function showError(message) {
  $("lab-error").textContent = message;
  $("lab-error").hidden = !message;
}

function handle(msg) {
  if (msg.type === "error") {
    state.waiting = false;
    stopPlaying();
    showError(msg.message);
    return;
  }
  if (msg.type === "closed") {
    stopPlaying();
    showError(`${msg.message}. Choose a scenario or a new lab to start again.`);
    return;
  }
  showError("");
  if (msg.type === "ready") {
    state.limits = msg.limits;
    state.scenario = msg.scenario;
    renderScenarioList(msg.scenarios);
    renderConfigForm((msg.snapshot.lanes ? msg.snapshot.lanes[0].snapshot : msg.snapshot).config);
    applyLimits();
    renderScenario();
    $("timeline").replaceChildren();
    render(msg.snapshot);
  } else if (msg.type === "snapshot") {
    state.waiting = false;
    render(msg.snapshot);
    if (state.playing) {
      if (state.idle && (!state.scenario || state.finished)) stopPlaying();
      else setTimeout(() => state.playing && !state.waiting && send({ type: "step" }), Number($("speed").value));
    }
  } else if (msg.type === "quiz") {
    $("quiz-verdict").textContent = msg.correct ? `Correct: ${msg.answer}.` : `Not quite: the engine says ${msg.answer}.`;
    $("quiz-verdict").dataset.correct = String(msg.correct);
  } else if (msg.type === "recording") {
    download(msg.recording);
    loadReplay(msg.recording, "of this lab");
  }
}

// --- controls ------------------------------------------------------------------------------------

function renderScenarioList(scenarios) {
  const list = $("scenarios");
  list.replaceChildren();
  for (const s of scenarios) {
    const button = document.createElement("button");
    button.className = "btn scenario";
    button.type = "button";
    button.dataset.scenario = s.name;
    button.innerHTML = "<b></b><span class='muted'></span>";
    button.querySelector("b").textContent = s.title;
    button.querySelector("span").textContent = s.watch;
    button.addEventListener("click", () => openLab({ type: "open", scenario: s.name }));
    list.append(button);
  }
}

function renderConfigForm(current) {
  const box = $("config-fields");
  box.replaceChildren();
  for (const [name, label] of CONFIG_FIELDS) {
    const [min, max] = state.limits[name];
    const field = document.createElement("label");
    field.textContent = `${label} (${min}-${max}) `;
    const input = document.createElement("input");
    Object.assign(input, { type: "number", name, min, max, value: current[name], required: true });
    field.append(input);
    box.append(field);
  }
}

function applyLimits() {
  const form = $("add-form");
  for (const name of ["max_tokens", "n", "beam_width"]) {
    const [min, max] = state.limits[name];
    Object.assign(form.elements[name], { min, max });
  }
}

function openLab(frame) {
  stopPlaying();
  state.lastOpen = frame;
  send(frame);
}

$("config-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const values = {};
  for (const [name] of CONFIG_FIELDS) values[name] = Number(event.target.elements[name].value);
  openLab({ type: "open", config: values });
});

$("add-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const f = event.target.elements;
  const frame = {
    type: "add", prompt: f.prompt.value, max_tokens: Number(f.max_tokens.value), n: Number(f.n.value),
    temperature: Number(f.temperature.value), seed: Number(f.seed.value),
  };
  if (f.beam_width.value !== "") frame.beam_width = Number(f.beam_width.value);
  send(frame);
});

$("step").addEventListener("click", () => !state.waiting && send({ type: "step" }));
$("play").addEventListener("click", () => (state.playing ? stopPlaying() : startPlaying()));
$("download").addEventListener("click", () => send({ type: "recording" }));
$("quiz-form").addEventListener("submit", (event) => {
  event.preventDefault();
  send({ type: "answer", guess: Number(event.target.elements.guess.value) });
});

function startPlaying() {
  state.playing = true;
  $("play").textContent = "Pause";
  if (!state.waiting) send({ type: "step" });
}

function stopPlaying() {
  state.playing = false;
  $("play").textContent = "Play";
}

// --- the live views ------------------------------------------------------------------------------

function render(snapshot) {
  state.idle = snapshot.idle;
  state.finished = Boolean(snapshot.finished);
  $("step-number").textContent = snapshot.step;
  $("step-number").dataset.finished = String(state.finished);
  const lanes = snapshot.lanes || null;
  $("single-view").hidden = Boolean(lanes);
  $("counters").hidden = Boolean(lanes);
  $("lanes").hidden = !lanes;
  $("download").disabled = Boolean(lanes); // a recording is of one pool
  if (lanes) {
    renderLanes($("lanes"), lanes);
  } else {
    renderCounters($("counters"), snapshot.counters, COUNTERS);
    renderTables($("tables"), snapshot.requests, snapshot.blocks, snapshot.config.block_size, true);
    renderPool($("pool"), snapshot.blocks);
    $("free-queue").textContent = snapshot.free_queue.join(" · ") || "(empty)";
    renderContiguous($("contiguous"), snapshot);
    appendEvents(snapshot.events, "");
  }
  if (state.scenario) {
    $("quiz-answer").hidden = !snapshot.quiz_due;
    $("quiz-wait").hidden = Boolean(snapshot.quiz_due);
  }
}

function renderCounters(box, counters, names) {
  box.replaceChildren();
  for (const [key, label] of names) {
    const wrap = document.createElement("div");
    wrap.dataset.counter = key;
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.textContent = counters[key];
    wrap.append(dt, dd);
    box.append(wrap);
  }
}

/** A comparison: one card per model, each with the figures, block tables, pool and contiguous bar of one pool. */
function renderLanes(box, lanes) {
  box.replaceChildren();
  for (const lane of lanes) {
    const snap = lane.snapshot;
    const card = document.createElement("section");
    card.className = "card lane";
    card.dataset.lane = lane.model;
    card.innerHTML = "<h2></h2><p class='muted lane-bytes'></p><dl class='kv-figures'></dl><div class='pool'></div>" +
      "<div class='tables'></div><div class='contiguous'></div>";
    card.querySelector("h2").textContent = lane.title;
    card.querySelector(".lane-bytes").textContent =
      `${lane.kv_arithmetic} = ${lane.kv_bytes_per_token} bytes per token; ${lane.num_blocks} blocks of ` +
      `${snap.config.block_size} tokens in ${lane.pool_bytes / 1024} KiB`;
    renderCounters(card.querySelector(".kv-figures"), { ...lane, ...lane.requests, ...snap.counters }, LANE_FIGURES);
    renderPool(card.querySelector(".pool"), snap.blocks);
    renderTables(card.querySelector(".tables"), snap.requests, snap.blocks, snap.config.block_size, false);
    renderContiguous(card.querySelector(".contiguous"), snap);
    box.append(card);
    appendEvents(snap.events, `${lane.model.toUpperCase()}: `);
  }
}

function renderScenario() {
  const card = $("scenario-card");
  card.hidden = !state.scenario;
  if (!state.scenario) return;
  $("scenario-title").textContent = state.scenario.title;
  $("scenario-watch").textContent = state.scenario.watch;
  $("quiz-question").textContent = state.scenario.question;
  $("quiz-verdict").textContent = "";
  $("quiz-form").reset();
}

/** Each request's sequences as rows of logical blocks, each pointing at its physical block. */
function renderTables(box, requests, blocks, blockSize, withAbort) {
  box.replaceChildren();
  if (!requests.length) {
    box.innerHTML = "<p class='muted'>No requests yet.</p>";
    return;
  }
  for (const request of requests) {
    const row = document.createElement("div");
    row.className = "request";
    row.dataset.label = request.label;
    row.dataset.status = request.status;
    const head = document.createElement("header");
    const title = document.createElement("b");
    title.textContent = `Request ${request.label}`;
    const meta = document.createElement("span");
    meta.className = "muted";
    const cached = request.cached_tokens ? `, ${request.cached_tokens} prompt tokens from the cache` : "";
    meta.textContent = request.prompt_tokens !== undefined
      ? ` ${request.status} · ${request.kind} · ${request.prompt_tokens} prompt tokens${cached}` : "";
    head.append(title, meta);
    if (withAbort && request.status !== "finished") {
      const abort = document.createElement("button");
      abort.className = "btn btn-small btn-danger";
      abort.type = "button";
      abort.textContent = "Abort";
      abort.addEventListener("click", () => send({ type: "abort", label: request.label }));
      head.append(abort);
    }
    row.append(head);
    for (const seq of request.seqs) {
      const line = document.createElement("div");
      line.className = "seq";
      line.dataset.index = seq.index;
      const name = document.createElement("span");
      name.className = "seq-name muted";
      name.textContent = request.seqs.length > 1 ? `#${seq.index}` : "";
      line.append(name);
      seq.block_table.forEach((blockId, i) => {
        const block = blocks[blockId];
        const cell = document.createElement("span");
        cell.className = `logical ${cellClass(block)}`;
        cell.dataset.block = blockId;
        const filled = seq.context_len === undefined ? "" : ` (${Math.min(blockSize, seq.context_len - i * blockSize)}/${blockSize})`;
        cell.title = `logical block ${i} → physical block ${blockId}, ref count ${block.ref_count}${filled}`;
        cell.innerHTML = "<small></small><span aria-hidden='true'>↓</span><b></b>";
        cell.querySelector("small").textContent = `L${i}`;
        cell.querySelector("b").textContent = `#${blockId}`;
        line.append(cell);
      });
      if (seq.text !== undefined) {
        const text = document.createElement("span");
        text.className = "seq-text";
        text.textContent = seq.text;
        line.append(text);
      }
      row.append(line);
    }
    box.append(row);
  }
}

function cellClass(block) {
  if (block.state === "used") return block.ref_count > 1 ? "cell-shared" : "cell-used";
  return block.state === "cached" ? "cell-cached" : "cell-free";
}

function renderPool(box, blocks) {
  box.replaceChildren();
  for (const block of blocks) {
    const cell = document.createElement("div");
    cell.className = `block ${cellClass(block)}`;
    cell.dataset.block = block.id;
    cell.dataset.state = block.state;
    cell.dataset.ref = block.ref_count;
    const owners = block.owners.length ? ` held by ${block.owners.join(", ")}` : "";
    cell.title = `physical block ${block.id}: ${block.state}, ref count ${block.ref_count}${owners}` +
      (block.hash ? `, hash ${block.hash}` : "");
    cell.innerHTML = "<b></b><small></small><i></i>";
    cell.querySelector("b").textContent = block.id;
    cell.querySelector("small").textContent = block.ref_count ? `ref ${block.ref_count}` : "";
    cell.querySelector("i").textContent = block.hash ? block.hash.slice(0, 4) : "";
    box.append(cell);
  }
}

function renderContiguous(box, snapshot) {
  const total = snapshot.config.num_blocks;
  const used = snapshot.counters.num_blocks_used;
  const rows = [["Paged, held now", used, null]];
  const names = { max_model_len: "Contiguous, max_model_len each", prompt_plus_max_tokens: "Contiguous, prompt + max_tokens each" };
  for (const [policy, label] of Object.entries(names)) rows.push([label, snapshot.contiguous[policy].reserved_blocks, snapshot.contiguous[policy]]);
  const scale = Math.max(total, ...rows.map((r) => r[1]), 1);
  box.replaceChildren();
  for (const [label, blocks, figures] of rows) {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.dataset.policy = figures ? label : "paged";
    row.innerHTML = "<span class='bar-name'></span><div class='bar-track'><div class='bar'></div><div class='bar-pool'></div></div><span class='bar-label'></span>";
    row.querySelector(".bar-name").textContent = label;
    row.querySelector(".bar").style.width = `${(100 * blocks) / scale}%`;
    row.querySelector(".bar").dataset.over = String(blocks > total);
    row.querySelector(".bar-pool").style.left = `${(100 * total) / scale}%`;
    const admits = figures && figures.requests ? `: admits ${figures.admitted} of ${figures.requests} live requests` : "";
    row.querySelector(".bar-label").textContent = `${blocks} of ${total} blocks${admits}`;
    box.append(row);
  }
}

function appendEvents(events, prefix) {
  const list = $("timeline");
  for (const e of events) {
    if (e.kind === "scheduled" && !e.seqs.length) continue;
    const item = document.createElement("li");
    item.dataset.kind = e.kind;
    item.innerHTML = "<span class='muted'></span> ";
    item.querySelector("span").textContent = `step ${e.step}`;
    item.append(document.createTextNode(prefix + e.text));
    list.prepend(item);
  }
  while (list.children.length > 300) list.lastChild.remove();
}

// --- recordings ----------------------------------------------------------------------------------

function download(recording) {
  const blob = new Blob([JSON.stringify(recording)], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `lab-recording-step-${$("step-number").textContent}.json`;
  link.click();
  URL.revokeObjectURL(link.href);
}

$("import").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (!file) return;
  try {
    loadReplay(JSON.parse(await file.text()), `of ${file.name}`);
    showError("");
  } catch (error) {
    showError(`cannot replay ${file.name}: ${error.message}`);
  }
});

function loadReplay(recording, name) {
  state.replay = replaySteps(recording);
  state.replayBlockSize = recording.block_size;
  $("replay").hidden = false;
  $("replay-name").textContent = name;
  const slider = $("replay-slider");
  slider.max = Math.max(0, state.replay.length - 1);
  slider.value = slider.max;
  showReplay(Number(slider.value));
}

function showReplay(position) {
  const entry = state.replay[position];
  if (!entry) return;
  $("replay-slider").value = position;
  $("replay-step").textContent = entry.step;
  renderTables($("replay-tables"), entry.requests, entry.blocks, state.replayBlockSize, false);
  renderPool($("replay-pool"), entry.blocks);
  const list = $("replay-events");
  list.replaceChildren();
  for (const e of entry.events) {
    if (!e.text) continue;
    const item = document.createElement("li");
    item.dataset.kind = e.kind;
    item.textContent = e.text;
    list.append(item);
  }
}

$("replay-slider").addEventListener("input", (event) => showReplay(Number(event.target.value)));
$("replay-back").addEventListener("click", () => showReplay(Math.max(0, Number($("replay-slider").value) - 1)));
$("replay-forward").addEventListener("click", () =>
  showReplay(Math.min(state.replay.length - 1, Number($("replay-slider").value) + 1)));

socket.connect();
