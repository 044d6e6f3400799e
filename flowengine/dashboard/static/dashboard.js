// flowengine dashboard: follow the event stream and refresh the live part of the page.
// Events change atom states at once; the page's fragment is then fetched again from the
// server (which reads the persistence backend), so what is shown always ends up as stored.
(function () {
  "use strict";
  var STATES = {
    "task-started": "RUNNING", "task-succeeded": "SUCCESS", "task-failed": "FAILURE",
    "task-reverted": "REVERTED", "task-revert-failed": "REVERT_FAILURE"
  };
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var prefixes = (live.dataset.refresh || "").split(",").filter(Boolean);
  var pending = null;
  var inFlight = false;
  var again = false;

  function setState(name, state) {
    var nodes = live.querySelectorAll('[data-atom="' + CSS.escape(name) + '"]');
    nodes.forEach(function (node) {
      node.setAttribute("data-state", state);
      var label = node.querySelector(".label");
      if (label) { label.textContent = state; } else if (node.classList.contains("state")) { node.textContent = state; }
    });
  }

  function refresh() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    url.searchParams.delete("notice");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null) {
          live.innerHTML = html;
          document.dispatchEvent(new CustomEvent("flowengine:refreshed"));
        }
      })
      .catch(function () {})
      .then(function () {
        inFlight = false;
        if (again) { again = false; schedule(); }
      });
  }

  function schedule() {
    if (pending) { clearTimeout(pending); }
    pending = setTimeout(function () { pending = null; refresh(); }, 250);
  }

  var source = new EventSource(live.dataset.stream);
  var status = document.getElementById("live-status");
  source.addEventListener("hello", function () {
    if (status) { status.textContent = "live"; status.className = "badge ok"; }
    schedule();  // catch up with what changed between rendering and subscribing
  });
  source.onerror = function () {
    if (status) { status.textContent = "reconnecting"; status.className = "badge off"; }
  };
  source.onmessage = function (message) {
    var event;
    try { event = JSON.parse(message.data); } catch (err) { return; }
    var state = STATES[event.type];
    if (state && event.task_name) { setState(event.task_name, state); }
    if (prefixes.some(function (p) { return (event.type || "").indexOf(p) === 0; })) { schedule(); }
    // An engine may announce a flow's end a moment before its store has it: look once more.
    if (/^flow-(succeeded|failed|reverted|suspended)$/.test(event.type || "")) { setTimeout(schedule, 1000); }
  };
})();
