// npcsim view: plain JavaScript, no build step, no library. All run data is shown with
// textContent (never as HTML): NPC lines and player input are untrusted text. Speaking is a
// JSON POST carrying this page's token (its <meta>); the player is the view's, not ours.
"use strict";

const CHIPS_PER_PLACE = 24;    // a 10,000-NPC world shows a sample per place, the rest on demand
const SHOWN_LINES = 300;       // newest lines kept on the page; "older lines" pages the rest
const CATEGORIES = ["dialogue", "episodic", "beliefs"];

const view = { live: true, tick: null, selected: null, snapshot: null, world: null, expanded: new Set(), oldest: null,
  compare: null };
const COMPARED = ["canonical_facts", "world_state", "beliefs", "episodic", "dialogue"];

function $(id) { return document.getElementById(id); }
function meta(name) { const m = document.querySelector('meta[name="' + name + '"]'); return m ? m.content : ""; }
function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function query(extra) {
  const params = new URLSearchParams(extra || {});
  if (!view.live && view.tick !== null) params.set("tick", view.tick);
  const s = params.toString();
  return s ? "?" + s : "";
}
async function getJSON(path, extra) {
  const response = await fetch(path + query(extra));
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

// --- health -------------------------------------------------------------------------------
function showHealth(h) {
  $("health-tick").textContent = h.tick < 0 ? "-" : h.tick;
  $("health-ticks-per-s").textContent = h.ticks_per_s;
  $("health-inferences").textContent = h.inferences;
  $("health-inferences-per-s").textContent = h.inferences_per_s;
  $("health-fallbacks").textContent = h.fallbacks;
  $("health-refused").textContent = h.refused;
  $("health-malformed").textContent = h.malformed;
  const shards = Object.entries(h.shards).map(([id, s]) => id + ": " + s.state + (s.tick == null ? "" : " @" + s.tick));
  $("health-shards").textContent = shards.length ? shards.join(", ") : "-";
}

// --- world --------------------------------------------------------------------------------
function showWorld(world) {
  view.world = world;
  const box = $("locations");
  box.replaceChildren();
  const search = $("npc-search").value.trim().toLowerCase();
  const select = $("filter-location");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "any"));
  const ids = $("npc-ids");
  ids.replaceChildren();
  const activities = world.activities || {};
  let total = 0;
  for (const place of world.locations) {
    select.append(el("option", { value: place.id }, place.id));
    const div = el("div", { class: "location", "data-location": place.id });
    const title = el("h4", {}, place.id + " (" + place.npcs.length + ")");
    title.addEventListener("click", () => { $("filter-location").value = place.id; refilter(); });
    div.append(title);
    const matching = search ? place.npcs.filter((n) => n.toLowerCase().includes(search)) : place.npcs;
    const limit = view.expanded.has(place.id) ? matching.length : CHIPS_PER_PLACE;
    for (const id of matching.slice(0, limit)) {
      const doing = activities[id] || "";
      const chip = el("button", { type: "button", class: "npc-chip", "data-npc": id, "data-activity": doing,
                                  title: (world.names[id] || id) + (doing ? ": " + doing : "") }, id);
      if (doing) chip.append(el("small", { class: "activity" }, " " + doing));
      if (id === view.selected) chip.classList.add("selected");
      chip.addEventListener("click", () => choose(id));
      div.append(chip);
    }
    if (matching.length > limit) {
      const more = el("button", { type: "button", class: "more" }, "+" + (matching.length - limit) + " more");
      more.addEventListener("click", () => { view.expanded.add(place.id); showWorld(view.world); });
      div.append(more);
    }
    if (total < 2000) for (const id of place.npcs.slice(0, 2000 - total)) ids.append(el("option", { value: id }));
    total += place.npcs.length;
    box.append(div);
  }
  select.value = chosen;
  const body = $("world-state").tBodies[0];
  body.replaceChildren();
  for (const [key, value] of Object.entries(world.state)) {
    const row = el("tr");
    row.append(el("td", {}, key), el("td", {}, value));
    body.append(row);
  }
}

// --- dialogue -----------------------------------------------------------------------------
function filters() {
  const f = {};
  const npc = $("filter-npc").value.trim();
  const location = $("filter-location").value;
  if (npc) f.npc = npc;
  if (location) f.location = location;
  return f;
}
function matches(line, f) {
  if (f.npc && line.speaker !== f.npc && line.to !== f.npc) return false;
  if (f.location && line.location !== f.location) return false;
  return true;
}
function lineNode(line) {
  const li = el("li", { class: line.kind, "data-seq": line.seq, "data-speaker": line.speaker });
  li.append(el("span", { class: "tick" }, "t" + line.tick));
  li.append(el("span", { class: "who" }, line.speaker + (line.to ? " → " + line.to : "")));
  li.append(document.createTextNode(": "));
  li.append(el("span", { class: "text" }, line.text));
  if (line.kind !== "npc") li.append(el("span", { class: "mark" }, line.kind));
  return li;
}
function addLines(lines, atTop) {
  const list = $("dialogue");
  const f = filters();
  const nodes = lines.filter((l) => matches(l, f)).map(lineNode);
  if (!nodes.length) return;
  const stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 20;
  if (atTop) list.prepend(...nodes); else list.append(...nodes);
  while (!atTop && list.children.length > SHOWN_LINES) list.firstElementChild.remove();
  view.oldest = list.firstElementChild ? Number(list.firstElementChild.dataset.seq) : null;
  if (!atTop && stick) list.scrollTop = list.scrollHeight;
}
async function refilter() {
  $("dialogue").replaceChildren();
  addLines(await getJSON("/api/lines", filters()), false);
}
async function older() {
  if (view.oldest === null) return;
  addLines(await getJSON("/api/lines", { ...filters(), before: view.oldest, limit: 100 }), true);
}

// --- one NPC ------------------------------------------------------------------------------
// A trace's `explanation` (sim.memory.explain_truncation) says each category's budget as split
// and after redistribution, what it kept and what it dropped and why; a shard older than it
// sends none, and the page then shows the report alone.
const ALL_CATEGORIES = ["canonical_facts", "world_state", ...CATEGORIES];
const REASONS = { cap: "the count cap was reached", budget: "did not fit what was left",
                  over_budget: "the mandatory content took the whole limit",
                  duplicate: "a kept line of the dialogue says it",
                  stable_prefix: "kept, but the stable prefix starts at a later anchor" };

function segmentItems(trace, name) {
  const r = trace.report, e = trace.explanation;
  if (name === "mandatory") {
    const head = "mandatory: " + r.mandatory_chars + " chars: the system prompt, the input, the section headers";
    if (!e) return head;
    const items = [...e.canonical_facts.kept_items, ...e.world_state.kept_items];
    return head + (items.length ? ", and\n" + items.map((t) => "- " + t).join("\n") : "");
  }
  const head = name + ": " + r[name].used + " chars, " + r[name].kept + " kept";
  if (!e) return head;
  const kept = e[name].kept_items;
  if (!kept.length && r[name].kept) return head + " (the run does not publish prompts)";
  const back = recalledMarks(trace);
  return head + (kept.length ? ", newest first:\n" + kept.map((t) => "- " + t + (back.get(t) || "")).join("\n") : "");
}
// What recall brought back from the NPC's whole history, by the text the prompt shows:
// a kept memory, or a summary of its place's talk (an id "sum:PLACE:FIRST-LAST").
function recalledMarks(trace) {
  const marks = new Map();
  for (const [id, text] of trace.recalled || []) {
    marks.set(text, id.startsWith("sum:") ? "  [recalled summary]" : "  [recalled]");
  }
  return marks;
}
function showSegment(trace, name) {
  const info = $("seg-info");
  info.textContent = segmentItems(trace, name);
  info.dataset.cat = name;
  info.hidden = false;
}
function bar(trace, chosen, newest) {
  const r = trace.report;
  const total = Math.max(r.limit_chars, r.prompt_chars, 1);
  const wrap = el("div", { class: "snapshot", "data-inference": trace.inference_id });
  if (trace.inference_id === chosen) wrap.classList.add("chosen");
  const label = el("div", { class: "bar-label" + (r.over_budget ? " over" : "") },
    "t" + trace.tick + ": " + r.prompt_chars + " / " + r.limit_chars + " chars" + (r.over_budget ? " OVER BUDGET" : "")
    + (trace.fallback ? " (fallback: " + trace.fallback_reason + ")" : ""));
  const b = el("div", { class: "bar" });
  const parts = [["mandatory", r.mandatory_chars], ...CATEGORIES.map((c) => [c, r[c].used])];
  for (const [name, size] of parts) {
    const seg = el("span", { class: "seg " + name, "data-cat": name, "data-chars": size });
    seg.style.width = (100 * size / total) + "%";
    seg.addEventListener("mouseenter", () => showSegment(trace, name));
    b.append(seg);
  }
  b.addEventListener("mouseleave", () => { $("seg-info").hidden = true; });
  // choosing the newest follows the newest again as traces arrive; an older one stays chosen
  wrap.addEventListener("click", () => { view.snapshot = newest ? null : trace.inference_id; showNpc(); });
  wrap.append(label, b);
  return wrap;
}
function budgetCells(name, trace) {
  const r = trace.report, e = trace.explanation, row = r[name];
  const base = { used: row.used, kept: row.kept, dropped: row.dropped + (row.duplicate || 0) };
  if (!e) return { ...base, split: row.budget, final: "", reason: "" };
  const x = e[name];
  if (x.mandatory) return { ...base, split: "mandatory", final: "", reason: "" };
  const delta = x.final - x.split;
  const final = delta ? x.final + " (" + (delta > 0 ? "+" : "") + delta + ")" : String(x.final);
  const reason = [x.reason, x.duplicate ? "duplicate" : null].filter(Boolean).join(", ");
  return { ...base, split: x.split, final: final, reason: reason };
}
function budgetTable(trace) {
  const r = trace.report, e = trace.explanation;
  const tokens = r.limit_tokens ? ", " + r.limit_tokens + " tokens" : "";
  let limit = "limit " + r.limit_chars + " chars" + tokens + " (the whole prompt): " + r.prompt_chars + " used";
  limit += "; mandatory " + r.mandatory_chars;
  if (e) limit += "; split between the others " + Math.max(e.flexible_chars, 0) + "; left unused " + e.unused_chars;
  // the report's encoding leaves its selection out when it is the default, "recency"
  limit += "; " + (r.selection || "recency") + " selection";
  // left out of the encoding when 0, as the selection when it is the default
  if (r.stable_cost_chars) limit += "; stable prefix gave up " + r.stable_cost_chars;
  if (r.over_budget) limit += "; OVER BUDGET";
  $("budget-limit").textContent = limit;
  const body = $("budget").tBodies[0];
  body.replaceChildren();
  const rows = [["mandatory", { split: "—", final: "—", used: r.mandatory_chars, kept: "", dropped: "", reason: "" }]];
  for (const c of ALL_CATEGORIES) rows.push([c, budgetCells(c, trace)]);
  for (const [name, cells] of rows) {
    const tr = el("tr", { "data-cat": name });
    tr.append(el("td", {}, name));
    for (const field of ["split", "final", "used", "kept", "dropped", "reason"]) {
      const td = el("td", { "data-field": field }, cells[field]);
      if (field === "reason" && cells.reason) td.title = cells.reason.split(", ").map(x => REASONS[x]).join("; ");
      tr.append(td);
    }
    body.append(tr);
  }
}
function droppedList(trace) {
  const list = $("dropped");
  list.replaceChildren();
  $("snapshot-tick").textContent = "tick " + trace.tick;
  const r = trace.report, e = trace.explanation;
  let shown = 0;
  for (const c of ALL_CATEGORIES) {
    const items = e ? e[c].dropped : [];
    for (const d of items) {
      const li = el("li", { class: "dropped", "data-cat": c, "data-reason": d.reason,
                            "data-tick": d.tick === null ? "" : d.tick });
      li.append(el("span", { class: "where" }, (d.tick === null ? "" : "t" + d.tick + " ") + c + ": "));
      li.append(el("span", { class: "text" }, d.text));
      li.append(el("span", { class: "reason " + d.reason, title: REASONS[d.reason] }, d.reason));
      list.append(li);
      shown += 1;
    }
    const rest = r[c].dropped + (r[c].duplicate || 0) - items.length;
    if (rest > 0) {
      const why = !e ? "" : items.length ? " older " + c + " items (npcsim audit show lists them)"
        : " " + c + " items (the run does not publish prompts)";
      list.append(el("li", { class: "more", "data-cat": c }, "+" + rest + (why || " " + c + " items")));
      shown += 1;
    }
  }
  if (!shown) list.append(el("li", { class: "none" }, "nothing: every item fitted"));
}
function showAttempts(trace) {
  const box = $("attempts");
  box.replaceChildren();
  if (!Array.isArray(trace.attempts) || trace.attempts.length < 2) return;
  box.append(el("h3", {}, "Attempts (a retried inference)"));
  const list = el("ol");
  for (const a of trace.attempts) {
    const what = a.problem ? "rejected: " + a.problem : "accepted";
    const rule = a.prohibition ? "; told: " + a.prohibition : "";
    list.append(el("li", { class: "attempt" }, a.prompt_chars + " chars sent" + rule + "; " + what
      + (a.raw_response === null ? "" : "; reply: " + a.raw_response)));
  }
  box.append(list);
}
// What the gates accepted of the replies the NPC said (beliefs, memories, intents), each with
// the inference that proposed it, and what they refused, with the verdict's code.
function proposalText(p) {
  if (p.kind === "intent") {
    const args = Object.entries(p.args || {}).map(([k, v]) => k + "=" + JSON.stringify(v)).join(", ");
    return p.text + "(" + args + ")";
  }
  return (p.about ? p.about + ": " : "") + p.text;
}
function proposalList(id, items, refused) {
  const list = $(id);
  list.replaceChildren(...items.map((p) => {
    const li = el("li", { class: "proposal" + (refused ? " refused" : ""), "data-inference": p.inference_id });
    if (refused) li.append(el("span", { class: "code" }, p.code), " " + p.kind + " ");
    li.append(el("span", { class: "said" }, proposalText(p)),
      el("span", { class: "from" }, " t" + p.tick + ", " + p.inference_id + (refused && p.detail ? ": " + p.detail : "")));
    return li;
  }));
  if (!items.length) list.append(el("li", { class: "none" }, "none"));
}
function showProposals(proposals) {
  const p = proposals || {};
  const kinds = ["beliefs", "memories", "intents", "refused"];
  $("proposals").hidden = kinds.every((k) => !(p[k] || []).length);
  proposalList("beliefs-learned", p.beliefs || [], false);
  proposalList("memories-kept", p.memories || [], false);
  proposalList("intents-emitted", p.intents || [], false);
  proposalList("proposals-refused", p.refused || [], true);
}
async function showNpc() {
  if (!view.selected) return;
  let npc;
  try { npc = await getJSON("/api/npc/" + encodeURIComponent(view.selected)); } catch (e) { return; }
  $("npc-name").textContent = npc.name + " (" + npc.id + ", " + npc.location + ")";
  $("speak-to-name").textContent = npc.name;
  const detail = $("npc-detail");
  detail.hidden = npc.traces.length === 0;
  if (!npc.traces.length) return;
  const latest = npc.traces[0];
  const chosen = npc.traces.find((t) => t.inference_id === view.snapshot) || latest;
  $("bars").replaceChildren(...npc.traces.map((t, i) => bar(t, chosen.inference_id, i === 0)));
  showProposals(npc.proposals);
  budgetTable(chosen);
  droppedList(chosen);
  showAttempts(chosen);
  $("npc-flags").textContent = "shown: tick " + chosen.tick + ", " + chosen.backend + "/" + chosen.model
    + (chosen.report.over_budget ? ", over budget" : "") + (chosen.fallback ? ", fallback line" : "");
  detail.dataset.inference = latest.inference_id;
  detail.dataset.snapshot = chosen.inference_id;
  $("prompt-digest").textContent = "sha256 " + latest.prompt_sha256.slice(0, 16) + "…";
  $("prompt").textContent = latest.prompt === null || latest.prompt === undefined
    ? "(the run does not publish prompts: record.trace_prompts=false)" : latest.prompt;
  showCompare();
}
// --- --compare: two stores' working memories side by side ---------------------------------
function compareSide(side) {
  const box = el("div");
  if (side.record === null) {
    box.append(el("h4", {}, side.store + ": no record of this NPC by this tick"));
    return box;
  }
  box.append(el("h4", {}, side.store + ": tick " + side.tick + ", " + side.prompt_chars + " / " + side.limit_chars
    + " chars, " + side.selection + " selection" + (side.over_budget ? ", over budget" : "")));
  for (const name of COMPARED) {
    const items = side.categories[name];
    box.append(el("div", { class: "compare-category" }, name + " (" + items.length + ")"));
    const list = el("ul", { "data-category": name });
    for (const item of items) list.append(el("li", item.mark ? { class: item.mark } : {}, item.text));
    box.append(list);
  }
  return box;
}
async function showCompare() {
  if (!view.compare || !view.selected) return;
  let sides;
  try { sides = await getJSON("/api/compare/" + encodeURIComponent(view.selected)); } catch (e) { return; }
  $("compare-name").textContent = view.compare;
  $("compare-this").replaceChildren(compareSide(sides.this));
  $("compare-other").replaceChildren(compareSide(sides.other));
  $("compare").hidden = false;
  $("compare").dataset.agent = sides.agent;
  $("compare").dataset.tick = sides.tick === null ? "" : sides.tick;
}
function choose(id) {
  if (id !== view.selected) view.snapshot = null;
  view.selected = id;
  $("speak-to").value = id;
  for (const chip of document.querySelectorAll(".npc-chip")) chip.classList.toggle("selected", chip.dataset.npc === id);
  showNpc();
}

// --- speaking -----------------------------------------------------------------------------
async function speak(event) {
  event.preventDefault();
  const status = $("speak-status");
  const body = { to: $("speak-to").value.trim(), text: $("speak-text").value };
  const headers = { "Content-Type": "application/json", "X-Npcsim-Token": meta("npcsim-token") };
  const response = await fetch("/api/say", { method: "POST", headers: headers, body: JSON.stringify(body) });
  const answer = await response.json().catch(() => ({ error: "HTTP " + response.status }));
  status.classList.toggle("error", !response.ok);
  status.textContent = response.ok ? "sent" : answer.error;
  if (response.ok) $("speak-text").value = "";
}

// --- start --------------------------------------------------------------------------------
async function load() {
  const state = await getJSON("/api/state");
  view.live = state.live;
  view.compare = state.compare;
  $("run-id").textContent = state.run;
  $("mode").textContent = state.live ? "live" : "stored";
  showHealth(state.health);
  showWorld(state.world);
  $("dialogue").replaceChildren();
  addLines(state.lines, false);
  if (!state.live && state.ticks) {
    const slider = $("tick-slider");
    $("slider-box").hidden = false;
    $("speak").hidden = true;
    slider.min = state.ticks[0];
    slider.max = state.ticks[1];
    if (view.tick === null) slider.value = state.ticks[1];
    $("slider-tick").textContent = slider.value;
  }
  if (view.selected) showNpc();
  return state;
}
function stream(after) {
  const source = new EventSource("/api/events?after=" + after);
  source.onmessage = (event) => {
    const m = JSON.parse(event.data);
    showHealth(m.health);
    addLines(m.lines, false);
    if (m.world_changed) getJSON("/api/state").then((s) => showWorld(s.world));
    if (view.selected && (m.npcs_changed === null || m.npcs_changed.includes(view.selected))) showNpc();
  };
}
window.addEventListener("DOMContentLoaded", async () => {
  $("speak-player").textContent = meta("npcsim-player");
  $("older").addEventListener("click", older);
  $("filter-npc").addEventListener("change", refilter);
  $("filter-location").addEventListener("change", refilter);
  $("npc-search").addEventListener("input", () => view.world && showWorld(view.world));
  $("speak").addEventListener("submit", speak);
  $("speak-to").addEventListener("change", () => { const id = $("speak-to").value.trim(); if (id) choose(id); });
  $("tick-slider").addEventListener("change", () => { view.tick = Number($("tick-slider").value); load(); });
  const state = await load();
  if (state.live) stream(state.last_seq);
});
