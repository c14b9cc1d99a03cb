  // The API token: from ?token= (remembered for this tab, then dropped from the address
  // bar), else the one this tab remembered; "" when there is none, and then a sign-in
  // link's cookie may still open the reads. ?signin=expired (a spent link) is dropped too.
  let signInNote = "";
  function takeToken(url) {
    const given = url.searchParams.get("token");
    url.searchParams.delete("token");
    if (url.searchParams.get("signin") === "expired")
      signInNote = "That sign-in link was used already or has expired.";
    url.searchParams.delete("signin");
    try {
      if (given) window.sessionStorage.setItem("controlplane.token", given);
      return given || window.sessionStorage.getItem("controlplane.token") || "";
    } catch (err) { return given || ""; }  // storage off: this page only
  }
  function bearer(token) { return token ? {"Authorization": "Bearer " + token} : {}; }
  // The API said 401: the page's panels give way to a form asking for the token, kept
  // in this tab's sessionStorage (never the URL) and used by the page as it reloads.
  function signIn(refused) {
    if (document.getElementById("sign-in")) return;
    try { window.sessionStorage.removeItem("controlplane.token"); } catch (err) { /* off */ }
    const main = document.querySelector("main");
    for (const part of main.children) part.hidden = true;
    const form = document.createElement("form");
    form.id = "sign-in";
    const title = document.createElement("h2");
    title.textContent = "Sign in";
    const note = document.createElement("p");
    note.id = "sign-in-note";
    note.textContent = (refused ? "The API refused that token. " : signInNote + " ")
      + "Enter the API token that cpctl serve was given (--token-file or "
      + "$CONTROLPLANE_API_TOKEN), or open the one-time sign-in link it printed.";
    const label = document.createElement("label");
    label.textContent = "API token ";
    const input = document.createElement("input");
    input.id = "sign-in-token"; input.type = "password"; input.autocomplete = "off";
    input.required = true;
    label.append(input);
    const button = document.createElement("button");
    button.type = "submit"; button.textContent = "sign in";
    form.append(title, note, label, button);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      try {
        window.sessionStorage.setItem("controlplane.token", value);
        window.location.reload();
      } catch (err) {  // storage off: hand it over in the address, as ?token= does
        const next = new URL(window.location.href);
        next.searchParams.set("token", value);
        window.location.replace(next.href);
      }
    });
    main.prepend(form);
    input.focus();
  }
