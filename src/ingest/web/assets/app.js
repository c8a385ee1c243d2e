// The live view's page script. Every string that came from a sensor is written with
// textContent (never parsed as markup), and the page is served with `default-src 'self'`, so
// nothing a sensor sends can run here.
"use strict";

const $ = (id) => document.getElementById(id);
const MAX_ROWS = 1000;
let csrf = null;
let source = null;
let paused = false;
let held = [];
let events = [];

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  if (method !== "GET" && csrf) opts.headers["X-CSRF-Token"] = csrf;
  const r = await fetch(path, opts);
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  return { status: r.status, ok: r.ok, data };
}

function show(id) {
  for (const s of ["signin", "live", "tools", "sensors"]) $(s).hidden = s !== id;
  for (const s of ["live", "tools", "sensors"]) $("nav-" + s).classList.toggle("active", s === id);
}

async function start() {
  const s = await api("GET", "/ui/session");
  if (!s.ok) {
    $("nav").hidden = true;
    show("signin");
    $("secret").focus();
    return;
  }
  csrf = s.data.csrf;
  $("nav").hidden = false;
  route();
}

function route() {
  if (!csrf) return;
  const page = (location.hash || "#live").slice(1);
  // The minted token is shown once: leaving the page forgets it.
  $("minted").hidden = true;
  $("minted-token").textContent = "";
  $("minted-snippet").textContent = "";
  if (page === "tools") { show("tools"); loadTools(); }
  else if (page === "sensors") { show("sensors"); loadKeys(); }
  else { show("live"); }
  if (!source) connect();
}

// ---- sign-in ----

$("signin-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("signin-error").textContent = "";
  const r = await api("POST", "/ui/signin", { secret: $("secret").value });
  $("secret").value = "";
  if (r.ok) { start(); return; }
  $("signin-error").textContent = (r.data && r.data.error) || ("sign-in failed (" + r.status + ")");
});

$("signout").addEventListener("click", async () => {
  await api("POST", "/ui/signout");
  if (source) { source.close(); source = null; }
  csrf = null;
  start();
});

window.addEventListener("hashchange", route);

// ---- live events ----

function filters() {
  return {
    org: $("f-org").value.trim(),
    actor: $("f-actor").value.trim(),
    tool: $("f-tool").value.trim(),
    cls: $("f-class").value,
    status: $("f-status").value.trim(),
  };
}

function str(v) { return v === undefined || v === null ? "" : String(v); }

function matches(ev, f) {
  if (f.org && str(ev.org) !== f.org) return false;
  if (f.actor && !str(ev.actor && ev.actor.id).includes(f.actor)) return false;
  if (f.tool && !str(ev.rec && ev.rec.action).includes(f.tool)) return false;
  if (f.cls && ev.class !== f.cls) return false;
  if (f.status && str(ev.status) !== f.status) return false;
  return true;
}

function fieldsText(ev) {
  const fields = ev.rec && ev.rec.fields;
  if (!fields || typeof fields !== "object") return "";
  return Object.keys(fields).map((k) => k + "=" + JSON.stringify(fields[k])).join(" ");
}

function row(ev) {
  const tr = el("tr", null, "ev cls-" + str(ev.class));
  tr.dataset.id = str(ev.id);
  tr.appendChild(el("td", str(ev.ts).replace("T", " ").replace("Z", "")));
  tr.appendChild(el("td", ev.rec && ev.rec.action, "tool"));
  tr.appendChild(el("td", ev.class, "cls"));
  tr.appendChild(el("td", ev.status, "status"));
  tr.appendChild(el("td", ev.dur_ms));
  tr.appendChild(el("td", ev.actor && ev.actor.id, "actor"));
  tr.appendChild(el("td", ev.onBehalfOf, "obo"));
  tr.appendChild(el("td", fieldsText(ev), "fields"));
  tr.addEventListener("click", () => {
    $("envelope").textContent = JSON.stringify(ev, null, 2);
    $("envelope-box").hidden = false;
  });
  return tr;
}

function render() {
  const f = filters();
  const body = $("events-body");
  const rows = [];
  for (let i = events.length - 1; i >= 0; i--) {
    if (matches(events[i], f)) rows.push(row(events[i]));
  }
  body.replaceChildren(...rows);
}

function add(ev) {
  events.push(ev);
  if (events.length > MAX_ROWS) events.shift();
  if (matches(ev, filters())) {
    const body = $("events-body");
    body.insertBefore(row(ev), body.firstChild);
    while (body.childNodes.length > MAX_ROWS) body.removeChild(body.lastChild);
  }
}

function connect() {
  // A new stream starts with the backlog again.
  events = [];
  held = [];
  $("events-body").replaceChildren();
  source = new EventSource("/ui/stream");
  source.addEventListener("open", () => { $("live-state").textContent = paused ? "paused" : "live"; });
  source.addEventListener("error", () => {
    $("live-state").textContent = "reconnecting…";
    // Refused (the session ended): the browser gives up on the stream; sign in again.
    if (source && source.readyState === EventSource.CLOSED) {
      source = null;
      csrf = null;
      start();
    }
  });
  source.addEventListener("ev", (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch (_) { return; }
    if (paused) { held.push(ev); $("live-state").textContent = "paused (" + held.length + " new)"; return; }
    add(ev);
  });
}

$("pause").addEventListener("click", () => {
  paused = !paused;
  $("pause").textContent = paused ? "Resume" : "Pause";
  if (!paused) {
    for (const ev of held) add(ev);
    held = [];
  }
  $("live-state").textContent = paused ? "paused" : "live";
});

for (const id of ["f-org", "f-actor", "f-tool", "f-status"]) $(id).addEventListener("input", render);
$("f-class").addEventListener("change", render);
$("envelope-close").addEventListener("click", () => { $("envelope-box").hidden = true; });

// ---- tools ----

const SVG = "http://www.w3.org/2000/svg";

function chart(perMinute) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", "0 0 600 96");
  svg.setAttribute("preserveAspectRatio", "none");
  const calls = perMinute.calls || [];
  const errors = perMinute.errors || [];
  const max = Math.max(1, ...calls);
  for (const [x, anchor, label] of [[0, "start", "60 min ago"], [600, "end", "now"], [300, "middle", "max " + max + "/min"]]) {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", String(x));
    t.setAttribute("y", "94");
    t.setAttribute("text-anchor", anchor);
    t.setAttribute("class", "axis");
    t.textContent = label;
    svg.appendChild(t);
  }
  const w = 600 / Math.max(1, calls.length);
  calls.forEach((c, i) => {
    for (const [v, cls] of [[c, "calls"], [errors[i] || 0, "errors"]]) {
      if (!v) continue;
      const h = (v / max) * 76;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("x", String(i * w + 1));
      r.setAttribute("y", String(80 - h));
      r.setAttribute("width", String(Math.max(1, w - 2)));
      r.setAttribute("height", String(h));
      r.setAttribute("class", cls);
      const t = document.createElementNS(SVG, "title");
      t.textContent = (59 - i) + " min ago: " + v + " " + cls;
      r.appendChild(t);
      svg.appendChild(r);
    }
  });
  return svg;
}

function ms(v) {
  if (v === null || v === undefined) return "–";
  return v >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(2)));
}

async function loadTools() {
  const org = $("t-org").value.trim();
  const q = org ? "?org=" + encodeURIComponent(org) : "";
  const [r, rollups, defs] = await Promise.all([
    api("GET", "/ui/tools" + q), api("GET", "/v1/rollups" + q), api("GET", "/v1/tools" + q),
  ]);
  const list = $("tools-list");
  list.replaceChildren();
  if (!r.ok) { list.appendChild(el("p", "cannot load tools (" + r.status + ")", "error")); return; }
  const apiGroups = rollups.ok && rollups.data ? (rollups.data.errorGroups || rollups.data.errors || null) : null;
  const tools = r.data.tools || [];
  if (tools.length === 0) list.appendChild(el("p", "No calls in the last hour.", "muted"));
  for (const t of tools) {
    const box = el("div", null, "tool");
    box.appendChild(el("h3", t.tool));
    const pct = (t.errorRate * 100).toFixed(1);
    box.appendChild(el("p", t.calls + " calls, " + t.errors + " errors (" + pct + "%) · dur_ms p50 " +
      ms(t.durMs.p50) + " · p95 " + ms(t.durMs.p95) + " · p99 " + ms(t.durMs.p99)));
    box.appendChild(chart(t.perMinute));
    const largest = (t.largest || []).map((l) => l.resp + " B").join(", ");
    box.appendChild(el("p", "Largest responses: " + (largest || "none reported")));
    let groups = t.errorGroups;
    if (!groups && Array.isArray(apiGroups)) {
      groups = apiGroups.filter((g) => (g.tool || g.action) === t.tool);
      if (groups.length === 0) groups = null;
    }
    if (groups) {
      const ul = el("ul");
      for (const g of groups) {
        ul.appendChild(el("li", str(g.fp) + ": " + str(g.count) + " × (first " + str(g.firstSeen || g.first) +
          ", last " + str(g.lastSeen || g.last) + ")"));
      }
      box.appendChild(el("p", "Error groups by fingerprint:"));
      box.appendChild(ul);
    } else {
      box.appendChild(el("p", "Error groups: not reported", "muted"));
    }
    list.appendChild(box);
  }
  const drift = $("drift");
  drift.replaceChildren();
  const defsList = defs.ok && defs.data ? (defs.data.tools || defs.data.definitions || null) : null;
  if (!Array.isArray(defsList)) { drift.appendChild(el("span", "Definition drift: not reported")); return; }
  const flagged = defsList.filter((d) => d.changed || d.inconsistent);
  if (flagged.length === 0) { drift.appendChild(el("span", "No definition changed.")); return; }
  const ul = el("ul");
  for (const d of flagged) {
    const li = el("li", str(d.host || (d.dest && d.dest.host)) + " · " + str(d.tool || d.action) + " ");
    if (d.changed) li.appendChild(el("span", "changed ", "flag"));
    if (d.inconsistent) li.appendChild(el("span", "inconsistent", "flag"));
    ul.appendChild(li);
  }
  drift.appendChild(ul);
}

$("t-refresh").addEventListener("click", loadTools);

// ---- sensors and keys ----

function health(h) {
  if (!h || typeof h !== "object") return "not reported";
  return Object.keys(h).map((k) => k + " " + h[k]).join(", ");
}

async function loadKeys() {
  const [k, s] = await Promise.all([api("GET", "/ui/keys"), api("GET", "/v1/admin/sensors")]);
  const body = $("keys-body");
  body.replaceChildren();
  if (!k.ok) { body.appendChild(el("tr")).appendChild(el("td", "cannot load keys (" + k.status + ")", "error")); return; }
  const stats = {};
  for (const x of (s.ok && s.data && s.data.sensors) || []) stats[x.keyId] = x;
  for (const key of k.data.keys) {
    const st = stats[key.keyId] || {};
    const tr = el("tr");
    tr.dataset.key = key.keyId;
    tr.appendChild(el("td", key.keyId, "key"));
    tr.appendChild(el("td", key.org));
    tr.appendChild(el("td", key.name));
    tr.appendChild(el("td", key.createdAt));
    tr.appendChild(el("td", st.lastSeen || "never"));
    tr.appendChild(el("td", st.version));
    tr.appendChild(el("td", st.transport));
    tr.appendChild(el("td", st.batches || 0));
    tr.appendChild(el("td", st.accepted || 0));
    tr.appendChild(el("td", st.dropped || 0));
    tr.appendChild(el("td", health(st.health)));
    const td = el("td");
    if (key.revokedAt) {
      td.appendChild(el("span", "revoked " + key.revokedAt, "muted revoked"));
    } else {
      const b = el("button", "Revoke", "revoke");
      b.type = "button";
      b.addEventListener("click", () => confirmRevoke(td, key.keyId));
      td.appendChild(b);
    }
    tr.appendChild(td);
    body.appendChild(tr);
  }
}

function confirmRevoke(td, keyId) {
  td.replaceChildren();
  td.appendChild(el("span", "Revoke " + keyId + "? Its sensors stop reporting. "));
  const yes = el("button", "Yes, revoke", "confirm-revoke");
  yes.type = "button";
  const no = el("button", "Cancel", "cancel-revoke");
  no.type = "button";
  yes.addEventListener("click", async () => {
    const r = await api("DELETE", "/v1/admin/keys/" + encodeURIComponent(keyId));
    if (!r.ok) td.appendChild(el("span", " revoke failed (" + r.status + ")", "error"));
    else loadKeys();
  });
  no.addEventListener("click", loadKeys);
  td.append(yes, " ", no);
}

$("mint-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("mint-error").textContent = "";
  const body = { org: $("mint-org").value.trim() };
  const name = $("mint-name").value.trim();
  if (name) body.name = name;
  const r = await api("POST", "/v1/admin/keys", body);
  if (!r.ok) { $("mint-error").textContent = (r.data && r.data.error) || ("mint failed (" + r.status + ")"); return; }
  $("minted-token").textContent = r.data.token;
  $("copied").textContent = "";
  const snippet = {
    mcpServers: {
      [name || "my-server"]: {
        command: "/usr/local/bin/bounded-observe-mcp",
        args: ["--", "/path/to/your/mcp-server"],
        env: { BOUNDED_SENSOR_TOKEN: r.data.token, BOUNDED_INGEST_BASE: location.origin },
      },
    },
  };
  $("minted-snippet").textContent = JSON.stringify(snippet, null, 2);
  $("minted").hidden = false;
  loadKeys();
});

$("copy-token").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText($("minted-token").textContent);
    $("copied").textContent = "copied";
  } catch (_) {
    $("copied").textContent = "select the token and copy it";
  }
});

start();
