// npcsim's browser example: a player's side of a run over MQTT on WebSockets (mqtt.js).
// It reads the NPCs from the retained roster, sends a question with an id of its own, and
// shows the NPC's answer (matched by `reply_to`, else by NPC and player) and any error the
// run sends back. Topics and payloads: docs/integrate.md and docs/topics.md.
"use strict";

(() => {
  const NAME = /^[A-Za-z0-9_.-]{1,128}$/; // the rule of every id in npcsim (run, player, NPC)
  const $ = (id) => document.getElementById(id);
  const session = Math.random().toString(36).slice(2, 8); // question ids stay unique across reloads
  const ERRORS_SHOWN = 100; // the newest errors: a flood of them cannot grow the page without end

  let client = null;
  let sent = 0;
  let ignored = 0;
  const rosters = new Map(); // shard -> [[id, name, location], ...]: each shard's retained roster
  const pending = new Map(); // question id -> {npc, li}, oldest first

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text; // never innerHTML: every payload is outside input
    return node;
  }

  function status(text, bad = false) {
    $("status").textContent = text;
    $("status").className = bad ? "bad" : "";
  }

  function ignore(topic, why) {
    ignored += 1;
    if (ignored <= 20) console.warn(`npcsim example: ignored a message on ${topic}: ${why}`);
    $("ignored").hidden = false;
    $("ignored").textContent = `ignored ${ignored} malformed message(s); the browser console names the first 20`;
  }

  function connect(broker, run, player, username, password) {
    if (!/^wss?:\/\/[^/\s]+/.test(broker)) return status(`broker ${JSON.stringify(broker)}: expected ws://host:port or wss://host:port`, true);
    for (const [what, value] of [["run", run], ["player", player]]) {
      if (!NAME.test(value)) return status(`${what} ${JSON.stringify(value)}: expected 1-128 of A-Z a-z 0-9 _ . -`, true);
    }
    if (client) client.end(true);
    rosters.clear();
    pending.clear();
    showRoster();
    const root = `npcsim/${run}`;
    const filters = [`${root}/roster/+`, `${root}/agent/+/say`, `${root}/player/${player}/error`];
    status(`connecting to ${broker} …`);
    client = mqtt.connect(broker, {
      protocolVersion: 4, // MQTT 3.1.1: what every broker npcsim runs on speaks, the embedded one included
      username: username || undefined,
      password: password || undefined,
      reconnectPeriod: 2000,
      connectTimeout: 10000,
    });
    client.on("connect", () => {
      client.subscribe(filters, { qos: 1 }, (error, granted) => {
        const refused = (granted || []).filter((g) => g.qos === 128).map((g) => g.topic);
        if (error || refused.length) return status(`subscription refused: ${error ? error.message : refused.join(", ")}`, true);
        status(`connected to ${broker}: run ${run}, player ${player}`);
        $("send").disabled = false;
        $("ask").dataset.run = run;
        $("ask").dataset.player = player;
      });
    });
    client.on("reconnect", () => status(`reconnecting to ${broker} …`, true));
    client.on("error", (error) => status(`${broker}: ${error.message}`, true));
    client.on("message", (topic, payload) => receive(root, player, topic, payload));
  }

  function receive(root, player, topic, payload) {
    const [kind, which, leaf] = topic.slice(root.length + 1).split("/");
    if (payload.length === 0) { // an emptied retained message: the shard's roster is gone
      if (kind === "roster") { rosters.delete(which); showRoster(); }
      return;
    }
    let message;
    try {
      message = JSON.parse(new TextDecoder().decode(payload));
    } catch {
      return ignore(topic, "not JSON");
    }
    if (message === null || typeof message !== "object" || Array.isArray(message)) return ignore(topic, "not a JSON object");
    if (kind === "roster") return roster(topic, which, message);
    if (kind === "agent" && leaf === "say") return said(topic, player, message);
    if (kind === "player" && leaf === "error") return failed(topic, message);
  }

  function roster(topic, shard, message) {
    const npcs = message.npcs;
    const good = Array.isArray(npcs) && npcs.every((n) => Array.isArray(n) && n.length === 3
      && n.every((part) => typeof part === "string") && NAME.test(n[0]));
    if (!good) return ignore(topic, "npcs is not a list of [id, name, location]");
    rosters.set(shard, npcs);
    showRoster();
  }

  function showRoster() {
    const chosen = $("npc").value;
    const all = [...rosters.values()].flat().sort((a, b) => a[0].localeCompare(b[0]));
    $("npcs").replaceChildren(...all.map(([id, name, location]) => {
      const li = element("li", id === chosen ? "chosen" : "", `${name} `);
      li.dataset.npc = id;
      li.append(element("small", "", `${id} · ${location}`));
      li.addEventListener("click", () => { $("npc").value = id; showRoster(); $("question").focus(); });
      return li;
    }));
    $("npc").replaceChildren(...all.map(([id, name]) => {
      const option = element("option", "", `${name} (${id})`);
      option.value = id;
      return option;
    }));
    if (all.some(([id]) => id === chosen)) $("npc").value = chosen;
  }

  function said(topic, player, say) {
    if (typeof say.agent !== "string" || typeof say.text !== "string") return ignore(topic, "no agent or text");
    const to = typeof say.in_reply_to === "string" ? say.in_reply_to : say.to;
    if (to !== player) return; // said to someone else
    const question = typeof say.reply_to === "string"
      ? pending.get(say.reply_to)
      : [...pending.values()].find((q) => q.npc === say.agent); // the oldest open question to that NPC
    if (!question || question.npc !== say.agent) return;
    pending.delete(question.li.dataset.id);
    question.li.className = "answered";
    question.li.append(element("div", "answer", `${say.agent}: ${say.text}`));
  }

  function failed(topic, error) {
    if (typeof error.code !== "string" || typeof error.message !== "string") return ignore(topic, "no code or message");
    const id = typeof error.id === "string" ? error.id : null;
    const line = `${error.code}: ${error.message}${id ? ` (question ${id})` : ""}`;
    $("errors").append(element("li", "", line));
    while ($("errors").children.length > ERRORS_SHOWN) $("errors").firstElementChild.remove();
    const question = id === null ? undefined : pending.get(id);
    if (question) {
      pending.delete(id);
      question.li.className = "failed";
      question.li.append(element("div", "problem", line));
    }
  }

  function ask(event) {
    event.preventDefault();
    const { run, player } = $("ask").dataset;
    const npc = $("npc").value;
    const text = $("question").value.trim();
    if (!client || !run || !npc || !text) return;
    const id = `${session}-${++sent}`;
    const li = element("li", "pending");
    li.dataset.id = id;
    li.dataset.npc = npc;
    li.append(element("div", "asked", `${player} → ${npc}: ${text}`));
    $("questions").prepend(li);
    pending.set(id, { npc, li });
    $("question").value = "";
    client.publish(`npcsim/${run}/player/${player}/input`, JSON.stringify({ to: npc, text, id }), { qos: 1 }, (error) => {
      if (error) failed("(publish)", { code: "not_sent", message: error.message, id });
    });
  }

  $("connect").addEventListener("submit", (event) => {
    event.preventDefault();
    connect(...["broker", "run", "player", "username", "password"].map((f) => $(f).value.trim()));
  });
  $("ask").addEventListener("submit", ask);

  // ?broker=ws://127.0.0.1:PORT&run=RUN&player=P fills the form and connects at once.
  const query = new URLSearchParams(location.search);
  for (const field of ["broker", "run", "player"]) $(field).value = query.get(field) || "";
  if (query.get("broker") && query.get("run") && query.get("player")) $("connect").requestSubmit();
})();
