"""The dashboard: one self-contained HTML page (inline CSS and JS, no external assets).

Served at ``/`` by :mod:`controlplane.api.app`. The page holds no data: it reads the
token from ``?token=`` (then drops it from the address bar), calls the JSON API with a
Bearer header, lists operations with kind/phase filters and, for the selected operation
(``&select=<id>`` or a click), draws a timeline: phases as bars over time and events as
marks labelled with their type and reason. Data is inserted with ``textContent`` only.

A drain is shown as a group: its row carries its node and a children summary ("2/3
moved, 1 failed") from the list's ``drain`` field, and expands (its toggle, or selecting
it) into a table of its child migrations read from ``GET /operations/{id}``'s
``children``; a child with a machine opens its timeline on click. In the flat list a
child migration (``parent`` set) is indented and labelled ``drain <short id>``.
"""

from __future__ import annotations

import base64
import hashlib

STYLE = """
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 16px;font-weight:600}
main{display:grid;grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:16px;padding:16px}
section{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:12px;
 overflow:auto}
table{border-collapse:collapse;width:100%}
td,th{padding:4px 6px;border-bottom:1px solid #eceef2;text-align:left;white-space:nowrap}
tr.operation{cursor:pointer} tr.operation:hover,tr.selected{background:#e8f0fe}
.phase-Succeeded,.phase-Resumed,.phase-Suspended{color:#137333}
.phase-Failed,.phase-Cancelled{color:#b3261e}
#error{color:#b3261e;min-height:1em}
#timeline{position:relative;margin-top:8px}
.lane{position:relative;height:34px;border-bottom:1px dashed #d8dce3}
.phase-bar{position:absolute;top:6px;height:22px;border-radius:3px;color:#fff;
 font-size:11px;line-height:22px;padding-left:4px;overflow:hidden;box-sizing:border-box}
.event-mark{position:absolute;width:2px;height:14px;background:#1d2330}
.event-label{position:absolute;font-size:11px;white-space:nowrap;
 transform:rotate(30deg);transform-origin:0 0}
#events{height:260px;position:relative;overflow:hidden}
.axis{font-size:11px;color:#5f6673;display:flex;justify-content:space-between}
.phase-Refused,.phase-Skipped{color:#b3261e}
.toggle{border:0;background:none;cursor:pointer;padding:0 4px 0 0;font:inherit}
tr.in-drain td.kind{padding-left:18px}
.parent-label{margin-left:6px;font-size:11px;color:#5f6673;background:#eceef2;
 border-radius:3px;padding:0 4px}
tr.drain-children>td{padding:0 0 8px 24px;background:#fafbfc;white-space:normal}
table.children{width:auto}
table.children td,table.children th{font-size:12px;padding:2px 6px}
table.children td.reason{white-space:normal;min-width:10em;color:#5f6673}
tr.child.clickable{cursor:pointer} tr.child.clickable:hover{background:#e8f0fe}
"""

SCRIPT = r"""
(function () {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token") || "";
  let selected = url.searchParams.get("select");
  // Drains shown with their children; a selected drain is opened (select= one too).
  const expanded = new Set(selected ? [selected] : []);
  let generation = 0;  // a newer load wins: an older one's answers are dropped
  url.searchParams.delete("token");
  window.history.replaceState(null, "", url.pathname + url.search);
  const $ = (id) => document.getElementById(id);
  const colours = ["#1a73e8", "#e8710a", "#12b5cb", "#9334e6", "#188038", "#d01884",
                   "#5f6368", "#f9ab00", "#a142f4", "#24c1e0"];
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  async function api(path) {
    const response = await fetch(path, {headers: {"Authorization": "Bearer " + token}});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }
  function showError(err) { $("error").textContent = err ? String(err.message || err) : ""; }

  async function loadOperations() {
    const mine = ++generation;
    const query = new URLSearchParams({limit: "200"});
    if ($("kind").value) query.set("kind", $("kind").value);
    if ($("phase").value.trim()) query.set("phase", $("phase").value.trim());
    let data, details;
    try {
      data = await api("/api/v1/operations?" + query);
      details = await Promise.all(data.operations
        .filter((op) => op.kind === "drain" && expanded.has(op.id))
        .map((op) => api("/api/v1/operations/" + encodeURIComponent(op.id))));
      showError(null);
    } catch (err) { showError(err); return; }
    if (mine !== generation) return;
    const children = new Map(details.map((d) => [d.id, d.children || []]));
    const rows = $("operations");
    rows.replaceChildren();
    for (const op of data.operations) {
      if (![...$("kind").options].some((o) => o.value === op.kind))
        $("kind").append(el("option", null, op.kind));
      rows.append(operationRow(op));
      if (children.has(op.id)) rows.append(childrenRow(op, children.get(op.id)));
    }
    $("count").textContent = data.operations.length + " operations";
    if (selected) await drawTimeline(selected, mine);
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
  const shortId = (op) => op.parent ? "…" + op.id.slice(-12) : op.id.slice(0, 8);

  function operationRow(op) {
    const drain = op.kind === "drain" ? op.drain : null;
    const tr = el("tr", "operation" + (drain ? " drain" : "") + (op.parent ? " in-drain" : "")
                        + (op.id === selected ? " selected" : ""));
    tr.dataset.id = op.id;
    if (op.parent) tr.dataset.parent = op.parent;
    const kind = el("td", "kind");
    if (drain) {
      const open = expanded.has(op.id);
      const toggle = el("button", "toggle", open ? "▾" : "▸");
      toggle.type = "button";
      toggle.title = open ? "hide children" : "show children";
      toggle.setAttribute("aria-expanded", String(open));
      toggle.addEventListener("click", (event) => {
        event.stopPropagation();
        if (open) expanded.delete(op.id); else expanded.add(op.id);
        loadOperations();
      });
      kind.append(toggle, el("span", null, op.kind));
    } else {
      kind.append(el("span", null, op.kind));
    }
    if (op.parent) kind.append(el("span", "parent-label", "drain " + op.parent.slice(0, 8)));
    tr.append(kind, el("td", "phase-" + op.phase, op.phase),
              drain ? el("td", "drain-summary", drainSummary(drain))
                    : el("td", null, op.workload || ""),
              el("td", null, (drain ? drain.node : op.source_node) || ""),
              el("td", null, op.created_at.replace("T", " ").slice(0, 19)),
              el("td", "op-id", shortId(op)));
    tr.lastChild.title = op.id;
    tr.addEventListener("click", () => {
      selected = op.id;
      if (drain) expanded.add(op.id);
      loadOperations();
    });
    return tr;
  }

  function childrenRow(op, children) {
    const tr = el("tr", "drain-children");
    tr.dataset.drain = op.id;
    const cell = el("td");
    cell.colSpan = 6;
    const table = el("table", "children");
    const head = el("tr");
    for (const h of ["child", "pod", "target", "phase / outcome", "reason"])
      head.append(el("th", null, h));
    table.append(head);
    if (!children.length) table.append(el("tr", null, "no children"));
    for (const c of children) {
      // Pending, Skipped and Refused children never became machines: nothing to open.
      const opens = c.status === "Started" || c.status === "Finished";
      const row = el("tr", "child" + (opens ? " clickable" : "")
                           + (c.id === selected ? " selected" : ""));
      row.dataset.id = c.id;
      row.dataset.status = c.status;
      const outcome = c.phase || c.status;
      const reason = c.reason || "";
      row.append(el("td", "op-id", "…" + c.id.slice(-12)), el("td", null, c.pod),
                 el("td", null, c.target), el("td", "phase-" + outcome, outcome),
                 el("td", "reason", reason.length > 80 ? reason.slice(0, 79) + "…" : reason));
      row.firstChild.title = c.id;
      row.lastChild.title = reason;
      if (opens) row.addEventListener("click", (event) => {
        event.stopPropagation();
        selected = c.id;
        loadOperations();
      });
      table.append(row);
    }
    cell.append(table);
    tr.append(cell);
    return tr;
  }

  function reasonOf(ev) {
    const r = (ev.data && (ev.data.reason || ev.data.message)) ||
              (ev.facts && ev.facts.reason) || "";
    return typeof r === "string" ? r : JSON.stringify(r);
  }

  async function drawTimeline(id, mine) {
    let data;
    try { data = await api("/api/v1/operations/" + encodeURIComponent(id) + "/events"); }
    catch (err) { showError(err); return; }
    if (mine !== generation) return;
    const op = data.operation, events = data.events;
    $("selected-title").textContent = op.kind + " " + op.id + " — " + op.phase
      + (op.parent ? " (drain " + op.parent.slice(0, 8) + ")" : "");
    const box = $("timeline");
    box.replaceChildren();
    if (!events.length) return;
    const t = (ev) => Date.parse(ev.recorded_at);
    const start = t(events[0]);
    const end = Math.max(t(events[events.length - 1]), Date.parse(op.updated_at), start + 1);
    const pct = (ms) => (100 * (ms - start) / (end - start));
    const lane = el("div", "lane"); lane.id = "phases";
    let runStart = 0, colour = 0;
    for (let i = 1; i <= events.length; i++) {
      const phase = events[runStart].phase || "?";
      if (i < events.length && (events[i].phase || "?") === phase) continue;
      const from = t(events[runStart]);
      const to = i < events.length ? t(events[i]) : end;
      const bar = el("div", "phase-bar", phase);
      bar.dataset.phase = phase;
      bar.title = phase + " " + ((to - from) / 1000).toFixed(2) + "s";
      bar.style.left = pct(from) + "%";
      bar.style.width = Math.max(pct(to) - pct(from), 0.6) + "%";
      bar.style.background = colours[colour++ % colours.length];
      lane.append(bar);
      runStart = i;
    }
    box.append(lane);
    const axis = el("div", "axis");
    axis.append(el("span", null, events[0].recorded_at.slice(11, 23)),
                el("span", null, ((end - start) / 1000).toFixed(2) + " s"));
    box.append(axis);
    const marks = el("div"); marks.id = "events";
    events.forEach((ev, i) => {
      const mark = el("div", "event-mark");
      mark.dataset.type = ev.type;
      const reason = reasonOf(ev);
      mark.title = ev.seq + " " + ev.type + (reason ? " (" + reason + ")" : "");
      mark.style.left = pct(t(ev)) + "%";
      mark.style.top = ((i % 4) * 6) + "px";
      const short = reason.length > 40 ? reason.slice(0, 39) + "…" : reason;
      const label = el("span", "event-label", ev.type + (short ? ": " + short : ""));
      label.style.left = "4px"; label.style.top = "12px";
      mark.append(label);
      marks.append(mark);
    });
    box.append(marks);
  }

  $("kind").addEventListener("change", loadOperations);
  $("phase").addEventListener("change", loadOperations);
  $("reload").addEventListener("click", loadOperations);
  loadOperations();
})();
"""


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


#: Only this page's own script and style may run; it may only talk to its own origin.
CSP = (f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
       "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")

PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>controlplane dashboard</title>
<style>{STYLE}</style></head>
<body>
<header>controlplane — operations</header>
<main>
<section>
  <label>kind <select id="kind"><option value="">any</option></select></label>
  <label>phase <input id="phase" size="14" placeholder="e.g. Succeeded"></label>
  <button id="reload" type="button">reload</button> <span id="count"></span>
  <div id="error" role="alert"></div>
  <table><thead><tr><th>kind</th><th>phase</th><th>workload</th><th>node</th>
  <th>submitted (UTC)</th><th>id</th></tr></thead><tbody id="operations"></tbody></table>
</section>
<section>
  <h3 id="selected-title">select an operation</h3>
  <div id="timeline"></div>
</section>
</main>
<script>{SCRIPT}</script>
</body></html>
"""
