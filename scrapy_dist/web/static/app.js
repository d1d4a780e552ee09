// scrapy-dist web: polls the JSON views and draws them. Data from Redis is untrusted:
// it reaches the page only through textContent and attribute setters, never as HTML.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const VIEWS = ["overview", "workers", "frontier", "redis", "dead", "control"];
  const SVGNS = "http://www.w3.org/2000/svg";
  let config = { actions: false, refresh: 1, token_header: "X-Scrapy-Dist-Token" };
  let token = sessionStorage.getItem("scrapy-dist-token") || "";
  let view = "overview";
  let workersOffset = 0, deadOffset = 0, deadTotal = 0;
  const PAGE = 100, DEAD_PAGE = 50;
  const selected = new Set();

  // the token comes in the address's fragment (#token=...), never sent to a server
  if (location.hash.startsWith("#token=")) {
    token = decodeURIComponent(location.hash.slice(7));
    sessionStorage.setItem("scrapy-dist-token", token);
    history.replaceState(null, "", location.pathname + "#overview");
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
    return tr;
  }
  function num(value) { const td = el("td", value === null || value === undefined ? "–" : value, "num"); return td; }
  function fill(tbody, rows) { tbody.replaceChildren(...rows); }
  function when(seconds) { return seconds ? new Date(seconds * 1000).toLocaleString() : "–"; }
  function fmt(n) {
    if (n === null || n === undefined) return "–";
    if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
    return Number.isInteger(n) ? String(n) : n.toFixed(2);
  }

  async function get(path) {
    const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  async function post(path, body) {
    const headers = { "Content-Type": "application/json" };
    headers[config.token_header] = token;
    const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body), credentials: "same-origin" });
    const answer = await r.json();
    if (!r.ok) throw new Error(answer.error || r.statusText);
    return answer;
  }
  function showError(e) {
    const box = $("error");
    if (e) { box.textContent = String(e.message || e); box.hidden = false; } else { box.hidden = true; }
  }

  // -- the answer and the figures ------------------------------------------------------
  function drawSummary(s) {
    $("crawl").textContent = s.crawl;
    const a = s.answer;
    const state = $("state");
    state.textContent = a.state;
    state.className = "state " + a.state;
    $("answer-words").textContent = a.words;
    const lost = $("answer-lost");
    lost.textContent = a.lost;
    lost.className = a.dead ? "lost some" : "lost";
    const figures = [
      ["seeds", s.seeds.waiting], ["queued", s.queue.queued], ["leased", s.leased],
      ["done", s.progress.done], ["dead", s.dead.records],
      [s.workers.silent ? `workers live (${s.workers.silent} silent)` : "workers live",
        s.workers.live + " / " + s.workers.registered],
      ["items scraped", s.items.scraped], ["items stored", s.items.stored],
      [s.rates ? `pages/s over the last ${Math.round(s.rates.window)} s` : "pages/s",
        s.rates ? s.rates.pages_per_second : null],
    ];
    $("figures").replaceChildren(...figures.map(([label, value]) => {
      const span = el("span");
      span.appendChild(el("b", typeof value === "number" ? fmt(value) : (value ?? "–")));
      span.appendChild(document.createTextNode(label));
      span.dataset.figure = label;
      return span;
    }));
    $("hints").replaceChildren(...s.hints.map((h) => el("div", h)));
    deadTotal = s.dead.records;
    document.title = a.state + " · " + s.crawl + " · scrapy-dist";
  }

  // -- charts: one SVG line each ----------------------------------------------------------
  function chart(title, points, unit) {
    const box = el("div", null, "chart");
    const h = el("h4", title);
    const last = points.length ? points[points.length - 1][1] : null;
    h.appendChild(el("span", last === null ? "no data" : fmt(last) + (unit ? " " + unit : "")));
    box.appendChild(h);
    const W = 320, H = 110, L = 34, B = 14;
    const svg = document.createElementNS(SVGNS, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    const line = (x1, y1, x2, y2, cls) => {
      const l = document.createElementNS(SVGNS, "line");
      l.setAttribute("x1", x1); l.setAttribute("y1", y1); l.setAttribute("x2", x2); l.setAttribute("y2", y2);
      l.setAttribute("class", cls); svg.appendChild(l);
    };
    const text = (x, y, t, anchor) => {
      const n = document.createElementNS(SVGNS, "text");
      n.setAttribute("x", x); n.setAttribute("y", y); n.setAttribute("class", "lbl");
      if (anchor) n.setAttribute("text-anchor", anchor);
      n.textContent = t; svg.appendChild(n);
    };
    line(L, H - B, W, H - B, "axis"); line(L, 4, L, H - B, "axis");
    const valid = points.filter((p) => p[1] !== null && p[1] !== undefined);
    if (valid.length > 1) {
      const t0 = valid[0][0], t1 = valid[valid.length - 1][0];
      const top = Math.max(...valid.map((p) => p[1]));
      const max = top > 0 ? top : 1;
      const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - L - 2);
      const y = (v) => H - B - (v / max) * (H - B - 6);
      const path = document.createElementNS(SVGNS, "polyline");
      path.setAttribute("points", valid.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" "));
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", "#2b6cb0");
      path.setAttribute("stroke-width", "1.6");
      path.setAttribute("vector-effect", "non-scaling-stroke");
      svg.appendChild(path);
      text(L - 3, 12, fmt(max), "end"); text(L - 3, H - B, "0", "end");
      text(L, H - 2, new Date(t0 * 1000).toLocaleTimeString());
      text(W - 2, H - 2, new Date(t1 * 1000).toLocaleTimeString(), "end");
    } else {
      text(W / 2, H / 2, valid.length ? "one sample so far" : "no samples yet (workers write one every few seconds)", "middle");
    }
    box.appendChild(svg);
    return box;
  }
  async function drawHistory() {
    const h = await get("/api/history");
    const s = h.samples;
    const series = (name) => s.map((p) => [p.time, p[name]]);
    $("charts").replaceChildren(
      chart("pages/s", series("pages_per_second").slice(1), "/s"),
      chart("items/s", series("items_per_second").slice(1), "/s"),
      chart("queued", series("queued")),
      chart("leased", series("leased")),
      chart("dead letters", series("dead")),
      chart("done", series("done")),
    );
    $("history-note").textContent = s.length
      ? `${s.length} sample(s) from ${h.key}, kept by the workers' heartbeats (shard 0's queue and leases).`
      : `No history yet in ${h.key}: workers sample it with their heartbeats.`;
  }

  // -- workers ------------------------------------------------------------------------------
  async function drawWorkers() {
    const w = await get(`/api/workers?offset=${workersOffset}&limit=${PAGE}`);
    const rows = w.workers.map((k) => {
      const tr = row([
        el("td", k.id, "mono"),
        el("td", (k.live ? "" : "gone · ") + k.age.toFixed(1) + " s ago"),
        num(k.leases), num(k.buffered), num(k.pages), num(k.items),
        num(k.pages_per_second === null || k.silent ? null : k.pages_per_second.toFixed(2)),
        k.silent && k.leases_return_in !== null
          ? el("td", `silent: ${k.leases} lease(s) return in ${Math.ceil(k.leases_return_in)} s`, "countdown")
          : el("td", k.silent ? "silent, holds no lease" : "–"),
      ]);
      tr.dataset.worker = k.id;
      if (k.silent) tr.classList.add("silent");
      if (!k.live) tr.classList.add("gone");
      return tr;
    });
    fill($("workers-table").tBodies[0], rows);
    $("workers-note").textContent =
      `${w.live} live of ${w.total} registered; a worker is gone ${w.timeout} s after its last heartbeat; ` +
      `a silent worker's leases return to the queue when they expire (SCHEDULER_LEASE_TIMEOUT ${w.lease_timeout} s).`;
    $("workers-page").textContent = w.total ? `${w.offset + 1}–${Math.min(w.total, w.offset + PAGE)} of ${w.total}` : "";
    $("workers-prev").disabled = w.offset === 0;
    $("workers-next").disabled = w.offset + PAGE >= w.total;
  }

  // -- frontier ------------------------------------------------------------------------------
  async function drawFrontier() {
    const f = await get("/api/frontier");
    const card = (value, label) => { const c = el("div", null, "card"); c.appendChild(el("b", fmt(value))); c.appendChild(el("span", label)); return c; };
    $("frontier-figures").replaceChildren(
      card(f.seeds.waiting, `seeds waiting in ${f.seeds.key} (${f.seeds.type})`),
      card(f.queue.queued, `queued in ${f.queue.key}`),
      card(f.leased, "leased to workers"),
    );
    const max = Math.max(1, ...f.levels.map((l) => l.queued));
    fill($("levels-table").tBodies[0], f.levels.length ? f.levels.map((l) => {
      const bar = el("div", null, "bar"); bar.style.width = Math.max(1, (l.queued / max) * 300) + "px";
      const td = el("td"); td.appendChild(bar);
      return row([num(l.priority), num(l.queued), td]);
    }) : [row([el("td", f.queue.type === "levels" ? "nothing queued" : "a FIFO/LIFO queue has no priority levels"), el("td"), el("td")])]);
    fill($("oldest-table").tBodies[0], f.oldest.length ? f.oldest.map((o) => row([
      num(o.priority === null ? "–" : o.priority), el("td", o.id, "mono"), el("td", o.url || o.raw, "mono"),
    ])) : [row([el("td", "nothing queued"), el("td"), el("td")])]);
    const qs = f.queue_slots;
    fill($("queue-slots-table").tBodies[0], qs && qs.listed.length ? qs.listed.map((s) => row([
      el("td", s.slot, "mono"), num(s.queued), el("td", s.ready_in ? `in ${s.ready_in} s` : "now"),
    ])) : [row([el("td", qs ? "nothing queued" : "one queue for every slot (SCHEDULER_QUEUE_CLASS is not SlotQueue)"), el("td"), el("td")])]);
    $("queue-slots-note").textContent = qs ? `${qs.ready} slot(s) ready, ${qs.waiting} waiting for their delay or pause; the next ready by priority and the first waiting shown.` : "";
    const paused = f.slots.paused;
    fill($("slots-table").tBodies[0], f.slots.busiest.length ? f.slots.busiest.map((s) => row([
      el("td", s.slot, "mono"), num(s.sent), num(s.pages), num(s["4xx"]), num(s["5xx"]), num(s.failed),
      el("td", Object.prototype.hasOwnProperty.call(paused, s.slot) ? `${Math.round(paused[s.slot])} s left` : ""),
    ])) : [row([el("td", "nothing counted yet"), el("td"), el("td"), el("td"), el("td"), el("td"), el("td")])]);
    $("slots-note").textContent = `${f.slots.counted} download slot(s) counted (SCHEDULER_SLOT_COUNTS), the busiest by requests sent shown; ${Object.keys(paused).length} paused for every worker.`;
    $("frontier-hints").replaceChildren(...f.hints.map((h) => el("div", h)));
  }

  // -- redis ---------------------------------------------------------------------------------
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  async function drawRedis() {
    const r = await get("/api/redis");
    const m = r.memory;
    const card = (value, label) => { const c = el("div", null, "card"); c.appendChild(el("b", value)); c.appendChild(el("span", label)); return c; };
    $("redis-figures").replaceChildren(...(m.error ? [card("?", `memory not read: ${m.error}`)] : [
      card(bytes(m.used), `used of ${m.max ? bytes(m.max) + " maxmemory" : "no maxmemory limit"}` + (m.fill === null ? "" : ` (${(m.fill * 100).toFixed(1)}%)`)),
      card(m.policy || "–", "maxmemory-policy"),
    ]));
    const warning = m.warning ? [el("div", `${m.warning}: set it to noeviction (a full server then refuses writes and the crawl waits).`, "warn")] : [];
    $("redis-warning").replaceChildren(...warning);
    const names = Object.keys(r.refusals);
    fill($("refusals-table").tBodies[0], names.length ? names.map((n) => row([el("td", n, "mono"), num(r.refusals[n])]))
      : [row([el("td", r.stats_shared ? "none: Redis refused nothing the workers wrote" : "not known: the workers' stats are not shared (STATS_CLASS = 'scrapy_dist.stats.RedisStatsCollector')"), el("td")])]);
    const s = r.item_stream;
    fill($("groups-lag-table").tBodies[0], s && s.groups.length ? s.groups.map((g) => row([
      el("td", g.name, "mono"), num(g.lag === null ? "too many to count" : g.lag), num(g.pending), num(g.consumers.length),
    ])) : [row([el("td", s ? "no consumer group" : "no items stream"), el("td"), el("td"), el("td")])]);
    $("stream-note").textContent = s ? `${s.key}: ${s.length} item(s), ${s.dead} in ${s.dead_key}` : "";
  }

  // -- dead letters ------------------------------------------------------------------------
  async function drawDead() {
    const d = await get(`/api/dead?offset=${deadOffset}&limit=${DEAD_PAGE}`);
    deadTotal = d.all_shards;
    $("dead-total").textContent = d.all_shards === 0 ? "No dead letters: nothing lost." : `${d.all_shards} dead letter(s)`;
    $("btn-requeue-all").textContent = `Requeue all (${d.all_shards})`;
    $("btn-purge").textContent = `Purge (${d.all_shards})`;
    $("btn-requeue-selected").textContent = `Requeue selected (${selected.size})`;
    fill($("groups-table").tBodies[0], d.groups.map((g) => row([el("td", g.reason, "mono"), num(g.count)])));
    $("groups-note").textContent = d.sampled < d.total ? `Counted over the newest ${d.sampled} of ${d.total} records.` : "";
    fill($("dead-table").tBodies[0], d.records.map((r) => {
      const box = document.createElement("input");
      box.type = "checkbox"; box.checked = selected.has(r.index); box.disabled = !config.actions;
      box.addEventListener("change", () => {
        if (box.checked) selected.add(r.index); else selected.delete(r.index);
        $("btn-requeue-selected").textContent = `Requeue selected (${selected.size})`;
      });
      const check = el("td"); check.appendChild(box);
      const raw = el("td"); const det = el("details"); det.appendChild(el("summary", "data"));
      det.appendChild(el("pre", JSON.stringify(r.record, null, 1))); raw.appendChild(det);
      const tr = row([check, num(r.index), el("td", r.kind), el("td", r.reason), el("td", r.url, "mono"), raw]);
      tr.dataset.index = r.index;
      return tr;
    }));
    $("dead-page").textContent = d.total ? `${d.offset + 1}–${Math.min(d.total, d.offset + DEAD_PAGE)} of ${d.total} (shard 0)` : "";
    $("dead-prev").disabled = d.offset === 0;
    $("dead-next").disabled = d.offset + DEAD_PAGE >= d.total;
  }

  // -- control --------------------------------------------------------------------------
  async function drawControl() {
    const c = await get("/api/control");
    const s = c.state;
    $("control-state").textContent = s
      ? `${s.state}${s.since ? " since " + when(s.since) : ""}${s.by ? " by " + s.by : ""}${s.reason ? ": " + s.reason : ""}${s.problem ? " (" + s.problem + ")" : ""}`
      : "control state unreadable";
    fill($("log-table").tBodies[0], c.log.length ? c.log.map((e) => row([when(e.since), `${e.from ?? "?"} → ${e.state}`, e.by, e.reason || ""])) : [row(["–", "no change recorded", "", ""])]);
  }

  // -- actions ------------------------------------------------------------------------------
  async function act(resultId, path, body, describe) {
    try {
      const answer = await post(path, body);
      $(resultId).textContent = describe(answer);
      await tick();
    } catch (e) {
      $(resultId).textContent = "refused: " + (e.message || e);
    }
  }
  function setup() {
    for (const [id, state] of [["btn-pause", "paused"], ["btn-resume", "running"], ["btn-drain", "draining"]]) {
      $(id).addEventListener("click", () => act("control-result", "/api/control", { state, reason: $("reason").value },
        (a) => a.changed ? `now ${a.state.state}` : `already ${a.state.state}`));
    }
    $("btn-requeue-all").addEventListener("click", () => {
      if (!confirm(`Requeue all ${deadTotal} dead letter(s)?`)) return;
      act("dead-result", "/api/dead/requeue", { all: true }, requeued);
    });
    $("btn-requeue-selected").addEventListener("click", () => {
      if (!selected.size || !confirm(`Requeue ${selected.size} selected dead letter(s)?`)) return;
      const indexes = [...selected]; selected.clear();
      act("dead-result", "/api/dead/requeue", { indexes }, requeued);
    });
    $("btn-purge").addEventListener("click", () => {
      const count = deadTotal;
      if (!confirm(`Delete all ${count} dead letter(s)? They cannot be requeued afterwards.`)) return;
      act("dead-result", "/api/dead/purge", { count }, (a) => a.refused ? `not purged: ${a.refused}` : `purged ${a.purged}`);
    });
    $("workers-prev").addEventListener("click", () => { workersOffset = Math.max(0, workersOffset - PAGE); tick(); });
    $("workers-next").addEventListener("click", () => { workersOffset += PAGE; tick(); });
    $("dead-prev").addEventListener("click", () => { deadOffset = Math.max(0, deadOffset - DEAD_PAGE); tick(); });
    $("dead-next").addEventListener("click", () => { deadOffset += DEAD_PAGE; tick(); });
    window.addEventListener("hashchange", route);
  }
  function requeued(a) {
    return `requeued ${a.requests} request(s) and ${a.seeds} seed(s); ${a.skipped.length} skipped; ${a.left} left`;
  }
  function enableActions() {
    const on = config.actions && token;
    for (const b of document.querySelectorAll("button.action, input#reason")) b.disabled = !on;
    $("mode").textContent = config.actions ? (token ? "actions enabled" : "actions need the token link") : "read-only";
  }

  // -- routing and polling ------------------------------------------------------------------
  function route() {
    const name = location.hash.slice(1);
    view = VIEWS.includes(name) ? name : "overview";
    historyAt = 0;
    for (const v of VIEWS) {
      $("view-" + v).hidden = v !== view;
      $("nav-" + v).classList.toggle("active", v === view);
    }
    tick();
  }
  let historyAt = 0, busy = false, again = false;
  async function tick() {
    if (busy) { again = true; return; }
    busy = true;
    const shown = view;  // the view of this tick: one switched to meanwhile waits for the next
    try {
      drawSummary(await get("/api/summary"));
      if (shown === "overview" && Date.now() - historyAt > 2000) { historyAt = Date.now(); await drawHistory(); }
      if (shown === "workers") await drawWorkers();
      if (shown === "frontier") await drawFrontier();
      if (shown === "redis") await drawRedis();
      if (shown === "dead") await drawDead();
      if (shown === "control") await drawControl();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.updated = String(Date.now());
      showError(null);
    } catch (e) {
      showError(e);
    } finally {
      busy = false;
    }
    if (again) { again = false; tick(); }  // a view switched to during the tick: drawn now
  }
  async function start() {
    config = await get("/api/config");
    setup();
    enableActions();
    route();
    setInterval(tick, Math.max(250, config.refresh * 1000));
  }
  start().catch(showError);
})();
