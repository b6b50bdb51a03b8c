// toolbus console: live updates. Plain JS, no build step.
// The page is rendered (and escaped) by the server; this script never builds HTML from
// data: on each server-sent event it fetches the page again and swaps the #live
// element of the parsed document in (a parsed document runs no script).
(function () {
  'use strict';
  // Live durations: every element with data-since (milliseconds since the epoch) shows
  // the time elapsed since then, counted each second (textContent: never HTML). The
  // format is the server's (format.go dur).
  function dur(ms) {
    if (ms < 1) { return '<1ms'; }
    if (ms < 1000) { return Math.floor(ms) + 'ms'; }
    var s = ms / 1000;
    if (s < 10) { return s.toFixed(1) + 's'; }
    if (s < 60) { return Math.floor(s) + 's'; }
    var m = Math.floor(s / 60), h = Math.floor(m / 60);
    function two(n) { return (n < 10 ? '0' : '') + n; }
    if (m < 60) { return m + 'm' + two(Math.floor(s % 60)) + 's'; }
    return h + 'h' + two(m % 60) + 'm';
  }
  function tick() {
    var now = Date.now();
    var els = document.querySelectorAll('[data-since]');
    for (var i = 0; i < els.length; i++) {
      var since = Number(els[i].dataset.since);
      if (since > 0) { els[i].textContent = dur(Math.max(0, now - since)); }
    }
  }
  tick();
  setInterval(tick, 1000);

  // Actions are plain forms: the session cookie (SameSite=Strict) says who acts.
  var src = document.body.dataset.sse;
  if (!src || !window.EventSource) { return; }
  var timer = null, busy = false, again = false;

  // editing reports whether the user is typing in the live region: an update then
  // waits, so a half-typed reason or answer is not lost.
  function editing() {
    var live = document.getElementById('live');
    if (!live) { return false; }
    var a = document.activeElement;
    if (a && live.contains(a) && (a.tagName === 'INPUT' || a.tagName === 'SELECT')) { return true; }
    if (live.querySelector('form.question[data-dirty]')) { return true; }
    var inputs = live.querySelectorAll('input[type=text]');
    for (var i = 0; i < inputs.length; i++) { if (inputs[i].value) { return true; } }
    return false;
  }

  // A question's form the user changed (a select, a number, a box) keeps the page too.
  document.addEventListener('input', function (e) {
    var f = e.target && e.target.closest ? e.target.closest('form.question') : null;
    if (f) { f.dataset.dirty = '1'; }
  });

  function schedule(ms) { clearTimeout(timer); timer = setTimeout(refresh, ms); }

  function refresh() {
    if (busy) { again = true; return; }
    if (editing()) { schedule(1000); return; }
    busy = true;
    fetch(location.href, { cache: 'no-store', headers: { 'Accept': 'text/html' } })
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, 'text/html');
        var next = doc.getElementById('live');
        var live = document.getElementById('live');
        if (next && live && !editing()) {
          live.replaceWith(document.adoptNode(next));
          tick();
          document.body.dataset.updated = String(Date.now());
        }
      })
      .catch(function () { /* the next event tries again */ })
      .finally(function () { busy = false; if (again) { again = false; schedule(100); } });
  }

  var es = new EventSource(src);
  es.addEventListener('ready', function () { document.body.dataset.live = 'on'; schedule(0); });
  es.addEventListener('bus', function () { schedule(150); });
  es.onerror = function () { document.body.dataset.live = 'off'; };
})();
