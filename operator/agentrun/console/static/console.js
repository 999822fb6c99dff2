"use strict";
// Live updates from the console's server-sent events (live_streaming.py). No framework, no inline
// script (the Content-Security-Policy allows only this file).

function liveUrl(element) {
  const base = element.dataset.live;
  const version = element.dataset.resourceVersion || "";
  return base + (base.includes("?") ? "&" : "?") + "resourceVersion=" + encodeURIComponent(version);
}

function fragment(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  return template.content.firstElementChild;
}

function say(text) {
  let status = document.getElementById("live-status");
  if (!status) {
    status = document.createElement("p");
    status.id = "live-status";
    status.setAttribute("role", "status");
    document.getElementById("main").prepend(status);
  }
  status.textContent = text;
}

function follow(element, handlers) {
  const source = new EventSource(liveUrl(element));
  source.onopen = () => { document.body.dataset.live = "open"; };
  source.addEventListener("reload", () => window.location.reload());
  source.addEventListener("ended", (event) => {
    source.close();
    document.body.dataset.live = "ended";
    say("Live updates stopped: " + JSON.parse(event.data).message + " (reload the page to try again)");
  });
  for (const [name, handle] of Object.entries(handlers)) {
    source.addEventListener(name, (event) => handle(JSON.parse(event.data)));
  }
}

function followRuns(table) {
  follow(table, {
    row: ({ id, html }) => {
      const old = document.getElementById(id);
      if (!html) {
        if (old) old.remove();
        return;
      }
      const row = fragment(html);
      if (old) old.replaceWith(row);
      else table.tBodies[0].prepend(row);
      const empty = document.getElementById("no-runs");
      if (empty) empty.remove();
    },
  });
}

function followRun(run) {
  const shown = {};
  follow(run, {
    section: ({ id, html }) => {
      const old = document.getElementById(id);
      // Unchanged sections stay as they are: a reason being typed into an approval form is kept.
      if (!old || shown[id] === html) return;
      shown[id] = html;
      old.replaceWith(fragment(html));
    },
    gone: () => {
      document.body.dataset.live = "gone";
      say("This run was deleted.");
    },
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("runs");
  if (table) followRuns(table);
  const run = document.getElementById("run");
  if (run) followRun(run);
});
