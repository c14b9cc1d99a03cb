"""The dashboard: one self-contained HTML page (inline CSS and JS, no external assets;
their sources are ``static/dashboard.css`` and ``static/dashboard.js``).

Served at ``/`` by :mod:`controlplane.api.app` under a CSP that admits only this page's
script and style (by hash) and requests to its own origin. The page holds no data: it
reads the token from ``?token=`` or its sign-in form (then keeps it in the tab's
``sessionStorage`` for the summary page: :mod:`controlplane.api.pages`; it is sent as a
Bearer header), or reads with the cookie of ``cpctl serve``'s one-time sign-in link
(:mod:`controlplane.api.login`), and draws everything from the JSON API with
``textContent`` only. A 401 shows the sign-in form in place of the panels and stops the
polling.

Full width, top to bottom: the operations list (filters kind, phase, node, namespace,
since; sortable columns; pages with the API's ``total``; rows focusable, arrows move,
Enter opens), then the selected operation: its phases as a bar whose widths are
durations, its events as markers stacked into rows so no two overlap (details on hover
and on keyboard focus), and the event table (time, phase change, event, reason, facts as
``key=value`` as ``cpctl history`` prints them, who). A drain's row opens into its child
migrations; a child opens its own timeline. The view is in the fragment
(``#/op/<id>?kind=...``), so a URL can be shared; ``?select=<id>`` still works. The page
polls every few seconds with ``If-None-Match`` and redraws only what changed.
"""

from __future__ import annotations

from controlplane.api.pages import NAV_CSS, TOKEN_JS, asset, page_csp, page_html

#: How often the page re-asks the API (milliseconds); an unchanged answer is a 304.
POLL_MS = 2000

#: ``static/dashboard.css`` and the header links' style.
STYLE = asset("dashboard.css") + NAV_CSS

#: ``static/dashboard.js`` with its placeholders filled (``__POLL_MS__``, ``__TOKEN_JS__``).
SCRIPT = (asset("dashboard.js").replace("__POLL_MS__", str(POLL_MS))
          .replace("__TOKEN_JS__", TOKEN_JS))


#: Only this page's own script and style may run; it may only talk to its own origin.
CSP = page_csp(SCRIPT, STYLE, images=True)

PAGE = page_html("controlplane dashboard", STYLE,
                 '<h1>controlplane — operations</h1><span id="live" aria-live="off"></span>',
                 """<section id="list-panel" aria-label="operations">
  <div class="filters">
  <label>kind <select id="kind"><option value="">any</option></select></label>
  <label>phase <input id="phase" placeholder="e.g. Succeeded"></label>
  <label>node <input id="node" placeholder="e.g. node-1"></label>
  <label>namespace <input id="namespace" placeholder="e.g. default"></label>
  <label>since (UTC) <input id="since" type="datetime-local"></label>
  </div>
  <div id="error" role="alert"></div>
  <table id="operations-table"><thead><tr id="columns"></tr></thead>
  <tbody id="operations"></tbody></table>
  <div class="pager"><button id="prev" type="button">previous</button>
  <button id="next" type="button">next</button> <span id="count"></span>
  <label>per page <select id="limit"><option>25</option><option>50</option>
  <option>100</option><option>200</option></select></label></div>
</section>
<section id="detail-panel" aria-label="the selected operation">
  <h2 id="selected-title">select an operation</h2>
  <p id="waiting"></p>
  <div id="timeline"></div>
  <table id="event-table"><colgroup><col class="c-seq"><col class="c-time"><col class="c-after">
  <col class="c-change"><col class="c-type"><col class="c-reason"><col><col class="c-by">
  </colgroup>
  <thead><tr><th>#</th><th>time (UTC)</th><th>after</th><th>phase change</th><th>event</th>
  <th>reason</th><th>facts</th><th>by</th></tr></thead><tbody id="event-rows"></tbody></table>
</section>""", SCRIPT)
