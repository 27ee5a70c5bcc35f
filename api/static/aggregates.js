"use strict";
const $ = (id) => document.getElementById(id);
const page = { types: [], type: null, id: null, socket: null, effectsTimer: null, effectsShown: null, stateReading: null, stateAgain: false };
const tokenInput = $("token");
// The tab's session only: a token in localStorage would outlive it and be readable by any page
// script of this origin for good. An older page's stored copy is dropped.
localStorage.removeItem("outbox-token");
tokenInput.value = sessionStorage.getItem("outbox-token") || "";
tokenInput.addEventListener("change", () => { sessionStorage.setItem("outbox-token", tokenInput.value); loadTypes(); });

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
  if (tokenInput.value) headers.Authorization = `Bearer ${tokenInput.value}`;
  const response = await fetch(path, { ...options, headers });
  const body = await response.json();
  if (!response.ok) throw new Error(body && body.detail ? `${body.title}: ${body.detail}` : response.statusText);
  return body;
}
const enc = encodeURIComponent;
function base() { return `/v1/aggregates/${enc(page.type)}/${enc(page.id)}`; }
// Text only, never markup: every value shown here may come from a user.
function cell(value, className) { const td = document.createElement("td"); td.textContent = value ?? ""; if (className) td.className = className; return td; }
function row(values, className) { const tr = document.createElement("tr"); tr.append(...values.map((v) => v instanceof Node ? v : cell(v))); if (className) tr.className = className; return tr; }
const time = (iso) => iso ? new Date(iso).toLocaleTimeString() : "";
function lasted(from, to) {
  if (!from || !to) return "";
  const s = Math.round((new Date(to) - new Date(from)) / 1000);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${s % 60} s`;
}
function item(text, active, onClick, data) {
  const li = document.createElement("li"); li.textContent = text; li.className = active ? "active" : "";
  if (data) li.dataset.id = data;
  li.addEventListener("click", onClick); return li;
}

async function loadTypes() {
  page.types = await api("/v1/aggregates");
  $("types").replaceChildren(...page.types.map((t) => item(t.type, t.type === page.type, () => pickType(t.type))));
  if (!page.type && page.types.length) await pickType(page.types[0].type);
}

async function pickType(type) {
  page.type = type; page.id = null;
  for (const li of $("types").children) li.className = li.textContent === type ? "active" : "";
  const commands = page.types.find((t) => t.type === type).commands;
  $("command-name").replaceChildren(...Object.keys(commands).map((name) => { const o = document.createElement("option"); o.value = o.textContent = name; return o; }));
  prefillCommand();
  await loadIds();
}

async function loadIds() {
  const listed = await api(`/v1/aggregates/${enc(page.type)}?limit=200`);
  $("ids").replaceChildren(...listed.items.map((a) => item(`${a.id} (v${a.version})`, a.id === page.id, () => pickAggregate(a.id), a.id)));
}

async function pickAggregate(id) {
  page.id = id;
  for (const li of $("ids").children) li.className = li.dataset.id === id ? "active" : "";
  $("title").textContent = `${page.type} ${id}`;
  $("events").replaceChildren();
  await showState();
  connect();
}

async function showState() {
  const opened = base();
  try {
    const view = await api(opened);
    if (base() !== opened) return; // another aggregate was opened meanwhile
    $("version").textContent = `version ${view.version}` + (view.rejected ? ` · ${view.rejected} rejected command(s)` : "");
    $("state").textContent = JSON.stringify({ state: view.state, views: view.views }, null, 2);
    showLabour(view.state);
  } catch (error) {
    $("version").textContent = ""; $("state").textContent = error.message;
  }
  await showEffects();
}

// Events come as fast as the aggregate takes commands (hundreds a second for a hot one), and
// opening an aggregate streams every event it has: one state read per event would send the API
// two requests for each. One read at a time, at most four a second: events that come during a
// read get one more read after it, so the page ends on the state after the last event.
const STATE_EVERY_MS = 250;
function refreshState() {
  if (page.stateReading) { page.stateAgain = true; return; }
  page.stateReading = showState().finally(() => {
    if (!page.stateAgain) { page.stateReading = null; return; }
    setTimeout(() => { page.stateReading = null; page.stateAgain = false; refreshState(); }, STATE_EVERY_MS);
  });
}

function showLabour(state) {
  $("labour").hidden = page.type !== "labour";
  if (page.type !== "labour") return;
  $("labour-title").textContent = `${state.mother_name || "not planned yet"} · ${state.status}`;
  const contractions = state.contractions.map((c, i) => row([
    time(c.started_at), c.ended_at ? time(c.ended_at) : "under way", lasted(c.started_at, c.ended_at),
    i ? lasted(state.contractions[i - 1].started_at, c.started_at) : "",
  ]));
  $("contractions").replaceChildren(...contractions.reverse());
  const updates = state.updates.map((u) => row([time(u.at), u.by, u.kind, u.message], u.kind === "announcement" ? "announcement" : ""));
  $("updates").replaceChildren(...updates.reverse());
  $("subscribers").replaceChildren(...Object.entries(state.subscribers).map(([id, s]) => row([
    id, s.name, [s.contact.email, s.contact.webhook].filter(Boolean).join(", "), s.role || "awaiting approval",
  ])));
}

async function showEffects() {
  clearTimeout(page.effectsTimer);
  if (!page.id) return;
  const opened = base();
  let effects;
  try { effects = await api(`${opened}/effects`); } catch (error) { $("effects-summary").textContent = error.message; return; }
  if (base() !== opened) return; // another aggregate was opened meanwhile
  const count = (status) => effects.filter((e) => e.status === status).length;
  $("effects-summary").textContent = `${count("pending")} pending · ${count("done")} done · ${count("failed")} failed`;
  // Rows are built again only when the ledger changed: every live event and every second of a
  // pending effect asks for it, and a link or a Retry button replaced under the pointer loses
  // the click that was landing on it.
  const shown = JSON.stringify([opened, effects]);
  if (shown !== page.effectsShown) {
    page.effectsShown = shown;
    renderEffects(effects);
  }
  // Executions finish without an event: look again while any is under way.
  if (count("pending")) page.effectsTimer = setTimeout(showEffects, 1000);
}

function renderEffects(effects) {
  $("effects").replaceChildren(...effects.map((e) => {
    const action = document.createElement("td");
    if (e.status === "failed") {
      const button = document.createElement("button"); button.textContent = "Retry";
      button.addEventListener("click", async () => {
        try { await api(`${base()}/effects/${enc(e.key)}/retry`, { method: "POST" }); } catch (error) { $("effects-summary").textContent = error.message; }
        await showEffects();
      });
      action.append(button);
    }
    const tr = row([e.name, e.kind, cell(e.status, e.status === "failed" ? "error" : e.status === "done" ? "ok" : ""), String(e.executions), outcomeCell(e), action]);
    tr.dataset.key = e.key; tr.title = e.key;
    return tr;
  }));
}

// A WebSocket cannot carry an Authorization header: the token goes as the subprotocols
// `bearer` and `bearer.<base64url>`, never in the URL (which access logs keep).
function bearerProtocols() {
  if (!tokenInput.value) return [];
  const bytes = new TextEncoder().encode(tokenInput.value);
  const encoded = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return ["bearer", `bearer.${encoded}`];
}

// An event as a readable row: its type, when, and each field of its data on its own line.
function when(value) { return value ? new Date(value).toLocaleString([], { dateStyle: "medium", timeStyle: "medium" }) : ""; }
function fields(data) {
  const dl = document.createElement("dl"); dl.className = "fields";
  for (const [name, value] of Object.entries(data || {})) {
    const dt = document.createElement("dt"); dt.textContent = name.replaceAll("_", " ");
    const dd = document.createElement("dd"); dd.textContent = value !== null && typeof value === "object" ? JSON.stringify(value) : String(value);
    dl.append(dt, dd);
  }
  const td = document.createElement("td"); td.append(dl); return td;
}
function eventRow(e) {
  const tr = row([String(e.seq), cell(e.type, "event-type"), when(e.at || e.recorded_at || e.occurred_at), fields(e.data), e.actor || ""], "event");
  tr.dataset.seq = e.seq;
  return tr;
}
// An effect that enqueued an item links to it on the dashboard (item ids are outbox/<outbox>/<key>).
function outcomeCell(e) {
  const td = document.createElement("td");
  const match = e.result && typeof e.result.item_id === "string" ? /^outbox\/([^/]+)\/(.+)$/.exec(e.result.item_id) : null;
  if (match) {
    const a = document.createElement("a"); a.className = "item-link";
    a.href = `/#/outboxes/${encodeURIComponent(match[1])}/items/${encodeURIComponent(match[2])}`;
    a.textContent = `item ${match[2]} in ${match[1]}`;
    td.append(a);
    if (e.result.created === false) td.append(" (already there)");
  } else td.textContent = e.error || (e.result ? JSON.stringify(e.result) : "");
  return td;
}
// A command's payload pre-filled from its JSON schema: defaults and examples where given, else
// a placeholder of the field's type, required fields first.
function example(schema, defs, depth = 0) {
  if (!schema || depth > 4) return null;
  if (schema.$ref) return example(defs[schema.$ref.split("/").pop()], defs, depth + 1);
  if ("default" in schema) return schema.default;
  if (schema.examples && schema.examples.length) return schema.examples[0];
  if (schema.enum && schema.enum.length) return schema.enum[0];
  if (schema.const !== undefined) return schema.const;
  const options = schema.anyOf || schema.oneOf;
  if (options) return example(options.find((o) => o.type !== "null") || options[0], defs, depth + 1);
  switch (schema.type) {
    case "object": {
      const out = {};
      for (const [name, sub] of Object.entries(schema.properties || {})) out[name] = example(sub, defs, depth + 1);
      return out;
    }
    case "array": return [];
    case "integer": case "number": return 0;
    case "boolean": return false;
    case "string": return schema.format === "date-time" ? new Date().toISOString() : "";
    default: return null;
  }
}
function prefillCommand() {
  const type = page.types.find((t) => t.type === page.type);
  const schema = type && type.commands[$("command-name").value];
  if (!schema) return;
  $("command-payload").value = JSON.stringify(example(schema, schema.$defs || schema.definitions || {}) || {}, null, 2);
}
$("command-name").addEventListener("change", prefillCommand);

// The API opens a stream only for an aggregate that exists: one opened before its first
// command is refused, and the command reconnects it from the last event shown.
function connect() {
  if (page.socket) page.socket.close();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const shown = $("events").lastElementChild;
  const since = shown ? shown.dataset.seq : 0;
  const socket = new WebSocket(`${scheme}://${location.host}${base()}/live?since=${since}`, bearerProtocols());
  page.socket = socket;
  socket.onopen = () => { $("live").textContent = `live: ${page.type} ${page.id}`; };
  socket.onmessage = (message) => {
    const e = JSON.parse(message.data);
    $("events").append(eventRow(e));
    refreshState();
  };
  socket.onclose = () => { if (page.socket === socket) $("live").textContent = "not connected"; };
}

$("open-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const id = $("open-id").value.trim();
  if (!id || !page.type) return;
  await pickAggregate(id);
});

$("command-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!page.id) { $("command-result").textContent = "pick or open an aggregate first"; return; }
  const result = $("command-result");
  try {
    const answer = await api(`${base()}/commands/${enc($("command-name").value)}`, { method: "POST", body: $("command-payload").value });
    result.className = "ok"; result.textContent = `version ${answer.version}: ${answer.events.map((e) => e.type).join(", ") || "no change"}`;
    if (!page.socket || page.socket.readyState !== WebSocket.OPEN) connect();
    await loadIds();
  } catch (error) { result.className = "error"; result.textContent = error.message; }
});

loadTypes().catch((error) => { $("state").textContent = error.message; });
