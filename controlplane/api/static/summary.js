(function () {
  const url = new URL(window.location.href);
__TOKEN_JS__
  const token = takeToken(url);
  const drain = url.searchParams.get("drain");
  window.history.replaceState(null, "", url.pathname + url.search);
  async function draw(figure) {
    const name = figure.dataset.chart;
    const query = drain && name === "drain-load" ? "?drain=" + encodeURIComponent(drain) : "";
    const error = figure.querySelector(".error");
    try {
      const response = await fetch("/api/v1/charts/" + name + ".svg" + query,
                                   {headers: bearer(token)});
      if (response.status === 401) { signIn(Boolean(token)); return; }
      const body = await response.text();
      if (!response.ok) {
        let message = response.statusText;
        try { message = JSON.parse(body).error || message; } catch (e) { /* not JSON */ }
        throw new Error(message);
      }
      const doc = new DOMParser().parseFromString(body, "image/svg+xml");
      if (doc.querySelector("parsererror")) throw new Error("the chart is not valid SVG");
      figure.querySelector(".chart-box").replaceChildren(
        document.importNode(doc.documentElement, true));
      error.textContent = "";
    } catch (err) {
      error.textContent = name + ": " + String(err.message || err);
    }
  }
  document.querySelectorAll("figure[data-chart]").forEach(draw);
})();
