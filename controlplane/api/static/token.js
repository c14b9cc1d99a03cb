  function takeToken(url) {
    const given = url.searchParams.get("token");
    url.searchParams.delete("token");
    try {
      if (given) window.sessionStorage.setItem("controlplane.token", given);
      return given || window.sessionStorage.getItem("controlplane.token") || "";
    } catch (err) { return given || ""; }  // storage off: this page only
  }
