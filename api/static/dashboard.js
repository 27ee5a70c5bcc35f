"use strict";
const state = { outbox: null, socket: null, lastId: 0, selected: null, destination: null, loading: null, cursor: null, pages: [], next: null };
const $ = (id) => document.getElementById(id);
const tokenInput = $("token");
// The tab's session only: a token in localStorage would outlive it and be readable by any page
// script of this origin for good. An older page's stored copy is dropped.
localStorage.removeItem("outbox-token");
tokenInput.value = sessionStorage.getItem("outbox-token") || "";
tokenInput.addEventListener("change", () => { sessionStorage.setItem("outbox-token", tokenInput.value); load(); });
$("token-form").addEventListener("submit", (event) => event.preventDefault());
$("delivery-filter").addEventListener("change", () => { if (state.outbox) firstPage(); });
for (const id of ["status-filter", "destination-filter", "key-filter"]) $(id).addEventListener("change", () => { if (state.outbox) firstPage(); });
$("first-page").addEventListener("click", () => firstPage());
$("next-page").addEventListener("click", () => { if (!state.next) return; state.pages.push(state.cursor); openPage(state.next); });
function firstPage() { state.pages = []; return openPage(null); }
// Until the new page's answer is in, there is no next page to go to: the cursor the page before
// left (another filter's list, or the page just left) would open a page of that other list.
function openPage(cursor) { state.cursor = cursor; state.next = null; $("next-page").disabled = true; return loadItems(); }
// Deep links: #/outboxes/<outbox>/items/<key> opens that item, #/destinations/<name> that
// destination's view.
function hashTarget() {
  const destination = /^#\/destinations\/(.+)$/.exec(location.hash);
  if (destination) return { destination: decodeURIComponent(destination[1]) };
  const match = /^#\/outboxes\/([^/]+)(?:\/items\/(.+))?$/.exec(location.hash);
  return match ? { outbox: decodeURIComponent(match[1]), key: match[2] ? decodeURIComponent(match[2]) : null } : null;
}
async function openHash() {
  const target = hashTarget();
  if (!target) return;
  if (target.destination) { await showDestination(target.destination); return; }
  if (state.outbox !== target.outbox) await selectOutbox(target.outbox);
  if (target.key && state.selected !== target.key) await showItem(target.key);
}
function destinationLink(name) { return `#/destinations/${encodeURIComponent(name)}`; }
// Opening the view already in the address changes no hash: show it again (fresh) instead.
function openDestination(name) {
  if (location.hash === destinationLink(name)) showDestination(name).catch((error) => alert(error.message));
  else location.hash = destinationLink(name);
}
window.addEventListener("hashchange", () => { openHash().catch((error) => alert(error.message)); });
$("purge-button").addEventListener("click", async () => {
  if (!state.outbox || !confirm(`Cancel every item of ${state.outbox} not yet submitted?`)) return;
  try {
    const purged = await api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/items:purge`, { method: "POST", body: "{}" });
    alert(`Cancelled ${purged.cancelled} item(s); ${purged.skipped} had reached the provider.`);
    await loadItems();
  } catch (error) { alert(error.message); }
});

$("redrive-all").addEventListener("click", async () => {
  if (!state.outbox || !confirm(`Redrive every dead letter of ${state.outbox}?`)) return;
  try { await redriveAll(); } catch (error) { alert(error.message); }
});

async function loadPermissions() {
  const token = await api("/v1/token");
  // Lets the Temporal Web UI's codec calls (cookies only) decrypt with this token.
  await api("/v1/token/session", { method: "POST", body: "{}" }).catch(() => {});
  for (const scope of ["enqueue", "operate"]) {
    document.body.classList.toggle(`no-${scope}`, !token.scopes.includes(scope));
  }
}

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
  if (tokenInput.value) headers.Authorization = `Bearer ${tokenInput.value}`;
  const response = await fetch(path, { ...options, headers });
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = new Error(body && body.detail ? `${body.title}: ${body.detail}` : response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function text(value) { return value === null || value === undefined ? "" : String(value); }
function cell(value, className) { const td = document.createElement("td"); td.textContent = text(value); if (className) td.className = className; return td; }
function time(value) { return value ? new Date(value).toLocaleString([], { dateStyle: "medium", timeStyle: "medium" }) : ""; }
// Tables: the local date and time in 19 characters, the long form on hover.
function shortTime(value) {
  if (!value) return "";
  const at = new Date(value), two = (n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${two(at.getMonth() + 1)}-${two(at.getDate())} ${two(at.getHours())}:${two(at.getMinutes())}:${two(at.getSeconds())}`;
}
// The date and the hour each stay whole: a squeezed column puts one over the other.
function timeCell(value) {
  const td = cell("", "time"); td.title = time(value);
  const [day, hour] = shortTime(value).split(" ");
  if (day) for (const [part, gap] of [[day, " "], [hour, ""]]) { const span = document.createElement("span"); span.textContent = part; td.append(span, gap); }
  return td;
}
function scrolling(table) { const box = document.createElement("div"); box.className = "table-scroll"; box.append(table); return box; }

async function loadDestinationControls() {
  const destinations = await api("/v1/destinations");
  $("destinations").replaceChildren(...destinations.map((d) => {
    const row = document.createElement("div");
    row.className = "destination";
    row.dataset.destination = d.name;
    // A throttle's pause ends by itself; a ramp after one runs below the configured rate.
    const rate = d.paused_until
      ? `throttled until ${time(d.paused_until)}; resumes by itself`
      : d.circuit === "open"
        ? "circuit open: its submits kept failing; closes when a probe succeeds"
        : d.disabled
        ? `disabled since ${time(d.disabled_since)}: it failed too long; resume re-enables it`
        : d.paused
        ? `paused: ${d.pause_reason || ""}`
        : d.submit.source === "api" && d.submit.rate < d.configured_submit_rate
          ? `${d.submit.rate}/s of ${d.configured_submit_rate}/s`
          : `${d.submit.rate}/s`;
    const button = document.createElement("button");
    button.className = "pause-button needs-operate";
    button.textContent = d.paused ? "Resume" : "Pause";
    button.addEventListener("click", async () => {
      try {
        await api(`/v1/destinations/${encodeURIComponent(d.name)}`, { method: "PATCH", body: JSON.stringify({ paused: !d.paused, reason: "from the dashboard" }) });
      } catch (error) { alert(error.message); }
      await loadDestinationControls();
      if (state.destination === d.name) await showDestination(d.name);
    });
    const name = document.createElement("a"); name.className = "name"; name.textContent = d.name; name.title = `${d.name}: rates, pause and flow control`;
    name.href = destinationLink(d.name);
    name.addEventListener("click", (event) => { event.preventDefault(); openDestination(d.name); });
    const stateLine = document.createElement("span"); stateLine.className = d.paused ? "status status-failed" : "muted"; stateLine.textContent = rate;
    row.append(name, stateLine, " ", button);
    return row;
  }));
}

async function loadSchedules() {
  let schedules;
  try { schedules = (await api("/v1/schedules")).schedules; }
  catch (error) {
    // E.g. a Temporal server without schedules (501): say so instead of an empty list.
    const note = document.createElement("span"); note.className = "muted"; note.textContent = error.message;
    $("schedules").replaceChildren(note); state.schedulesRendered = null;
    return;
  }
  // Re-rendering an unchanged list would pull its buttons from under the pointer.
  const rendered = JSON.stringify(schedules.map((s) => [s.id, s.paused, s.note, s.next_fire_times[0], s.last_fired_at]));
  if (rendered === state.schedulesRendered) return;
  state.schedulesRendered = rendered;
  $("schedules").replaceChildren(...schedules.map((s) => {
    const row = document.createElement("div");
    row.className = "schedule";
    row.dataset.schedule = s.id;
    const name = document.createElement("div"); name.className = "name"; name.textContent = s.id; name.title = s.id;
    const when = s.cron ? `${s.cron}${s.timezone ? ` (${s.timezone})` : ""}` : `every ${s.interval_seconds}s`;
    const spec = document.createElement("div"); spec.className = "muted"; spec.textContent = `${when} → ${text(s.outbox)}, ${text(s.items)} item(s)`;
    const status = document.createElement("div");
    const label = document.createElement("span");
    label.className = s.paused ? "status schedule-state status-cancelled" : "status schedule-state status-sent";
    label.textContent = s.paused ? `paused${s.note ? `: ${s.note}` : ""}` : "active";
    status.append(label);
    if (!s.paused && s.next_fire_times.length) status.append(` · next ${new Date(s.next_fire_times[0]).toLocaleString()}`);
    if (s.last_fired_at) status.append(` · last ${new Date(s.last_fired_at).toLocaleString()}`);
    const buttons = document.createElement("div");
    for (const [title, action] of [[s.paused ? "Unpause" : "Pause", s.paused ? "unpause" : "pause"], ["Fire now", "trigger"]]) {
      const button = document.createElement("button");
      button.textContent = title; button.className = `schedule-${action === "trigger" ? "trigger" : "pause"}`;
      button.addEventListener("click", async () => {
        try { await api(`/v1/schedules/${encodeURIComponent(s.id)}/${action}`, { method: "POST", body: action === "trigger" ? undefined : JSON.stringify({ note: "from the dashboard" }) }); }
        catch (error) { alert(error.message); }
        setTimeout(() => loadSchedules().catch(() => {}), 500);
      });
      buttons.append(button, " ");
    }
    row.append(name, spec, status, buttons);
    return row;
  }));
}
setInterval(() => loadSchedules().catch(() => {}), 5000);


// The health strip: one tile per destination, sent and failed per minute over the last hour
// (GET /v1/destinations/{name}/activity) as two inline-SVG lines, the queue and the state.
const SVG = "http://www.w3.org/2000/svg";
function sparkline(series, className, max, width, height) {
  const path = document.createElementNS(SVG, "polyline");
  const step = series.length > 1 ? width / (series.length - 1) : width;
  path.setAttribute("points", series.map((v, i) => `${(i * step).toFixed(1)},${(height - 1 - (max ? v / max : 0) * (height - 2)).toFixed(1)}`).join(" "));
  path.setAttribute("class", className);
  return path;
}
function chart(minutes) {
  const width = 224, height = 32;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none"); svg.setAttribute("role", "img");
  const sent = minutes.map((m) => m.sent), failed = minutes.map((m) => m.failed);
  const max = Math.max(1, ...sent, ...failed);
  const title = document.createElementNS(SVG, "title");
  title.textContent = `last ${minutes.length} min: ${sent.reduce((a, b) => a + b, 0)} sent, ${failed.reduce((a, b) => a + b, 0)} failed (peak ${max}/min)`;
  svg.append(title, sparkline(sent, "spark-sent", max, width, height), sparkline(failed, "spark-failed", max, width, height));
  return svg;
}
function age(seconds) {
  if (seconds === null || seconds === undefined) return "none";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
function destinationState(d) {
  if (d.paused_until) return ["throttled until " + time(d.paused_until), "state-wait"];
  if (d.circuit === "open") return ["circuit open", "state-bad"];
  if (d.disabled) return ["disabled since " + time(d.disabled_since), "state-bad"];
  if (d.paused) return ["paused" + (d.pause_reason ? `: ${d.pause_reason}` : ""), "state-bad"];
  if (d.unknown) return ["state unknown (the Temporal server cannot say)", "state-wait"];
  return ["running", "state-ok"];
}
// GET /v1/destinations needs the Temporal server's task-queue API; a server without it (the
// test server) still lets the strip show the configured destinations from the outbox's stats.
async function healthDestinations() {
  try { return await api("/v1/destinations"); }
  catch (error) {
    if (!state.outbox) throw error;
    const stats = await api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/stats`);
    return stats.destinations.map((d) => ({
      name: d.name, paused: Boolean(d.paused), unknown: d.paused === null || d.paused === undefined,
      submit: { rate: d.submit_rate_in_force ?? d.submit_rate }, configured_submit_rate: d.submit_rate,
    }));
  }
}
async function loadHealth() {
  const destinations = await healthDestinations();
  const tiles = await Promise.all(destinations.map(async (d) => {
    const tile = document.createElement("div");
    tile.className = "tile"; tile.dataset.destination = d.name; tile.title = `${d.name}: rates, pause and flow control`;
    tile.addEventListener("click", () => openDestination(d.name));
    const name = document.createElement("div"); name.className = "name"; name.textContent = d.name; name.title = d.name;
    const [label, cls] = destinationState(d);
    const stateLine = document.createElement("div"); stateLine.className = "state " + cls; stateLine.textContent = label;
    tile.append(name, stateLine);
    try {
      const activity = await api(`/v1/destinations/${encodeURIComponent(d.name)}/activity?minutes=60`);
      const sent = activity.minutes.reduce((a, m) => a + m.sent, 0), failed = activity.minutes.reduce((a, m) => a + m.failed, 0);
      const legend = document.createElement("div"); legend.className = "legend";
      legend.innerHTML = `last hour: <span class="status-sent sent-count">${sent} sent</span>, <span class="status-failed failed-count">${failed} failed</span>`;
      const queue = document.createElement("div"); queue.className = "queue";
      queue.textContent = `queued ${activity.queued}; oldest waits ${age(activity.oldest_queued_age_s)}`;
      tile.append(chart(activity.minutes), legend, queue);
    } catch (error) {
      const err = document.createElement("div"); err.className = "error"; err.textContent = error.message; tile.append(err);
    }
    const rate = document.createElement("div"); rate.className = "rate muted";
    rate.textContent = `rate ${d.submit.rate}/s` + (d.submit.rate < d.configured_submit_rate ? ` of ${d.configured_submit_rate}/s` : "");
    tile.append(rate);
    return tile;
  }));
  $("health").replaceChildren(...tiles);
}
setInterval(() => {
  loadHealth().catch(() => {});
  if (state.destination) showDestination(state.destination).catch(() => {});
}, 30_000);

async function loadVersion() {
  const health = await api("/healthz");
  $("version").textContent = `v${health.version}`;
}

async function refresh() {
  loadVersion().catch(() => {});
  loadPermissions().catch(() => {});
  loadHealth().catch(() => {});
  loadDestinationControls().catch(() => {});
  loadSchedules().catch(() => {});
  const outboxes = await api("/v1/outboxes");
  const list = $("outboxes");
  list.replaceChildren();
  for (const entry of outboxes) {
    const li = document.createElement("li");
    li.textContent = `${entry.outbox} (${entry.total})`;
    li.dataset.outbox = entry.outbox;
    if (entry.outbox === state.outbox) li.className = "active";
    li.addEventListener("click", () => selectOutbox(entry.outbox));
    list.append(li);
  }
  const target = hashTarget();
  if (!state.outbox && outboxes.length) await selectOutbox(target && target.outbox ? target.outbox : outboxes[0].outbox);
  // Nothing to follow yet: look again shortly, so the first item ever enqueued shows up.
  if (!outboxes.length) setTimeout(() => refresh().catch(() => {}), 2000);
  else if (state.outbox) await loadItems();
}

// A body each provider accepts, so the form's test item can succeed as it stands: ACS's send-email
// and send-SMS request bodies, and any JSON for a webhook.
const SAMPLE_PAYLOADS = {
  "acs-email": { senderAddress: "noreply@example.com", recipients: { to: [{ address: "ada@example.com" }] }, content: { subject: "A test item", plainText: "Sent from the dashboard" } },
  "acs-sms": { from: "+18005550100", smsRecipients: [{ to: "+15550100" }], message: "A test item from the dashboard" },
  webhook: { event: "dashboard.test" },
  // A JSON API (`fake-payments`): the body as it stands; a URL naming `{payload.<field>}` needs it.
  http: { amount: 100, currency: "eur", description: "A test item from the dashboard" },
};
const samplePayloads = new Set(Object.values(SAMPLE_PAYLOADS).map((body) => JSON.stringify(body, null, 1)));
// The chosen destination's sample, unless the payload was edited (then it stays).
function offerSamplePayload() {
  const payload = $("enqueue-payload"), option = $("enqueue-destination").selectedOptions[0];
  const sample = option && SAMPLE_PAYLOADS[option.dataset.provider];
  if (sample && (!payload.value.trim() || samplePayloads.has(payload.value))) payload.value = JSON.stringify(sample, null, 1);
}
$("enqueue-destination").addEventListener("change", offerSamplePayload);

async function loadDestinations() {
  const stats = await api(`/v1/outboxes/${encodeURIComponent($("enqueue-outbox").value || "demo")}/stats`);
  const select = $("enqueue-destination");
  const chosen = select.value;
  select.replaceChildren(...stats.destinations.map((d) => { const o = document.createElement("option"); o.value = d.name; o.dataset.provider = d.provider; o.textContent = `${d.name} (${d.provider})`; return o; }));
  if (stats.destinations.some((d) => d.name === chosen)) select.value = chosen;
  offerSamplePayload();
}

async function selectOutbox(outbox) {
  if (state.outbox !== outbox) { state.lastId = 0; state.cursor = null; state.pages = []; }
  state.outbox = outbox;
  for (const li of $("outboxes").children) li.className = li.dataset.outbox === outbox ? "active" : "";
  $("items-title").textContent = `Items of ${outbox}`;
  // The socket first: the server fixes where the stream starts before it accepts, so the table
  // loaded after `open` plus the stream miss nothing, however fast the items move.
  await connect();
  loadHealth().catch(() => {});
  await loadItems();
}

function loadItems() {
  state.loading = loadPage().finally(() => { state.loading = null; });
  return state.loading;
}

async function loadPage() {
  // Loads overlap (a filter changed while the periodic refresh's load is out): only the
  // newest one's answer is shown, never an older one arriving after it.
  const generation = state.itemsGeneration = (state.itemsGeneration || 0) + 1;
  const [page, stats] = await Promise.all([
    api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/items?limit=${PAGE_SIZE}${deliveryQuery()}${filterQuery()}${state.cursor ? `&cursor=${encodeURIComponent(state.cursor)}` : ""}`),
    api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/stats`),
  ]);
  if (generation !== state.itemsGeneration) return;
  renderCounts(stats);
  $("items").replaceChildren(...page.items.map(row));
  state.next = page.next_cursor || null;
  $("next-page").disabled = !state.next;
  $("first-page").disabled = !state.cursor;
  $("page-info").textContent = `page ${state.pages.length + 1}` + (state.next ? "" : " (last)");
  await loadLanes();
  await loadDeadLetters();
}

async function loadDeadLetters() {
  const outbox = state.outbox;
  const base = `/v1/outboxes/${encodeURIComponent(outbox)}`;
  const page = await api(`${base}/dead-letters?limit=100`);
  // As with lanes: leave an unchanged table (and its buttons) alone.
  const rendered = JSON.stringify([outbox, page.dead_letters.map((d) => [d.key, d.failed_at])]);
  if (rendered === state.deadLettersRendered) return;
  state.deadLettersRendered = rendered;
  const none = !page.dead_letters.length;
  $("dead-letters-none").hidden = !none; $("dead-letters-table").hidden = none; $("redrive-all").hidden = none;
  $("dead-letters").replaceChildren(...page.dead_letters.map((letter) => {
    const tr = document.createElement("tr");
    tr.className = "dead-letter";
    tr.dataset.key = letter.key;
    const actions = document.createElement("td");
    actions.className = "actions";
    const act = (label, className, url, body) => {
      const button = document.createElement("button");
      button.textContent = label; button.className = `${className} needs-operate`;
      button.addEventListener("click", async () => {
        try { await api(url, { method: "POST", body: JSON.stringify(body) }); }
        catch (error) { alert(error.message); }
        setTimeout(() => loadDeadLetters().catch(() => {}), 500);
      });
      actions.append(button, " ");
    };
    act("Redrive", "dead-letter-redrive", letter.links.redrive, {});
    act("Discard", "dead-letter-discard", letter.links.discard, { reason: "discarded from the dashboard" });
    const error = cell(letter.last_error || "", "error-text"); error.title = letter.last_error || "";
    const key = cell(letter.key); key.title = `${letter.key} → ${letter.destination}`;
    tr.append(key, cell(letter.attempts), timeCell(letter.failed_at), error, actions);
    return tr;
  }));
}

async function redriveAll() {
  const base = `/v1/outboxes/${encodeURIComponent(state.outbox)}`;
  let batch = await api(`${base}/dead-letters:redrive`, { method: "POST", body: "{}" });
  // The batch runs in Temporal; follow it until done.
  while (!batch.done && batch.state === "running") {
    $("redrive-batch").textContent = `redriving: ${batch.redriven} so far`;
    await new Promise((resolve) => setTimeout(resolve, 500));
    batch = await api(batch.links.self);
  }
  $("redrive-batch").textContent = `${batch.state}: ${batch.redriven} redriven, ${batch.skipped} skipped`;
  await loadDeadLetters();
}

async function loadLanes() {
  const outbox = state.outbox;
  const page = await api(`/v1/outboxes/${encodeURIComponent(outbox)}/lanes?limit=100`);
  // Re-rendering an unchanged table would pull its buttons from under the pointer.
  const rendered = JSON.stringify([outbox, page.lanes.map((l) => [l.ordering_key, l.status, l.length, l.head_key, l.halted_reason])]);
  if (rendered === state.lanesRendered) return;
  state.lanesRendered = rendered;
  $("lanes-none").hidden = page.lanes.length > 0; $("lanes-table").hidden = !page.lanes.length;
  $("lanes").replaceChildren(...page.lanes.map((lane) => {
    const tr = document.createElement("tr");
    tr.className = "lane";
    tr.dataset.lane = lane.ordering_key;
    const actions = document.createElement("td");
    actions.className = "actions";
    if (lane.status === "halted") {
      for (const [label, action] of [["Redrive head", "redrive"], ["Skip head", "skip"]]) {
        const button = document.createElement("button");
        button.textContent = label; button.className = `lane-${action} needs-operate`;
        button.addEventListener("click", async () => {
          try { await api(`/v1/outboxes/${encodeURIComponent(outbox)}/lanes/${encodeURIComponent(lane.ordering_key)}/${action}`, { method: "POST", body: "{}" }); }
          catch (error) { alert(error.message); }
          setTimeout(() => loadLanes().catch(() => {}), 500);
        });
        actions.append(button, " ");
      }
    }
    const reason = cell(lane.halted_reason || ""); reason.title = lane.halted_reason || "";
    tr.append(cell(lane.ordering_key), cell(lane.status, `status lane-status-${lane.status}`), cell(lane.length), cell(lane.head_key || ""), actions, reason);
    return tr;
  }));
}

// Small enough to page through by hand; the list API's cursor gives the next page.
const PAGE_SIZE = Math.min(500, Number(new URLSearchParams(location.search).get("page_size")) || 50);
function filterQuery() {
  const parts = [];
  if ($("status-filter").value) parts.push(`&status=${encodeURIComponent($("status-filter").value)}`);
  if ($("destination-filter").value.trim()) parts.push(`&destination=${encodeURIComponent($("destination-filter").value.trim())}`);
  if ($("key-filter").value.trim()) parts.push(`&key_prefix=${encodeURIComponent($("key-filter").value.trim())}`);
  return parts.join("");
}
function matchesFilters(item) {
  const wanted = $("delivery-filter").value, status = $("status-filter").value;
  const destination = $("destination-filter").value.trim(), prefix = $("key-filter").value.trim();
  return (!wanted || item.delivery === wanted) && (!status || item.status === status)
    && (!destination || item.destination === destination) && (!prefix || item.key.startsWith(prefix));
}
// A failed item was never delivered: its delivery report is not "pending" for anything.
function shownDelivery(item) { return item.status === "failed" && item.delivery === "pending" ? "" : (item.delivery || ""); }
function itemLink(outbox, key) { return `#/outboxes/${encodeURIComponent(outbox)}/items/${encodeURIComponent(key)}`; }
function deliveryQuery() {
  const wanted = $("delivery-filter").value;
  return wanted ? `&delivery=${wanted}` : "";
}

function row(item) {
  const tr = document.createElement("tr");
  tr.className = "item";
  tr.dataset.key = item.key;
  tr.append(cell(item.key), cell(item.destination), cell(item.status, `status status-${item.status}`), cell(shownDelivery(item), shownDelivery(item) ? `delivery delivery-${item.delivery}` : ""), cell(item.attempts), cell(item.poll_count), timeCell(item.updated_at));
  tr.addEventListener("click", () => showItem(item.key));
  return tr;
}

// Rows changed by live events are read again together, a few times a second, one batch at a
// time: a busy outbox sends hundreds of events a second, and reading a running item's row is a
// query to its workflow (Temporal limits a namespace's queries). Past ROWS_AT_ONCE changed rows,
// the page is read again instead (its list and its counts, from the read model).
const ROWS_AT_ONCE = 10;
const ROWS_EVERY_MS = 250;
const changedRows = new Set();
let rowsTimer = null;
function scheduleRow(key) {
  changedRows.add(key);
  if (!rowsTimer) rowsTimer = setTimeout(refreshRows, ROWS_EVERY_MS);
}
async function refreshRows() {
  try {
    // While the table loads, a row updated now could be overwritten by the page's older copy.
    if (state.loading) await state.loading.catch(() => {});
    const keys = [...changedRows];
    changedRows.clear();
    if (keys.length > ROWS_AT_ONCE) {
      await loadItems().catch(() => {});
      if (state.selected && keys.includes(state.selected)) showItem(state.selected).catch(() => {});
    } else {
      await Promise.all(keys.map((key) => updateRow(key).catch(() => {})));
    }
  } finally {
    rowsTimer = changedRows.size ? setTimeout(refreshRows, ROWS_EVERY_MS) : null;
  }
}

async function updateRow(key) {
  const item = await api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/items/${encodeURIComponent(key)}`);
  const fresh = row(item);
  const existing = [...$("items").children].find((tr) => tr.dataset.key === key);
  if (!matchesFilters(item)) { if (existing) existing.remove(); }
  else if (existing) existing.replaceWith(fresh); else if (!state.cursor) $("items").prepend(fresh);
  if (state.selected === key) showItem(key);
}

let countsTimer = null;
function scheduleCounts() {
  // Many events can arrive at once; refresh the counts at most twice a second.
  if (countsTimer) return;
  countsTimer = setTimeout(async () => {
    countsTimer = null;
    renderCounts(await api(`/v1/outboxes/${encodeURIComponent(state.outbox)}/stats`));
    await loadLanes();
    await loadDeadLetters();
  }, 500);
}

function renderCounts(stats) {
  const spans = Object.entries(stats.counts).map(([status, n]) => {
    const span = document.createElement("span");
    span.className = `status status-${status}`;
    span.textContent = `${status}: ${n}`;
    return span;
  });
  const relay = stats.relay;
  if (relay && (relay.pending || relay.refused)) {
    // Rows of the transactional outbox the relay has yet to enqueue (or refused).
    const span = document.createElement("span");
    span.className = "status relay-backlog";
    span.id = "relay-backlog";
    span.textContent = `relay: ${relay.pending} pending, ${relay.refused} refused, lag ${relay.lag_s.toFixed(1)} s`;
    spans.push(span);
  }
  $("counts").replaceChildren(...spans);
}

// A WebSocket cannot carry an Authorization header: the token goes as the subprotocols
// `bearer` and `bearer.<base64url>`, never in the URL (which access logs keep).
function bearerProtocols() {
  if (!tokenInput.value) return [];
  const bytes = new TextEncoder().encode(tokenInput.value);
  const encoded = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return ["bearer", `bearer.${encoded}`];
}

function connect() {
  if (state.socket) state.socket.close();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const outbox = state.outbox;
  // First connection: only what happens from now on (the table was just loaded); a reconnect
  // resumes after the last event seen, so nothing is missed.
  const since = state.lastId ? `since=${state.lastId}` : "";
  const socket = new WebSocket(`${scheme}://${location.host}/v1/outboxes/${encodeURIComponent(outbox)}/live?${since}`, bearerProtocols());
  state.socket = socket;
  const opened = new Promise((resolve) => {
    socket.addEventListener("open", resolve);
    socket.addEventListener("close", resolve);
  });
  socket.onopen = () => { $("live").textContent = `live: ${outbox}`; };
  socket.onmessage = (message) => {
    const event = JSON.parse(message.data);
    state.lastId = Math.max(state.lastId, event.id);
    scheduleRow(event.key);
    scheduleCounts();
  };
  socket.onclose = () => {
    if (state.socket !== socket) return;
    $("live").textContent = "reconnecting…";
    setTimeout(() => { if (state.socket === socket) connect(); }, 1000);
  };
  return opened;
}

async function showItem(key) {
  state.selected = key; state.destination = null;
  if (location.hash !== itemLink(state.outbox, key)) window.history.replaceState(null, "", itemLink(state.outbox, key));
  const base = `/v1/outboxes/${encodeURIComponent(state.outbox)}/items/${encodeURIComponent(key)}`;
  // The attempt log is newer than some servers: without it the detail shows the events only.
  const [item, events, attempts] = await Promise.all([api(base), api(`${base}/events`), api(`${base}/attempts`).catch(() => null)]);
  if (state.selected !== key) return;  // another item or a destination was opened meanwhile
  const detail = $("detail");
  detail.replaceChildren();
  const h2 = document.createElement("h2"); h2.textContent = `Item ${key}`; detail.append(h2);
  const link = document.createElement("a"); link.href = itemLink(state.outbox, key); link.id = "detail-link"; link.textContent = "link to this item"; link.className = "muted"; detail.append(link);
  const facts = document.createElement("p");
  facts.innerHTML = "";
  facts.append(`${item.destination} · `);
  const status = document.createElement("span"); status.className = `status status-${item.status}`; status.id = "detail-status"; status.textContent = item.status; facts.append(status);
  if (shownDelivery(item)) { const d = document.createElement("span"); d.className = `delivery delivery-${item.delivery}`; d.id = "detail-delivery"; d.textContent = ` · delivery ${shownDelivery(item)}`; facts.append(d); }
  facts.append(` · attempts ${item.attempts}/${item.max_attempts} · polls ${item.poll_count}` + (item.created_at ? ` · created ${time(item.created_at)}` : ""));
  if (item.ordering_key) facts.append(` · lane ${item.ordering_key}`);
  detail.append(facts);
  if (item.last_error) { const e = document.createElement("p"); e.className = "error"; e.textContent = item.last_error; detail.append(e); }
  if (item.waiting_on && item.waiting_on.length) {
    // Why a queued item has not gone yet (flowcontrol/waiting.py), and until when if known.
    const waiting = document.createElement("p"); waiting.id = "detail-waiting"; waiting.className = "muted";
    waiting.className = "status status-queued";
    waiting.textContent = "Waiting: " + item.waiting_on.map((w) => w.until ? `${w.detail} until ${time(w.until)}` : w.detail).join("; ");
    detail.append(waiting);
  }
  if (item.recipients && item.recipients.length) {
    const recipients = document.createElement("table");
    recipients.id = "recipients";
    recipients.innerHTML = "<thead><tr><th>Recipient</th><th>Delivery</th><th>Detail</th><th>At</th></tr></thead>";
    const rows = document.createElement("tbody");
    for (const r of item.recipients) {
      const tr = document.createElement("tr");
      tr.dataset.address = r.address;
      const recipientStatus = item.status === "failed" && r.status === "pending" ? "not sent" : r.status;
      tr.append(cell(r.address), cell(recipientStatus, `delivery recipient-${r.status}`), cell(r.detail || "", "text"), timeCell(r.at));
      rows.append(tr);
    }
    recipients.append(rows); detail.append(scrolling(recipients));
  }
  const buttons = document.createElement("p");
  // Only what the item's status accepts (service/items.py): cancel a queued item, redrive a failed one.
  const actions = { queued: [["Cancel", "cancel"]], failed: [["Redrive", "redrive"]] }[item.status] || [];
  for (const [label, action] of actions) {
    const button = document.createElement("button"); button.textContent = label; button.id = `${action}-button`; button.className = "needs-operate";
    button.addEventListener("click", async () => {
      try {
        const answer = await api(`${base}/${action}`, { method: "POST", body: "{}" });
        if (answer && answer.cancel_requested) alert("No worker answered in time: the cancel is recorded and applies when a worker returns.");
        await updateRow(key);
      }
      catch (error) { alert(error.message); }
    });
    buttons.append(button, " ");
  }
  detail.append(buttons);
  const history = document.createElement("table");
  history.innerHTML = "<thead><tr><th>#</th><th>Event</th><th>Status</th><th>At</th><th>Detail</th></tr></thead>";
  const body = document.createElement("tbody");
  for (const e of events) { const tr = document.createElement("tr"); tr.append(cell(e.seq), cell(e.type), cell(e.status, `status status-${e.status}`), timeCell(e.at), cell(e.detail, "text")); body.append(tr); }
  history.append(body); detail.append(scrolling(history));
  const attemptList = Array.isArray(attempts) ? attempts : attempts && Array.isArray(attempts.attempts) ? attempts.attempts : null;
  if (attemptList && attemptList.length) {
    const h3 = document.createElement("h2"); h3.textContent = "Attempts"; detail.append(h3);
    const table = document.createElement("table"); table.id = "attempts";
    // The answer (status, or the error when none came) before the request's details.
    table.innerHTML = "<thead><tr><th>#</th><th>Kind</th><th>Started</th><th>Status</th><th>Took</th><th>Request</th><th>Response</th></tr></thead>";
    const tbody = document.createElement("tbody");
    for (const a of attemptList) {
      const tr = document.createElement("tr");
      const response = a.response || {}, request = a.request || {};
      const answered = response.status !== null && response.status !== undefined;
      const status = cell(answered ? response.status : a.error || "no answer", `attempt-status status ${answered && response.status < 400 ? "status-sent" : "status-failed"}`);
      const sent = cell(request.method ? `${request.method} ${request.path || ""}` : "", "clip"); sent.title = request.method ? `${request.method} ${request.host || ""}${request.path || ""}` : "";
      const body = cell(response.body || "", "clip"); body.title = response.body || "";
      tr.append(cell(a.n), cell(a.kind), timeCell(a.started_at), status, cell(a.latency_ms === undefined ? "" : `${a.latency_ms} ms`), sent, body);
      tbody.append(tr);
    }
    table.append(tbody); detail.append(scrolling(table));
  }
  const payload = document.createElement("pre"); payload.textContent = JSON.stringify(item.payload, null, 2); detail.append(payload);
}

// A destination's view: the rates in force and where they come from, its pause, its circuit, and
// the flow-control rules in force (GET /v1/destinations/{name}), those changed at run time marked.
function flowValue(value) {
  if (value === null || value === undefined) return "none";
  if (typeof value === "boolean") return value ? "on" : "off";
  if (Array.isArray(value)) return value.length ? value.map((q) => `${q.max} per ${q.per}${typeof q.per === "number" ? " s" : ""}`).join(", ") : "none";
  return String(value);
}
function factsTable(id, rows) {
  const table = document.createElement("table"); table.className = "facts"; table.id = id;
  const body = document.createElement("tbody");
  for (const [label, value, valueId, className] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = label;
    const td = value instanceof Node ? (() => { const c = document.createElement("td"); c.append(value); return c; })() : cell(value, className);
    if (valueId) td.id = valueId;
    tr.append(th, td); body.append(tr);
  }
  table.append(body);
  return table;
}
async function showDestination(name) {
  state.destination = name; state.selected = null;
  if (location.hash !== destinationLink(name)) window.history.replaceState(null, "", destinationLink(name));
  let d = null, failure = null;
  try { d = await api(`/v1/destinations/${encodeURIComponent(name)}`); } catch (error) { failure = error; }
  if (state.destination !== name) return;  // another destination or an item was opened meanwhile
  const detail = $("detail");
  detail.replaceChildren();
  const h2 = document.createElement("h2"); h2.textContent = `Destination ${name}`; detail.append(h2);
  const link = document.createElement("a"); link.href = destinationLink(name); link.id = "detail-link"; link.textContent = "link to this destination"; link.className = "muted"; detail.append(link);
  if (failure) { const e = document.createElement("p"); e.className = "error"; e.textContent = failure.message; detail.append(e); return; }
  const [label, cls] = destinationState(d);
  const stateLine = document.createElement("span"); stateLine.className = `status ${cls}`; stateLine.textContent = label;
  const paused = !d.paused && !d.paused_until ? "no"
    : "yes" + (d.paused_until ? ` until ${time(d.paused_until)} (a provider's throttle; resumes by itself)` : "") + (d.pause_reason ? `: ${d.pause_reason}` : "");
  const rows = [["Provider", d.provider], ["State", stateLine, "destination-state"], ["Paused", paused, "destination-paused"], ["Circuit", d.circuit, "destination-circuit", `status ${d.circuit === "open" ? "state-bad" : "state-ok"}`]];
  const flow = d.flow;
  if (flow && flow.circuit === "open") {
    rows.push(["Opened", time(flow.opened_at)], ["Next probe", time(flow.next_probe_at)], ["Probes failed", flow.probes_failed]);
    if (flow.last_error) rows.push(["Last error", flow.last_error]);
  }
  if (flow) rows.push(["Throttle", `${flow.storms} storm(s) met; submits at ${Math.round(flow.factor * 100)}% of the rate`]);
  if (flow && flow.adaptive) {
    // The adaptive rate (flowcontrol/adaptive.py): where it is, its bounds, its newest moves.
    const a = flow.adaptive;
    const recent = a.history.slice(-10).map((p) => `${p.rate}`).join(" → ");
    rows.push(["Adaptive rate", `${a.rate}/s between ${a.floor} and ${a.ceiling}/s` + (a.released ? " (a rate set by hand holds)" : "") + (recent ? `; recent: ${recent}` : ""), "destination-adaptive"]);
  }
  // Requests out now under max_in_flight, counted across every worker (only while a cap is set).
  if (d.in_flight !== null && d.in_flight !== undefined) {
    const cap = d.flow_policy && d.flow_policy.max_in_flight ? d.flow_policy.max_in_flight.value : null;
    rows.push(["In flight", `${d.in_flight} of ${cap} out now`, "destination-in-flight"]);
  }
  detail.append(factsTable("destination-facts", rows));

  const h3 = document.createElement("h2"); h3.textContent = "Rates in force"; detail.append(h3);
  const rates = document.createElement("table"); rates.id = "destination-rates";
  rates.innerHTML = "<thead><tr><th>Queue</th><th>In force</th><th>Source</th><th>Configured</th></tr></thead>";
  const rateRows = document.createElement("tbody");
  for (const [queue, rate, configured, resume] of [["submit", d.submit, d.configured_submit_rate, d.resume_submit_rate], ["poll", d.poll, d.configured_poll_rate, d.resume_poll_rate]]) {
    const tr = document.createElement("tr"); tr.dataset.queue = queue;
    // Paused, the server's rate is 0; a resume restores the run-time rate, else the configured one.
    const inForce = d.paused ? `0/s (paused; resumes at ${resume ?? configured}/s)` : `${rate.rate}/s`;
    const source = d.paused ? "paused" : rate.source === "api" ? "set at run time" : "configured";
    tr.append(cell(queue + (queue === "poll" && d.poll_in_submit ? " (first poll in the submit)" : "")), cell(inForce, "rate"), cell(source, "source"), cell(`${configured}/s`));
    rateRows.append(tr);
  }
  rates.append(rateRows); detail.append(scrolling(rates));

  if (flow && flow.events.length) {
    const h = document.createElement("h2"); h.textContent = "Flow events"; detail.append(h);
    const events = document.createElement("table"); events.id = "flow-events";
    events.innerHTML = "<thead><tr><th>At</th><th>Event</th><th>Detail</th><th>Rate</th></tr></thead>";
    const body = document.createElement("tbody");
    for (const e of flow.events) { const tr = document.createElement("tr"); tr.append(timeCell(e.at), cell(e.kind), cell(e.detail, "text"), cell(e.rate === null ? "configured" : `${e.rate}/s`)); body.append(tr); }
    events.append(body); detail.append(scrolling(events));
  }

  const h4 = document.createElement("h2"); h4.textContent = "Flow policy in force"; detail.append(h4);
  if (!d.flow_policy) {
    const note = document.createElement("p"); note.className = "muted"; note.textContent = "The server cannot say which flow rules are in force."; detail.append(note);
    return;
  }
  const policy = document.createElement("table"); policy.id = "flow-policy";
  policy.innerHTML = "<thead><tr><th>Field</th><th>Value</th><th>Source</th></tr></thead>";
  const body = document.createElement("tbody");
  for (const [field, entry] of Object.entries(d.flow_policy)) {
    const tr = document.createElement("tr"); tr.dataset.field = field;
    const source = cell(entry.source === "api" ? "changed at run time " : "destinations file", "source");
    if (entry.source === "api") {
      tr.className = "changed"; source.title = time(entry.changed_at);
      const when = document.createElement("span"); when.className = "time"; when.textContent = shortTime(entry.changed_at); source.append(when);
    }
    // A long field name may break after an underscore rather than widen the table.
    const fieldName = cell(""); field.split("_").forEach((part, i, parts) => fieldName.append(part + (i < parts.length - 1 ? "_" : ""), document.createElement("wbr")));
    tr.append(fieldName, cell(flowValue(entry.value), "value"), source);
    body.append(tr);
  }
  policy.append(body); detail.append(scrolling(policy));
  const note = document.createElement("p"); note.className = "muted";
  note.textContent = "Marked fields were changed with PATCH /v1/destinations/{name} (\"flow\"); null there puts the file's value back.";
  detail.append(note);
}

$("enqueue-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const outbox = $("enqueue-outbox").value || "demo";
  try {
    const result = await api(`/v1/outboxes/${encodeURIComponent(outbox)}/items`, {
      method: "POST",
      body: JSON.stringify({ destination: $("enqueue-destination").value, payload: JSON.parse($("enqueue-payload").value), ...($("enqueue-ordering-key").value ? { ordering_key: $("enqueue-ordering-key").value } : {}) }),
    });
    $("enqueue-result").textContent = `enqueued ${result.key}`;
    if (state.outbox !== outbox) { await refresh(); await selectOutbox(outbox); }
  } catch (error) { $("enqueue-result").textContent = error.message; }
});

// An API with tokens answers 401 until one is given: say where it goes, not just "Unauthorized".
function load() {
  return refresh().then(openHash).then(loadDestinations).catch((error) => {
    $("live").textContent = error.status === 401
      ? "This API needs a token: paste one (API_TOKEN's or a tokens file's) into the API token box"
      : error.message;
    if (error.status === 401) tokenInput.focus();
  });
}
load();
