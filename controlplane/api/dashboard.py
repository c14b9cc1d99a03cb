"""The dashboard: one self-contained HTML page (inline CSS and JS, no external assets).

Served at ``/`` by :mod:`controlplane.api.app`. The page holds no data: it reads the
token from ``?token=`` (then drops it from the address bar), calls the JSON API with a
Bearer header, lists operations with kind/phase filters and, for the selected operation
(``&select=<id>`` or a click), draws a timeline: phases as bars over time and events as
marks labelled with their type and reason. Data is inserted with ``textContent`` only.
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
"""

SCRIPT = r"""
(function () {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token") || "";
  let selected = url.searchParams.get("select");
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
    const query = new URLSearchParams({limit: "200"});
    if ($("kind").value) query.set("kind", $("kind").value);
    if ($("phase").value.trim()) query.set("phase", $("phase").value.trim());
    let data;
    try { data = await api("/api/v1/operations?" + query); showError(null); }
    catch (err) { showError(err); return; }
    const rows = $("operations");
    rows.replaceChildren();
    for (const op of data.operations) {
      if (![...$("kind").options].some((o) => o.value === op.kind))
        $("kind").append(el("option", null, op.kind));
      const tr = el("tr", "operation" + (op.id === selected ? " selected" : ""));
      tr.dataset.id = op.id;
      tr.append(el("td", null, op.kind), el("td", "phase-" + op.phase, op.phase),
                el("td", null, op.workload || ""), el("td", null, op.source_node || ""),
                el("td", null, op.created_at.replace("T", " ").slice(0, 19)),
                el("td", "op-id", op.id.slice(0, 8)));
      tr.addEventListener("click", () => { selected = op.id; loadOperations(); });
      rows.append(tr);
    }
    $("count").textContent = data.operations.length + " operations";
    if (selected) await drawTimeline(selected);
  }

  function reasonOf(ev) {
    const r = (ev.data && (ev.data.reason || ev.data.message)) ||
              (ev.facts && ev.facts.reason) || "";
    return typeof r === "string" ? r : JSON.stringify(r);
  }

  async function drawTimeline(id) {
    let data;
    try { data = await api("/api/v1/operations/" + encodeURIComponent(id) + "/events"); }
    catch (err) { showError(err); return; }
    const op = data.operation, events = data.events;
    $("selected-title").textContent = op.kind + " " + op.id + " — " + op.phase;
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
