// Live view: poll the node's status; keep the header's block current and, when the data's
// fingerprint changes, re-render this page's <main> from the server (no reload, no external script).
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var badge = document.getElementById("live");
  if (!main) { return; }
  var fingerprint = main.getAttribute("data-fingerprint");
  var every = Number(main.getAttribute("data-poll-ms")) || 3000;

  function show(text, cls) {
    if (badge) { badge.textContent = text; badge.className = "live " + cls; }
  }

  function refresh() {
    return fetch(window.location.href, { cache: "no-store" }).then(function (r) {
      if (!r.ok) { throw new Error("page answered " + r.status); }
      return r.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.querySelector("main[data-live]");
      if (!fresh) { return; }
      main.innerHTML = fresh.innerHTML;
      fingerprint = fresh.getAttribute("data-fingerprint");
      main.setAttribute("data-fingerprint", fingerprint);
    });
  }

  function tick() {
    if (document.hidden) { return setTimeout(tick, every); }
    fetch("/api/v1/status", { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("status answered " + r.status); }
        return r.json();
      })
      .then(function (s) {
        var here = document.getElementById("cursor-block");
        if (here && s.cursor && s.cursor.block !== null) { here.textContent = String(s.cursor.block); }
        return s.fingerprint !== fingerprint ? refresh() : null;
      })
      .then(function () { show("live · " + new Date().toLocaleTimeString(), "ok"); })
      .catch(function (e) { show("offline: " + e.message, "err"); })
      .then(function () { setTimeout(tick, every); });
  }

  setTimeout(tick, every);
})();
