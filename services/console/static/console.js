// Engram console: live events over server-sent events, and small conveniences. No build step.
// Every text shown comes from the server as data and is set with textContent, never as HTML.
(function () {
  "use strict";

  const NOTE_EVENTS = new Set(["note_saved", "note_updated", "note_superseded", "note_forgotten", "note_renewed"]);
  let pending = null;
  let lastToken = null;
  let refreshNotes = false;

  function withAfter(src, token) {
    return src + (src.includes("?") ? "&" : "?") + "after=" + encodeURIComponent(token);
  }

  function refresh() {
    pending = null;
    if (!window.htmx || !lastToken) return;
    const chart = document.getElementById("chart");
    if (chart && chart.dataset.src) {
      htmx.ajax("GET", withAfter(chart.dataset.src, lastToken), { target: "#chart", swap: "outerHTML" });
    }
    const notes = document.getElementById("notes");
    if (notes && notes.dataset.src && refreshNotes) {
      htmx.ajax("GET", withAfter(notes.dataset.src, lastToken), { target: "#notes", select: "#notes", swap: "outerHTML" });
    }
    refreshNotes = false;
  }

  function noteHref(e) {
    return "/note?u=" + encodeURIComponent(e.user_id) + "&id=" + encodeURIComponent(e.note_id);
  }

  function row(e, global) {
    const li = document.createElement("li");
    li.className = "event fresh " + e.type;
    li.dataset.note = e.note_id;
    const time = document.createElement("time");
    time.dateTime = e.at;
    time.textContent = e.at.slice(5, 19).replace("T", " ");
    const type = document.createElement("span");
    type.className = "type";
    type.textContent = e.type.replace(/_/g, " ");
    li.append(time, " ", type, " ");
    if (global) {
      const who = document.createElement("a");
      who.href = "/user?u=" + encodeURIComponent(e.user_id);
      who.textContent = e.user_id;
      li.append(who, " ");
    }
    if (e.note_id.startsWith("_")) {
      const what = document.createElement("span");
      what.textContent = e.note_id === "_account" ? "account" : "conversation";
      li.append(what);
    } else {
      const a = document.createElement("a");
      a.href = noteHref(e);
      a.textContent = e.note_id;
      li.append(a);
    }
    const meta = document.createElement("span");
    meta.className = "dim";
    meta.textContent = " v" + e.version + (e.channel ? " · " + e.channel : "");
    li.append(meta);
    return li;
  }

  function follow() {
    const live = document.getElementById("live");
    if (!live || !window.EventSource) return;
    const state = document.getElementById("live-state");
    const user = live.dataset.user || "";
    const source = new EventSource("/events" + (user ? "?u=" + encodeURIComponent(user) : ""));
    source.addEventListener("ready", function () {
      live.dataset.state = "on";
      if (state) { state.textContent = "live"; state.classList.add("on"); }
    });
    source.addEventListener("engram", function (message) {
      const e = JSON.parse(message.data);
      const empty = live.querySelector(".empty");
      if (empty) empty.remove();
      live.prepend(row(e, !user));
      while (live.children.length > 50) live.lastElementChild.remove();
      lastToken = e.token;
      if (NOTE_EVENTS.has(e.type)) refreshNotes = true;
      if (!pending) pending = setTimeout(refresh, 250);
    });
    source.addEventListener("error", function () {
      live.dataset.state = "off";
      if (state) { state.textContent = "reconnecting…"; state.classList.remove("on"); }
    });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function budget() {
    const range = document.getElementById("budget");
    const shown = document.getElementById("budget-shown");
    if (!range || !shown) return;
    const show = function () {
      shown.textContent = range.value === "0" ? "no limit" : range.value + " tokens";
    };
    range.addEventListener("input", show);
    show();
  }

  function copy() {
    document.addEventListener("click", function (event) {
      const button = event.target.closest("[data-copy]");
      if (!button) return;
      const source = document.getElementById(button.dataset.copy);
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.textContent).then(function () { button.textContent = "Copied"; });
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    follow();
    budget();
    copy();
  });
})();
