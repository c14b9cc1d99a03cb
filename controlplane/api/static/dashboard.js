(function () {
  "use strict";
  const POLL_MS = __POLL_MS__;
  const start = new URL(window.location.href);
__TOKEN_JS__
  const token = takeToken(start);
  const legacy = start.searchParams.get("select");
  start.searchParams.delete("select");
  const FILTERS = ["kind", "phase", "node", "namespace", "since"];
  // The view: which operation, the filters, the page and the sort; the fragment says it.
  const view = {id: null, q: {}, offset: 0, limit: 50, sort: "-created_at"};
  readHash(window.location.hash);
  if (legacy && !view.id) view.id = legacy;
  window.history.replaceState(null, "", start.pathname + start.search + fragment());
  const expanded = new Set(view.id ? [view.id] : []);
  const etags = new Map();  // path -> [etag, body]: polling re-asks with If-None-Match
  let generation = 0;  // a newer load wins: an older one's answers are dropped
  let listed = null, drawnEvents = null;
  let signedOut = false;  // the API said 401: the sign-in form shows, polling stops
  const $ = (id) => document.getElementById(id);
  const colours = ["#1a73e8", "#c5221f", "#007b83", "#9334e6", "#188038", "#b0006d",
                   "#5f6368", "#8a5300", "#3c4fb5", "#00639b"];
  const OK = new Set(["Succeeded", "Resumed", "Suspended", "Finished"]);
  const BAD = new Set(["Failed", "Cancelled", "Refused", "RolledBack", "Skipped"]);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  // Phase text always shows; the mark (tick, cross, arrow) and colour only add to it.
  const outcomeClass = (phase, terminal) => OK.has(phase) ? "ok"
    : (BAD.has(phase) ? "bad" : (terminal === false ? "live" : ""));

  function readHash(hash) {
    const m = /^#\/(?:op\/([^?]*))?(?:\?(.*))?$/.exec(hash || "");
    if (!m) return;
    view.id = m[1] ? decodeURIComponent(m[1]) : null;
    const q = new URLSearchParams(m[2] || "");
    view.q = {};
    for (const f of FILTERS) if (q.get(f)) view.q[f] = q.get(f);
    view.offset = Math.max(0, parseInt(q.get("offset") || "0", 10) || 0);
    const limit = parseInt(q.get("limit") || "50", 10);
    view.limit = limit >= 1 && limit <= 1000 ? limit : 50;
    view.sort = q.get("sort") || "-created_at";
  }
  function fragment() {
    const q = new URLSearchParams(view.q);
    if (view.offset) q.set("offset", view.offset);
    if (view.limit !== 50) q.set("limit", view.limit);
    if (view.sort !== "-created_at") q.set("sort", view.sort);
    const tail = q.toString() ? "?" + q : "";
    return "#/" + (view.id ? "op/" + encodeURIComponent(view.id) : "") + tail;
  }
  function go(push) {  // the view changed here: say it in the URL, then draw it
    const url = window.location.pathname + window.location.search + fragment();
    if (push) window.history.pushState(null, "", url);
    else window.history.replaceState(null, "", url);
    refresh(true);
  }
  function select(id) { view.id = id; go(true); }

  async function api(path) {
    const known = etags.get(path);
    const headers = bearer(token);
    if (known) headers["If-None-Match"] = known[0];
    const response = await fetch(path, {headers, cache: "no-store"});
    if (response.status === 304 && known) return {body: known[1], changed: false};
    if (response.status === 401) { signedOut = true; signIn(Boolean(token)); }
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    const etag = response.headers.get("ETag");
    if (etag) etags.set(path, [etag, body]);
    return {body, changed: true};
  }
  function showError(err) { $("error").textContent = err ? String(err.message || err) : ""; }

  // -- the list -------------------------------------------------------------------------
  const COLUMNS = [["kind", "kind"], ["phase", "phase"], ["workload", "workload / drain"],
                   ["node", "node"], ["created_at", "submitted (UTC)"],
                   ["took", "took"], ["id", "id"]];
  const took = (op) => Date.parse(op.updated_at) - Date.parse(op.created_at);
  const sortValue = (op, key) => key === "took" ? took(op)
    : key === "node" ? ((op.drain ? op.drain.node : op.source_node) || "")
    : (op[key] === null || op[key] === undefined ? "" : String(op[key]));
  function sorted(ops) {
    const key = view.sort.replace(/^-/, ""), sign = view.sort.startsWith("-") ? -1 : 1;
    return ops.slice().sort((a, b) => {
      const x = sortValue(a, key), y = sortValue(b, key);
      return sign * (x < y ? -1 : x > y ? 1 : 0);
    });
  }
  function header() {
    const row = $("columns");
    row.replaceChildren();
    const key = view.sort.replace(/^-/, "");
    for (const [name, label] of COLUMNS) {
      const th = el("th"); th.className = "col-" + name;
      th.setAttribute("aria-sort", key !== name ? "none"
        : view.sort.startsWith("-") ? "descending" : "ascending");
      const button = el("button", null, label); button.type = "button";
      button.addEventListener("click", () => {
        view.sort = (key === name && !view.sort.startsWith("-") ? "-" : "") + name;
        go(false);
      });
      th.append(button); row.append(th);
    }
  }

  async function loadList(mine, force) {
    const query = new URLSearchParams(view.q);
    query.set("limit", view.limit); query.set("offset", view.offset);
    // The API sorts every page by these; "took" is this page's own order only.
    if (view.sort.replace(/^-/, "") !== "took") query.set("sort", view.sort);
    const got = await api("/api/v1/operations?" + query);
    const drains = got.body.operations.filter((op) => op.kind === "drain" && expanded.has(op.id));
    const details = await Promise.all(drains.map(
      (op) => api("/api/v1/operations/" + encodeURIComponent(op.id))));
    if (mine !== generation) return;
    if (!force && !got.changed && !details.some((d) => d.changed)) return;
    listed = got.body;
    drawList(new Map(details.map((d) => [d.body.id, d.body.children || []])));
  }

  function drawList(children) {
    const data = listed, rows = $("operations");
    const focused = document.activeElement && document.activeElement.dataset
      && rows.contains(document.activeElement) ? document.activeElement.dataset.id : null;
    header();
    rows.replaceChildren();
    for (const op of sorted(data.operations)) {
      if (![...$("kind").options].some((o) => o.value === op.kind))
        $("kind").append(el("option", null, op.kind));
      rows.append(operationRow(op));
      if (children.has(op.id)) rows.append(childrenRow(op, children.get(op.id)));
    }
    const first = data.total ? data.offset + 1 : 0;
    const last = data.offset + data.operations.length;
    $("count").textContent = first + "\u2013" + last + " of " + data.total + " operations";
    $("prev").disabled = data.offset === 0;
    $("next").disabled = last >= data.total;
    if (focused) {
      const again = rows.querySelector('[data-id="' + CSS.escape(focused) + '"]');
      if (again) again.focus();
    }
  }

  function drainSummary(d) {
    const parts = [d.succeeded + "/" + d.children + " moved"];
    if (d.failed) parts.push(d.failed + " failed");
    if (d.running) parts.push(d.running + " running");
    if (d.pending) parts.push(d.pending + " waiting");
    if (d.skipped) parts.push(d.skipped + " skipped");
    return parts.join(", ");
  }
  // A child's id is "<drain id>-<12 hex>": its own part is the tail.
  const shortId = (op) => op.parent ? "\u2026" + op.id.slice(-12) : op.id.slice(0, 8);
  const stamp = (iso) => iso.replace("T", " ").slice(0, 19);
  function seconds(ms) {
    const s = ms / 1000;
    if (s < 1) return Math.round(ms) + " ms";
    return s < 60 ? s.toFixed(1) + " s" : s < 3600 ? (s / 60).toFixed(1) + " min"
      : (s / 3600).toFixed(1) + " h";
  }
  function cell(cls, text) { const td = el("td", cls, text); td.title = td.textContent; return td; }

  function operationRow(op) {
    const drain = op.kind === "drain" ? op.drain : null;
    const tr = el("tr", "operation" + (drain ? " drain" : "") + (op.parent ? " in-drain" : "")
                        + (op.id === view.id ? " selected" : ""));
    tr.dataset.id = op.id;
    if (op.parent) tr.dataset.parent = op.parent;
    tr.tabIndex = 0;
    if (op.id === view.id) tr.setAttribute("aria-current", "true");
    const kind = el("td", "kind");
    if (drain) {
      const open = expanded.has(op.id);
      const toggle = el("button", "toggle", open ? "\u25BE" : "\u25B8");
      toggle.type = "button";
      toggle.title = open ? "hide children" : "show children";
      toggle.setAttribute("aria-expanded", String(open));
      toggle.setAttribute("aria-label", (open ? "hide" : "show") + " the drain's children");
      toggle.addEventListener("click", (event) => {
        event.stopPropagation();
        if (open) expanded.delete(op.id); else expanded.add(op.id);
        refresh(true);
      });
      kind.append(toggle, el("span", null, op.kind));
    } else {
      kind.append(el("span", null, op.kind));
    }
    if (op.parent) kind.append(el("span", "parent-label", "drain " + op.parent.slice(0, 8)));
    const node = (drain ? drain.node : op.source_node) || "";
    tr.append(kind, cell("phase " + outcomeClass(op.phase, op.terminal), op.phase),
              drain ? cell("drain-summary", drainSummary(drain)) : cell(null, op.workload || ""),
              cell(null, node), cell(null, stamp(op.created_at)),
              cell(null, op.terminal ? seconds(took(op)) : "running"),
              cell("op-id", shortId(op)));
    tr.lastChild.title = op.id;
    tr.addEventListener("click", () => {
      if (drain) expanded.add(op.id);
      select(op.id);
    });
    return tr;
  }

  function childrenRow(op, children) {
    const tr = el("tr", "drain-children");
    tr.dataset.drain = op.id;
    const td = el("td");
    td.colSpan = COLUMNS.length;
    const table = el("table", "children");
    const head = el("tr");
    for (const h of ["child", "pod", "target", "phase / outcome", "reason"])
      head.append(el("th", "child-" + h.split(" ")[0], h));
    table.append(head);
    if (!children.length) table.append(el("tr", null, "no children"));
    for (const c of children) {
      // Pending, Skipped and Refused children never became machines: nothing to open.
      const opens = c.status === "Started" || c.status === "Finished";
      const row = el("tr", "child" + (opens ? " clickable" : "")
                           + (c.id === view.id ? " selected" : ""));
      row.dataset.id = c.id;
      row.dataset.status = c.status;
      const outcome = c.phase || c.status;
      row.append(cell("op-id", "\u2026" + c.id.slice(-12)), cell(null, c.pod),
                 cell(null, c.target),
                 cell("phase " + outcomeClass(outcome, c.status !== "Started" ? true : false),
                      outcome),
                 cell("reason", c.reason || ""));
      row.firstChild.title = c.id;
      if (opens) {
        row.tabIndex = 0;
        row.addEventListener("click", (event) => { event.stopPropagation(); select(c.id); });
      }
      table.append(row);
    }
    td.append(table);
    tr.append(td);
    return tr;
  }

  // Rows: arrows move between focusable rows, Enter or Space opens the focused one.
  $("operations").addEventListener("keydown", (event) => {
    const row = event.target.closest && event.target.closest("tr[tabindex]");
    if (!row || event.target !== row) return;
    const rows = [...$("operations").querySelectorAll("tr[tabindex]")];
    const at = rows.indexOf(row);
    const to = {ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: rows.length - 1}[event.key];
    if (to !== undefined) {
      event.preventDefault();
      if (rows[to]) rows[to].focus();
    } else if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      row.click();
    }
  });

  // -- one operation ----------------------------------------------------------------------
  // cpctl history's reading of facts (controlplane/cli/why.py facts_text), in JS.
  const TELLING = ["present", "phase", "deleting", "node", "ready", "unschedulable", "error",
                   "class", "message", "digest", "problem", "command", "action", "uid"];
  const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  function* flat(facts, prefix) {
    for (const [key, value] of Object.entries(facts)) {
      if (isObject(value)) {
        const named = Object.keys(value).some((k) => k.split("_")[0] === key.split(" ")[0]);
        yield* flat(value, named ? "" : prefix + key + ".");
      } else {
        yield [prefix + key, value];
      }
    }
  }
  function canonical(v) {
    if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
    if (isObject(v)) return "{" + Object.keys(v).sort().map(
      (k) => JSON.stringify(k) + ":" + canonical(v[k])).join(",") + "}";
    return JSON.stringify(v);
  }
  function factValue(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "boolean") return v ? "true" : "false";
    const text = Array.isArray(v) ? v.map(factValue).join(",")
      : typeof v === "string" ? v : canonical(v);
    return text.includes(" ") || !text ? '"' + text + '"' : text;
  }
  function rank(key) {
    const last = key.split("_").pop().split(".").pop();
    const telling = TELLING.includes(last) ? TELLING.indexOf(last) : TELLING.length;
    return [key.includes("_") || key.includes(".") ? 1 : 0, telling, key];
  }
  function factsText(facts) {
    const pairs = [];
    for (const [key, value] of flat(facts || {}, "")) {
      const text = factValue(value);
      if (!pairs.some(([k, t]) => k === key && t === text)) pairs.push([key, text]);
    }
    pairs.sort((a, b) => {
      const x = rank(a[0]), y = rank(b[0]);
      for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
      return 0;
    });
    return pairs.map(([k, t]) => k + "=" + t).join(" ");
  }
  function reasonOf(ev) {
    const r = (ev.data && (ev.data.reason || ev.data.message)) ||
              (ev.facts && ev.facts.reason) || "";
    return typeof r === "string" ? r : JSON.stringify(r);
  }
  const time = (iso) => iso.slice(11, 23);

  async function loadOperation(mine, force) {
    if (!view.id) {
      $("selected-title").textContent = "select an operation";
      $("waiting").textContent = "";
      $("timeline").replaceChildren(); $("event-rows").replaceChildren();
      drawnEvents = null;
      return;
    }
    const got = await api("/api/v1/operations/" + encodeURIComponent(view.id) + "/events");
    if (mine !== generation || (!force && !got.changed && drawnEvents === got.body)) return;
    drawnEvents = got.body;
    const op = got.body.operation, events = got.body.events;
    $("selected-title").textContent = op.kind + " " + op.id + " \u2014 " + op.phase
      + (op.parent ? " (drain " + op.parent.slice(0, 8) + ")" : "");
    $("waiting").textContent = op.terminal ? "finished " + stamp(op.updated_at) + " UTC, took "
        + seconds(took(op))
      : (op.held ? "held in the admission queue in " + op.phase
        : "waiting in " + op.phase) + (op.waiting_for ? " for " + op.waiting_for : "")
        + " (last change " + stamp(op.updated_at) + " UTC)";
    drawEventTable(events);
    drawTimeline(op, events);
  }

  function drawTimeline(op, events) {
    const box = $("timeline");
    box.replaceChildren();
    if (!events.length) return;
    const t = (ev) => Date.parse(ev.recorded_at);
    const start = t(events[0]);
    const end = Math.max(t(events[events.length - 1]), Date.parse(op.updated_at), start + 1);
    const lane = el("div"); lane.id = "phases";
    lane.setAttribute("role", "list"); lane.setAttribute("aria-label", "phases over time");
    let runStart = 0, colour = 0;
    for (let i = 1; i <= events.length; i++) {
      const phase = events[runStart].phase || "?";
      if (i < events.length && (events[i].phase || "?") === phase) continue;
      const from = t(events[runStart]);
      const to = i < events.length ? t(events[i]) : end;
      const bar = el("div", "phase-bar", phase);
      bar.dataset.phase = phase;
      bar.setAttribute("role", "listitem");
      bar.title = phase + " " + seconds(to - from);
      bar.style.flex = Math.max(to - from, 0) + " 1 0px";
      bar.style.background = colours[colour++ % colours.length];
      lane.append(bar);
      runStart = i;
    }
    const axis = el("div", "axis");
    axis.append(el("span", null, time(events[0].recorded_at) + " UTC"),
                el("span", null, seconds(end - start)));
    const marks = el("div"); marks.id = "events";
    const tip = el("div"); tip.id = "tip"; tip.hidden = true; tip.setAttribute("role", "tooltip");
    box.append(lane, axis, marks, tip);
    const nodes = events.map((ev, i) => {
      const mark = el("div", "event-mark");
      mark.dataset.type = ev.type;
      mark.dataset.seq = ev.seq;
      mark.tabIndex = 0;
      mark.setAttribute("aria-describedby", "tip");
      mark.setAttribute("aria-label", "event " + ev.seq + " " + ev.type);
      mark.append(el("span", "event-label", ev.type));
      const show = () => showTip(mark, ev, i ? events[i - 1].phase : null);
      mark.addEventListener("mouseenter", show);
      mark.addEventListener("focus", show);
      mark.addEventListener("mouseleave", () => {
        if (document.activeElement !== mark) tip.hidden = true;
      });
      mark.addEventListener("blur", () => { tip.hidden = true; });
      mark.addEventListener("keydown", (event) => {
        const to = {ArrowRight: i + 1, ArrowLeft: i - 1}[event.key];
        if (to !== undefined && marks.children[to]) {
          event.preventDefault();
          marks.children[to].focus();
        }
        if (event.key === "Escape") tip.hidden = true;
      });
      marks.append(mark);
      return [mark, (t(ev) - start) / (end - start)];
    });
    placeMarks(marks, nodes);
    marks.placed = nodes;
    resized.observe(marks);
  }

  // Each marker (diamond + label) takes the first row where it overlaps no other: labels
  // never sit on each other and never turn. Near the right edge a label runs leftwards.
  function placeMarks(marks, nodes) {
    const width = marks.clientWidth, gap = 6, rowHeight = 20, rows = [];
    for (const [mark, at] of nodes) {
      delete mark.dataset.side;
      const w = mark.offsetWidth, x = at * width;
      let left = x - 5;
      if (left + w > width) { mark.dataset.side = "left"; left = Math.max(0, x + 5 - w); }
      left = Math.max(0, left);
      let row = rows.findIndex(
        (spans) => spans.every(([a, b]) => left >= b + gap || left + w + gap <= a));
      if (row < 0) { rows.push([]); row = rows.length - 1; }
      rows[row].push([left, left + w]);
      mark.style.left = left + "px";
      mark.style.top = (4 + row * rowHeight) + "px";
    }
    marks.style.height = (8 + rows.length * rowHeight) + "px";
    marks.placedAt = width;
  }
  // Placed in pixels: a new width (the window, or a scrollbar coming) places them again.
  const resized = new ResizeObserver((entries) => {
    for (const entry of entries) {
      const marks = entry.target;
      if (marks.placed && marks.clientWidth !== marks.placedAt) placeMarks(marks, marks.placed);
    }
  });

  function showTip(mark, ev, before) {
    const tip = $("tip");
    tip.replaceChildren();
    const line = (text) => tip.append(el("div", null, text));
    line("#" + ev.seq + " " + ev.type + " at " + time(ev.recorded_at) + " UTC");
    if (ev.phase && ev.phase !== before)
      line("phase " + (before || "\u2013") + " \u2192 " + ev.phase);
    const reason = reasonOf(ev);
    if (reason) line("reason: " + reason);
    const facts = factsText(ev.facts);
    if (facts) line(facts);
    if (ev.worker_id) line("by " + ev.worker_id);
    tip.hidden = false;
    const box = $("timeline").getBoundingClientRect(), r = mark.getBoundingClientRect();
    const left = Math.min(Math.max(0, r.left - box.left), box.width - tip.offsetWidth);
    tip.style.left = Math.max(0, left) + "px";
    tip.style.top = (r.bottom - box.top + 4) + "px";
  }

  // Long facts (a verified artifact's annotations) open on demand: a row stays a row.
  function factsCell(text) {
    const td = el("td", "facts");
    if (text.length <= 240) { td.textContent = text; return td; }
    const more = el("details");
    more.append(el("summary", null, text.slice(0, 200) + "\u2026"), el("div", null, text));
    td.append(more);
    return td;
  }

  function drawEventTable(events) {
    const rows = $("event-rows");
    rows.replaceChildren();
    let before = null;
    const first = events.length ? Date.parse(events[0].recorded_at) : 0;
    for (const ev of events) {
      const change = ev.phase && ev.phase !== before
        ? (before ? before + " \u2192 " : "") + ev.phase : "";
      const tr = el("tr");
      tr.dataset.seq = ev.seq;
      tr.append(el("td", null, ev.seq), el("td", null, time(ev.recorded_at)),
                el("td", null, "+" + seconds(Date.parse(ev.recorded_at) - first)),
                cell("change", change), cell("type", ev.type), el("td", "reason", reasonOf(ev)),
                factsCell(factsText(ev.facts)), cell("by", ev.worker_id || ""));
      rows.append(tr);
      if (ev.phase) before = ev.phase;
    }
  }

  // -- loading, live --------------------------------------------------------------------
  async function refresh(force) {
    const mine = ++generation;
    try {
      await loadList(mine, force);
      await loadOperation(mine, force);
      if (mine === generation) {
        showError(null);
        $("live").textContent = "live \u00b7 checked " + new Date().toISOString().slice(11, 19)
          + " UTC";
      }
    } catch (err) { if (mine === generation) showError(err); }
  }
  let timer = null;
  function poll() {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      if (!document.hidden) await refresh(false);
      if (!signedOut) poll();
    }, POLL_MS);
  }

  if (view.q.kind) $("kind").append(el("option", null, view.q.kind));
  for (const f of FILTERS) {
    const input = $(f);
    input.value = view.q[f] || "";
    input.addEventListener("change", () => {
      if (input.value.trim()) view.q[f] = input.value.trim(); else delete view.q[f];
      view.offset = 0;
      go(false);
    });
  }
  if (![...$("limit").options].some((o) => o.value === String(view.limit)))
    $("limit").append(el("option", null, view.limit));
  $("limit").value = String(view.limit);
  $("limit").addEventListener("change", () => {
    view.limit = +$("limit").value;
    view.offset = 0;
    go(false);
  });
  $("prev").addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - view.limit);
    go(false);
  });
  $("next").addEventListener("click", () => { view.offset += view.limit; go(false); });
  window.addEventListener("hashchange", () => {
    readHash(window.location.hash);
    if (view.id) expanded.add(view.id);
    for (const f of FILTERS) $(f).value = view.q[f] || "";
    refresh(true);
  });
  refresh(true).then(poll);
})();
