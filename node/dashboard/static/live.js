// Live view: poll the node's status fingerprint and, when it changes, re-render this page's
// <main> from the server (the pages stay server-rendered; no page reload, no external script).
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
      var block = doc.getElementById("cursor-block");
      var here = document.getElementById("cursor-block");
      if (block && here) { here.textContent = block.textContent; }
    });
  }

  function tick() {
    if (document.hidden) { return setTimeout(tick, every); }
    fetch("/api/v1/status", { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("status answered " + r.status); }
        return r.json();
      })
      .then(function (s) { return s.fingerprint !== fingerprint ? refresh() : null; })
      .then(function () { show("live · " + new Date().toLocaleTimeString(), "ok"); })
      .catch(function (e) { show("offline: " + e.message, "err"); })
      .then(function () { setTimeout(tick, every); });
  }

  setTimeout(tick, every);
})();
