// Sluice's dashboard. It holds no state of its own: every page reads (and the overrides,
// exemptions and domains pages change) the admin API, with the token the operator signed in
// with, kept in session storage (gone when the tab closes). The tokens page needs an admin
// token.
import { h, render } from "preact";
import { useState, useEffect, useRef, useCallback } from "preact/hooks";
import htm from "htm";
import uPlot from "uplot";

const html = htm.bind(h);
const TOKEN_KEY = "sluice.admin-token";

// ---- the admin API

class APIError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.field = body && body.field;
  }
}

// api calls the admin API. body is sent as JSON, or as it is when contentType is given (a
// domain's YAML, a merge patch). Every change waits for the fleet (Sluice-Wait: fleet): when
// the dashboard says it is done, every live node enforces it; a 504 names the nodes that lag.
async function api(method, path, body, contentType) {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  const init = { method, headers: { Authorization: "Bearer " + token } };
  if (method !== "GET") init.headers["Sluice-Wait"] = "fleet";
  if (body !== undefined && contentType) {
    init.headers["Content-Type"] = contentType;
    init.body = body;
  } else if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch("/admin/v1/" + path, init);
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    window.dispatchEvent(new Event("sluice-signed-out"));
  }
  if (res.status === 204) return null;
  let data = null;
  try {
    data = await res.json();
  } catch (e) {
    data = null;
  }
  if (!res.ok) throw new APIError(res.status, data);
  return data;
}

// apiList GETs every page of a paged list (the answer's `next` cursor, ?after=), joined under
// key: the page shows all of it, as before lists were paged.
async function apiList(path, key) {
  const first = await api("GET", path);
  let page = first;
  while (page && page.next) {
    page = await api("GET", path + (path.includes("?") ? "&" : "?") + "after=" + encodeURIComponent(page.next));
    first[key] = first[key].concat((page && page[key]) || []);
  }
  delete first.next;
  return first;
}

function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== undefined && v !== null) p.set(k, v);
  const s = p.toString();
  return s ? "?" + s : "";
}

// usePoll loads fn() now and every ms milliseconds (0: once) while the page is shown.
function usePoll(fn, ms, deps) {
  const [state, setState] = useState({ data: null, error: null });
  const reload = useCallback(() => {
    fn().then((data) => setState({ data, error: null }), (error) => setState((s) => ({ data: s.data, error })));
  }, deps);
  useEffect(() => {
    reload();
    if (!ms) return undefined;
    const t = setInterval(reload, ms);
    return () => clearInterval(t);
  }, [reload]);
  return [state, reload];
}

// ---- small pieces

// shown is a caller-chosen string (a name, an identity, a reason) as the page shows it: the
// characters that reorder or hide text (bidirectional overrides and isolates, zero-width
// marks) and other invisible controls are written as \u{...} escapes, as the CLI quotes
// them, so that a name cannot read reversed or pass for another.
const shown = (s) =>
  s === undefined || s === null
    ? s
    : String(s).replace(/[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g, (c) => "\\u{" + c.codePointAt(0).toString(16) + "}");

const fmt = (n, d = 1) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: d }));
const when = (t) => (t ? new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–");
const ms = (v) => (v === undefined || v === null ? "–" : v >= 1000 ? fmt(v / 1000, 1) + " s" : fmt(v, 0) + " ms");

function ErrorBox({ error }) {
  if (!error) return null;
  return html`<div class="error" role="alert">${error.message}${error.field ? html` <span>(field: <code>${error.field}</code>)</span>` : ""}</div>`;
}

function Field({ id, label, value, onInput, type = "text", ...rest }) {
  return html`<label for=${id}>${label}<input id=${id} name=${id} type=${type} value=${value} onInput=${(e) => onInput(e.currentTarget.value)} ...${rest} /></label>`;
}

function Select({ id, label, value, onInput, options }) {
  return html`<label for=${id}>${label}<select id=${id} name=${id} value=${value} onChange=${(e) => onInput(e.currentTarget.value)}>
    ${options.map((o) => html`<option value=${o[0]}>${o[1]}</option>`)}
  </select></label>`;
}

// useForm keeps a form's fields in one object.
function useForm(initial) {
  const [v, setV] = useState(initial);
  const set = (k) => (x) => setV((old) => ({ ...old, [k]: x }));
  return [v, set, setV];
}

// ---- pages

function Overview() {
  const [{ data, error }] = usePoll(() => api("GET", "stats"), 2000, []);
  const rules = (data && data.rules) || [];
  const nodes = (data && data.nodes) || [];
  const sum = rules.reduce((a, r) => ({ allowed: a.allowed + r.rate.allowed, soft: a.soft + r.rate.soft, denied: a.denied + r.rate.denied }), { allowed: 0, soft: 0, denied: 0 });
  const storesDown = nodes.filter((n) => !n.store_up).length;
  const breakersOpen = nodes.filter((n) => n.breaker && n.breaker !== "closed").length;
  return html`<section aria-labelledby="h-overview">
    <h2 id="h-overview">Overview</h2>
    <${ErrorBox} error=${error} />
    <div class="cards" aria-live="polite">
      <div class="card"><div class="muted">Allowed / s</div><div class="v ok" id="rate-allowed">${fmt(sum.allowed)}</div></div>
      <div class="card"><div class="muted">Soft / s</div><div class="v state-soft" id="rate-soft">${fmt(sum.soft)}</div></div>
      <div class="card"><div class="muted">Denied / s</div><div class="v bad" id="rate-denied">${fmt(sum.denied)}</div></div>
      <div class="card"><div class="muted">p99 decision latency</div><div class="v" id="p99">${data ? fmt(data.p99_ms, 3) + " ms" : "–"}</div></div>
      <div class="card"><div class="muted">Stores</div><div class=${"v " + (storesDown ? "bad" : "ok")} id="stores">${nodes.length ? (storesDown ? storesDown + " down" : "up") : "–"}</div></div>
      <div class="card"><div class="muted">Breakers</div><div class=${"v " + (breakersOpen ? "bad" : "ok")} id="breakers">${nodes.length ? (breakersOpen ? breakersOpen + " not closed" : "closed") : "–"}</div></div>
    </div>
    <table>
      <caption>Decisions per rule, live (per second over the last 10 s; totals since each node started)</caption>
      <thead><tr><th scope="col">Rule</th><th scope="col" class="num">Allowed/s</th><th scope="col" class="num">Soft/s</th><th scope="col" class="num">Denied/s</th><th scope="col" class="num">Allowed</th><th scope="col" class="num">Soft</th><th scope="col" class="num">Denied</th></tr></thead>
      <tbody>
        ${rules.length === 0 ? html`<tr><td colspan="7" class="muted">No decisions yet.</td></tr>` : ""}
        ${rules.map((r) => html`<tr data-rule=${r.rule}>
          <th scope="row">${shown(r.rule)}</th>
          <td class="num">${fmt(r.rate.allowed)}</td><td class="num">${fmt(r.rate.soft)}</td><td class="num">${fmt(r.rate.denied)}</td>
          <td class="num total-allowed">${fmt(r.total.allowed, 0)}</td><td class="num total-soft">${fmt(r.total.soft, 0)}</td><td class="num total-denied">${fmt(r.total.denied, 0)}</td>
        </tr>`)}
      </tbody>
    </table>
    <table>
      <caption>Stores and breakers per node</caption>
      <thead><tr><th scope="col">Node</th><th scope="col">Store</th><th scope="col">Breaker</th><th scope="col" class="num">p99</th><th scope="col" class="num">Decisions (10 s)</th><th scope="col">Reported</th></tr></thead>
      <tbody>${nodes.map((n) => html`<tr>
        <th scope="row">${n.node}</th>
        <td class=${n.store_up ? "ok" : "bad"}>${n.store} ${n.store_up ? "up" : "down"}</td>
        <td class=${!n.breaker || n.breaker === "closed" ? "ok" : "bad"}>${n.breaker || "none (in process)"}</td>
        <td class="num">${fmt(n.p99_ms, 3)} ms</td><td class="num">${fmt(n.decisions, 0)}</td><td>${when(n.at)}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}

function Top() {
  const [f, set] = useForm({ rule: "", limit: "10" });
  const [{ data, error }] = usePoll(() => api("GET", "top" + qs({ rule: f.rule, limit: f.limit })), 3000, [f.rule, f.limit]);
  const [stats] = usePoll(() => api("GET", "stats"), 0, []);
  const rules = ((stats.data && stats.data.rules) || []).map((r) => [r.rule, r.rule]);
  return html`<section aria-labelledby="h-top">
    <h2 id="h-top">Top consumers</h2>
    <p class="muted">Per rule, the callers with the most decisions over the last one to two minutes, merged across the fleet from each node's bounded sketch. A count is at most its true value, and at least count − error.</p>
    <form class="row" onSubmit=${(e) => e.preventDefault()}>
      <${Select} id="top-rule" label="Rule" value=${f.rule} onInput=${set("rule")} options=${[["", "Every rule"], ...rules]} />
      <${Field} id="top-limit" label="How many" type="number" min="1" max="100" value=${f.limit} onInput=${set("limit")} />
    </form>
    <${ErrorBox} error=${error} />
    ${((data && data.rules) || []).map((r) => html`<table data-rule=${r.rule}>
      <caption>${shown(r.rule)}</caption>
      <thead><tr><th scope="col">Tenant</th><th scope="col">Consumer</th><th scope="col" class="num">Decisions</th><th scope="col" class="num">± error</th></tr></thead>
      <tbody>${r.consumers.map((c) => html`<tr><td>${shown(c.tenant) || "–"}</td><td>${shown(c.consumer) || "(anonymous)"}</td><td class="num">${fmt(c.count, 0)}</td><td class="num">${fmt(c.error, 0)}</td></tr>`)}</tbody>
    </table>`)}
    ${data && data.rules.length === 0 ? html`<p class="muted">No decisions yet.</p>` : ""}
  </section>`;
}

function Bar({ r }) {
  const limit = Math.max(r.limit || 0, 1);
  const used = Math.min(1, Math.max(0, (limit - (r.remaining || 0)) / limit));
  return html`<div class=${"bar " + r.state} role="meter" aria-label=${"Used of " + r.rule} aria-valuemin="0" aria-valuemax=${limit} aria-valuenow=${limit - (r.remaining || 0)}>
    <span style=${{ width: (used * 100).toFixed(1) + "%" }}></span>
  </div>`;
}

function Caller() {
  const [f, set] = useForm({ tenant: "", user: "", api_key: "", ip: "", endpoint: "", method: "" });
  const [res, setRes] = useState({ data: null, error: null });
  const look = (e) => {
    e.preventDefault();
    api("GET", "usage" + qs(f)).then((data) => setRes({ data, error: null }), (error) => setRes({ data: null, error }));
  };
  const d = res.data;
  return html`<section aria-labelledby="h-caller">
    <h2 id="h-caller">Caller quota</h2>
    <p class="muted">Every limit that applies to these attributes, with what remains, without consuming anything.</p>
    <form class="row" onSubmit=${look}>
      ${["tenant", "user", "api_key", "ip", "endpoint", "method"].map((k) => html`<${Field} id=${"caller-" + k} label=${k} value=${f[k]} onInput=${set(k)} />`)}
      <button type="submit" class="primary">Look up</button>
    </form>
    <${ErrorBox} error=${res.error} />
    ${d && html`<div id="caller-result">
      <p>Decision: <strong class=${"state-" + d.state}>${d.allowed ? "allowed" : "denied"} (${d.state})</strong>${d.exempt ? " — exempt" : ""}${d.rule ? html` — deciding rule <code>${shown(d.rule)}</code>` : ""}</p>
      <table>
        <caption>Limits of this caller</caption>
        <thead><tr><th scope="col">Rule</th><th scope="col">Scope</th><th scope="col">Used</th><th scope="col" class="num">Remaining</th><th scope="col" class="num">Limit</th><th scope="col">Resets in</th><th scope="col">State</th></tr></thead>
        <tbody>${(d.results || []).map((r) => html`<tr data-rule=${r.rule}>
          <th scope="row">${shown(r.rule)}</th><td>${shown(r.scope)}${r.in_flight !== undefined ? html` <span class="muted in-flight">(${fmt(r.in_flight, 0)} in flight)</span>` : ""}</td><td><${Bar} r=${r} /></td>
          <td class="num remaining">${fmt(r.remaining, 0)}</td><td class="num">${fmt(r.limit, 0)}</td><td>${ms(r.reset_after_ms)}</td><td class=${"state-" + r.state}>${r.state}</td>
        </tr>`)}</tbody>
      </table>
    </div>`}
  </section>`;
}

function Chart({ points }) {
  const ref = useRef(null);
  useEffect(() => {
    if (!ref.current) return undefined;
    const xs = points.map((p) => Date.parse(p.at) / 1000);
    const data = [xs, points.map((p) => p.allowed), points.map((p) => p.soft), points.map((p) => p.denied)];
    if (xs.length === 1) {
      // One point alone makes uPlot spread the time axis over years: empty neighbours half an
      // hour either side keep it to the hour around the point.
      data[0] = [xs[0] - 1800, xs[0], xs[0] + 1800];
      for (let i = 1; i < data.length; i++) data[i] = [null, data[i][0], null];
    }
    const width = Math.max(320, Math.min(1100, ref.current.clientWidth || 900));
    const plot = new uPlot(
      {
        width,
        height: 280,
        series: [{}, { label: "allowed", stroke: "#1a7f37" }, { label: "soft", stroke: "#9a6700" }, { label: "denied", stroke: "#cf222e" }],
        axes: [{}, { label: "decisions" }],
      },
      data,
      ref.current,
    );
    return () => plot.destroy();
  }, [points]);
  return html`<div class="chart" ref=${ref} role="img" aria-label=${"Usage chart: " + points.length + " points of allowed, soft and denied decisions"}></div>`;
}

function History() {
  const [f, set] = useForm({ tenant: "", rule: "", step: "1m" });
  const [q, setQ] = useState(null);
  const [{ data, error }] = usePoll(() => (q ? api("GET", "usage/history" + qs(q)) : Promise.resolve(null)), q ? 10000 : 0, [q]);
  const points = (data && data.points) || [];
  const total = points.reduce((a, p) => ({ allowed: a.allowed + p.allowed, soft: a.soft + p.soft, denied: a.denied + p.denied }), { allowed: 0, soft: 0, denied: 0 });
  return html`<section aria-labelledby="h-history">
    <h2 id="h-history">Usage history</h2>
    <form class="row" onSubmit=${(e) => { e.preventDefault(); setQ({ ...f }); }}>
      <${Field} id="history-tenant" label="Tenant" value=${f.tenant} onInput=${set("tenant")} />
      <${Field} id="history-rule" label="Rule (optional)" value=${f.rule} onInput=${set("rule")} />
      <${Select} id="history-step" label="Step" value=${f.step} onInput=${set("step")} options=${[["1m", "per minute (last hour)"], ["1h", "per hour (last day)"], ["1d", "per day (last 30 days)"]]} />
      <button type="submit" class="primary">Show</button>
    </form>
    <${ErrorBox} error=${error} />
    ${q && html`<p id="history-summary">${points.length} points: ${fmt(total.allowed, 0)} allowed, ${fmt(total.soft, 0)} soft, ${fmt(total.denied, 0)} denied.</p>`}
    ${points.length > 0 && html`<${Chart} points=${points} />`}
  </section>`;
}

function Violations() {
  const [f, set] = useForm({ tenant: "", rule: "", user: "" });
  const [q, setQ] = useState({});
  const [{ data, error }] = usePoll(() => api("GET", "violations" + qs({ ...q, limit: 200 })), 5000, [q]);
  return html`<section aria-labelledby="h-violations">
    <h2 id="h-violations">Violations</h2>
    <form class="row" onSubmit=${(e) => { e.preventDefault(); setQ({ ...f }); }}>
      <${Field} id="violations-tenant" label="Tenant" value=${f.tenant} onInput=${set("tenant")} />
      <${Field} id="violations-user" label="User" value=${f.user} onInput=${set("user")} />
      <${Field} id="violations-rule" label="Rule" value=${f.rule} onInput=${set("rule")} />
      <button type="submit">Filter</button>
    </form>
    <${ErrorBox} error=${error} />
    <table>
      <caption>Denied (hard) and soft decisions per minute, newest first</caption>
      <thead><tr><th scope="col">Minute</th><th scope="col">Rule</th><th scope="col">Tenant</th><th scope="col">User</th><th scope="col">API key</th><th scope="col">IP</th><th scope="col">Endpoint</th><th scope="col">State</th><th scope="col" class="num">Count</th><th scope="col" class="num">Limit</th></tr></thead>
      <tbody>${((data && data.violations) || []).map((v) => html`<tr>
        <td>${when(v.at)}</td><td>${shown(v.rule)}</td><td>${shown(v.tenant)}</td><td>${shown(v.user)}</td><td><code>${shown(v.api_key)}</code></td><td>${shown(v.ip)}</td><td>${shown(v.endpoint)}</td>
        <td class=${"state-" + v.state}>${v.state}</td><td class="num">${fmt(v.count, 0)}</td><td class="num">${fmt(v.limit, 0)}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}

const target = (o) => ["tenant", "user", "api_key", "api_key_hash", "endpoint", "ip", "rule"].filter((k) => o[k]).map((k) => `${k}=${shown(o[k])}`).join(" ");

function Overrides() {
  const [{ data, error }, reload] = usePoll(() => apiList("overrides", "overrides"), 5000, []);
  const [ex, reloadEx] = usePoll(() => apiList("exemptions", "exemptions"), 5000, []);
  const [actError, setActError] = useState(null);
  const [done, setDone] = useState("");
  const [f, set, setF] = useForm({ tenant: "", user: "", api_key: "", api_key_hash: "", ip: "", endpoint: "", rule: "", type: "ban", value: "", limit: "", burst: "", ttl: "1h", reason: "" });
  const [e, setE] = useForm({ kind: "api_key", value: "", reason: "", ttl: "" });
  const act = (p, msg) => p.then(() => { setActError(null); setDone(msg); reload(); reloadEx(); }, (err) => { setActError(err); setDone(""); });

  const create = (ev) => {
    ev.preventDefault();
    const body = { type: f.type, ttl: f.ttl, reason: f.reason };
    for (const k of ["tenant", "user", "api_key", "api_key_hash", "ip", "endpoint", "rule"]) if (f[k]) body[k] = f[k];
    if (f.value !== "") body.value = Number(f.value);
    if (f.limit !== "") body.limit = Number(f.limit);
    if (f.burst !== "") body.burst = Number(f.burst);
    act(api("POST", "overrides", body), "Override created.");
  };
  // Extending is one PATCH of expires_at: the override changes in place, so the ban is never
  // lifted in between (a delete and a create would leave a gap if the second call failed).
  const extend = (o) => {
    const expires_at = new Date(Date.parse(o.expires_at) + 3600e3).toISOString().replace(/\.\d+Z$/, "Z");
    act(api("PATCH", "overrides/" + o.id, JSON.stringify({ expires_at }), "application/merge-patch+json"), "Override extended by an hour.");
  };
  const createEx = (ev) => {
    ev.preventDefault();
    const body = { [e.kind]: e.value, reason: e.reason };
    if (e.ttl) {
      const m = /^(\d+)([mhd])$/.exec(e.ttl);
      if (!m) { setActError(new APIError(400, { error: "ttl: give minutes, hours or days such as 30m, 2h, 7d", field: "ttl" })); return; }
      body.expires_at = new Date(Date.now() + Number(m[1]) * { m: 60e3, h: 3600e3, d: 86400e3 }[m[2]]).toISOString().replace(/\.\d+Z$/, "Z");
    }
    act(api("POST", "exemptions", body), "Exemption created.");
  };
  const overrides = (data && data.overrides) || [];
  const exemptions = (ex.data && ex.data.exemptions) || [];
  return html`<section aria-labelledby="h-overrides">
    <h2 id="h-overrides">Overrides and exemptions</h2>
    <${ErrorBox} error=${error || ex.error} />
    <${ErrorBox} error=${actError} />
    <p role="status" class="ok">${done}</p>
    <h3 id="h-new-override">New override</h3>
    <form class="row" aria-labelledby="h-new-override" onSubmit=${create}>
      <${Field} id="ov-tenant" label="Tenant" value=${f.tenant} onInput=${set("tenant")} />
      <${Field} id="ov-user" label="User" value=${f.user} onInput=${set("user")} />
      <${Field} id="ov-api_key" label="API key" value=${f.api_key} onInput=${set("api_key")} />
      <${Field} id="ov-api_key_hash" label="API key hash (#…, as violations show it)" value=${f.api_key_hash} onInput=${set("api_key_hash")} />
      <${Field} id="ov-ip" label="IP or CIDR (alone)" value=${f.ip} onInput=${set("ip")} />
      <${Field} id="ov-endpoint" label="Endpoint" value=${f.endpoint} onInput=${set("endpoint")} />
      <${Field} id="ov-rule" label="Rule (optional)" value=${f.rule} onInput=${set("rule")} />
      <${Select} id="ov-type" label="Type" value=${f.type} onInput=${set("type")} options=${[["ban", "ban"], ["multiplier", "multiplier"], ["custom", "custom"], ["warn", "warn"]]} />
      ${f.type === "multiplier" && html`<${Field} id="ov-value" label="Multiplier" value=${f.value} onInput=${set("value")} />`}
      ${f.type === "custom" && html`<${Field} id="ov-limit" label="Limit" value=${f.limit} onInput=${set("limit")} />`}
      ${f.type === "custom" && html`<${Field} id="ov-burst" label="Burst" value=${f.burst} onInput=${set("burst")} />`}
      <${Field} id="ov-ttl" label="Lasts (ttl)" value=${f.ttl} onInput=${set("ttl")} />
      <${Field} id="ov-reason" label="Reason" value=${f.reason} onInput=${set("reason")} />
      <button type="submit" class="primary">Create override</button>
    </form>
    <table id="overrides">
      <caption>Active overrides</caption>
      <thead><tr><th scope="col">Id</th><th scope="col">Target</th><th scope="col">Type</th><th scope="col">Value</th><th scope="col">Expires</th><th scope="col">Source</th><th scope="col">Reason</th><th scope="col">Actions</th></tr></thead>
      <tbody>${overrides.map((o) => html`<tr data-id=${o.id}>
        <td>${o.id}</td><td>${target(o)}</td><td>${o.type}</td><td>${o.type === "multiplier" ? o.value : o.type === "custom" ? `${o.limit}/${o.burst || o.limit}` : ""}</td>
        <td>${when(o.expires_at)}</td><td>${o.source}</td><td>${shown(o.reason)}</td>
        <td>${o.source === "file" ? html`<span class="muted">in a policy file</span>` : html`
          <button type="button" onClick=${() => extend(o)} aria-label=${"Extend override " + o.id + " by an hour"}>Extend 1h</button>
          <button type="button" class="danger" onClick=${() => act(api("DELETE", "overrides/" + o.id), "Override deleted.")} aria-label=${"Delete override " + o.id}>Delete</button>`}</td>
      </tr>`)}</tbody>
    </table>
    <h3 id="h-new-exemption">New exemption</h3>
    <form class="row" aria-labelledby="h-new-exemption" onSubmit=${createEx}>
      <${Select} id="ex-kind" label="Caller kind" value=${e.kind} onInput=${setE("kind")} options=${[["api_key", "API key"], ["user", "user"], ["tenant", "tenant"], ["ip", "IP or CIDR"]]} />
      <${Field} id="ex-value" label="Caller" value=${e.value} onInput=${setE("value")} />
      <${Field} id="ex-reason" label="Reason" value=${e.reason} onInput=${setE("reason")} />
      <${Field} id="ex-ttl" label="Lasts (empty: no end)" value=${e.ttl} onInput=${setE("ttl")} />
      <button type="submit" class="primary">Create exemption</button>
    </form>
    <table id="exemptions">
      <caption>Exemptions</caption>
      <thead><tr><th scope="col">Id</th><th scope="col">Caller</th><th scope="col">Expires</th><th scope="col">Source</th><th scope="col">Reason</th><th scope="col">Actions</th></tr></thead>
      <tbody>${exemptions.map((x) => html`<tr data-id=${x.id}>
        <td>${x.id}</td><td>${target(x)}</td><td>${x.expires_at ? when(x.expires_at) : "never"}</td><td>${x.source}</td><td>${shown(x.reason)}</td>
        <td>${x.source === "file" ? html`<span class="muted">in a policy file</span>` : html`<button type="button" class="danger" onClick=${() => act(api("DELETE", "exemptions/" + x.id), "Exemption deleted.")} aria-label=${"Delete exemption " + x.id}>Delete</button>`}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}

// The members of a domain answer that are not its configuration.
const DOMAIN_READ_ONLY = ["source", "created_at", "updated_at", "updated_by", "policy_version"];

function Domains() {
  const [{ data, error }, reload] = usePoll(() => apiList("domains", "domains"), 5000, []);
  const [actError, setActError] = useState(null);
  const [done, setDone] = useState("");
  const [f, set, setF] = useForm({ domain: "", config: "" });
  const act = (p, msg) => p.then(() => { setActError(null); setDone(msg); reload(); }, (err) => { setActError(err); setDone(""); });
  // The configuration goes as the operator wrote it: JSON as JSON, anything else (a YAML flow
  // mapping, which starts with { too, included) as the YAML of a file, which the server
  // validates exactly as a file of --config.
  const save = (ev) => {
    ev.preventDefault();
    let json = true;
    try {
      JSON.parse(f.config);
    } catch (e) {
      json = false;
    }
    act(api("PUT", "domains/" + encodeURIComponent(f.domain), f.config, json ? "application/json" : "application/yaml"), "Domain " + shown(f.domain) + " saved.");
  };
  const edit = (d) => {
    const config = {};
    for (const [k, v] of Object.entries(d)) if (!DOMAIN_READ_ONLY.includes(k)) config[k] = v;
    setF({ domain: d.domain, config: JSON.stringify(config, null, 2) });
    setDone("");
    document.getElementById("dom-config").focus();
  };
  const domains = (data && data.domains) || [];
  return html`<section aria-labelledby="h-domains">
    <h2 id="h-domains">Envoy domains</h2>
    <p class="muted">Domains in the format of Envoy's reference rate limit service. Those of the policy files are read-only here; the others are enforced by every node within a second of a change.</p>
    <${ErrorBox} error=${error} />
    <${ErrorBox} error=${actError} />
    <p role="status" class="ok">${done}</p>
    <table id="domains">
      <caption>Domains, the files' then the API's</caption>
      <thead><tr><th scope="col">Domain</th><th scope="col">Source</th><th scope="col" class="num">Descriptors</th><th scope="col">Updated by</th><th scope="col">Updated</th><th scope="col">Actions</th></tr></thead>
      <tbody>
        ${domains.length === 0 ? html`<tr><td colspan="6" class="muted">No domains.</td></tr>` : ""}
        ${domains.map((d) => html`<tr data-domain=${d.domain} data-source=${d.source}>
          <th scope="row">${shown(d.domain)}</th><td>${d.source}</td><td class="num">${fmt((d.descriptors || []).length, 0)}</td>
          <td>${shown(d.updated_by) || "–"}</td><td>${when(d.updated_at)}</td>
          <td>${d.source === "file" ? html`<span class="muted">in a policy file</span>` : html`
            <button type="button" onClick=${() => edit(d)} aria-label=${"Edit domain " + shown(d.domain)}>Edit</button>
            <button type="button" class="danger" onClick=${() => act(api("DELETE", "domains/" + encodeURIComponent(d.domain)), "Domain " + shown(d.domain) + " deleted.")} aria-label=${"Delete domain " + shown(d.domain)}>Delete</button>`}</td>
        </tr>`)}
      </tbody>
    </table>
    <h3 id="h-put-domain">Create or replace a domain</h3>
    <form class="stack" aria-labelledby="h-put-domain" onSubmit=${save}>
      <${Field} id="dom-name" label="Domain" value=${f.domain} onInput=${set("domain")} required />
      <label for="dom-config">Configuration, YAML or JSON (domain, descriptors, on_store_error)
        <textarea id="dom-config" name="dom-config" rows="14" spellcheck="false" required value=${f.config} onInput=${(e) => set("config")(e.currentTarget.value)}
          placeholder=${"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}"}></textarea>
      </label>
      <button type="submit" class="primary">Save domain</button>
    </form>
  </section>`;
}

function Audit() {
  const [f, set] = useForm({ kind: "", actor: "" });
  const [q, setQ] = useState({});
  const [{ data, error }] = usePoll(() => api("GET", "audit" + qs({ ...q, limit: 200 })), 5000, [q]);
  return html`<section aria-labelledby="h-audit">
    <h2 id="h-audit">Audit</h2>
    <form class="row" onSubmit=${(e) => { e.preventDefault(); setQ({ ...f }); }}>
      <${Select} id="audit-kind" label="Kind" value=${f.kind} onInput=${set("kind")} options=${[["", "any"], ...["rule", "override", "exemption", "identity", "domain", "token", "policy_files", "penalty"].map((k) => [k, k])]} />
      <${Field} id="audit-actor" label="Actor" value=${f.actor} onInput=${set("actor")} />
      <button type="submit">Filter</button>
    </form>
    <${ErrorBox} error=${error} />
    <table id="audit">
      <caption>Changes, newest first</caption>
      <thead><tr><th scope="col">At</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Kind</th><th scope="col">Target</th><th scope="col">Reason</th></tr></thead>
      <tbody>${((data && data.events) || []).map((ev) => html`<tr data-kind=${ev.kind} data-action=${ev.action}>
        <td>${when(ev.at)}</td><td>${shown(ev.actor)}</td><td>${ev.action}</td><td>${ev.kind}</td><td>${shown(ev.target)}</td><td>${shown(ev.reason)}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}

function Nodes() {
  const [{ data, error }] = usePoll(() => api("GET", "nodes"), 3000, []);
  const [stats] = usePoll(() => api("GET", "stats"), 3000, []);
  const health = {};
  for (const n of (stats.data && stats.data.nodes) || []) health[n.node] = n;
  const nodes = (data && data.nodes) || [];
  const versions = new Set(nodes.map((n) => n.policy_version));
  return html`<section aria-labelledby="h-nodes">
    <h2 id="h-nodes">Nodes</h2>
    <${ErrorBox} error=${error} />
    <p>${nodes.length} live node${nodes.length === 1 ? "" : "s"}; ${versions.size <= 1 ? html`<span class="ok">all enforce the same policy</span>` : html`<span class="bad">${versions.size} policy versions in force</span>`}.</p>
    <table id="nodes">
      <caption>Live nodes and the policy version each enforces</caption>
      <thead><tr><th scope="col">Node</th><th scope="col">Address</th><th scope="col">Policy version</th><th scope="col">Store</th><th scope="col">Breaker</th><th scope="col" class="num">p99</th><th scope="col">Last heartbeat</th></tr></thead>
      <tbody>${nodes.map((n) => {
        const s = health[n.id];
        return html`<tr><th scope="row">${n.id}</th><td>${n.addr}</td><td><code>${n.policy_version}</code></td>
          <td>${s ? html`<span class=${s.store_up ? "ok" : "bad"}>${s.store} ${s.store_up ? "up" : "down"}</span>` : "–"}</td>
          <td>${s ? s.breaker || "none" : "–"}</td><td class="num">${s ? fmt(s.p99_ms, 3) + " ms" : "–"}</td><td>${when(n.seen_at)}</td></tr>`;
      })}</tbody>
    </table>
  </section>`;
}

// ---- shell

// Tokens lists the admin tokens (an admin token's page): each one's role, expiry and last
// use; a new token's secret is shown once, right after it is created, and never again.
function Tokens() {
  const [{ data, error }, reload] = usePoll(() => apiList("tokens", "tokens"), 10000, []);
  const [actError, setActError] = useState(null);
  const [done, setDone] = useState("");
  const [secret, setSecret] = useState(null);
  const [f, set, setF] = useForm({ name: "", role: "read", ttl: "90d" });
  const act = (p, msg) => p.then((res) => { setActError(null); setDone(msg); reload(); return res; }, (err) => { setActError(err); setDone(""); return null; });
  const create = (ev) => {
    ev.preventDefault();
    const body = { name: f.name, role: f.role };
    if (f.ttl) body.ttl = f.ttl;
    setSecret(null);
    act(api("POST", "tokens", body), "Token " + shown(f.name) + " created.").then((res) => {
      if (res && res.token) {
        setSecret({ name: res.name, token: res.token });
        setF({ name: "", role: f.role, ttl: f.ttl });
      }
    });
  };
  const revoke = (t) => {
    setSecret(null);
    act(api("DELETE", "tokens/" + encodeURIComponent(t.name)), "Token " + shown(t.name) + " revoked.");
  };
  const now = Date.now();
  const tokens = (data && data.tokens) || [];
  return html`<section aria-labelledby="h-tokens">
    <h2 id="h-tokens">Admin tokens</h2>
    <p class="muted">Tokens of the admin API and this dashboard. Only an admin token sees this page. A secret is shown once, when its token is created.</p>
    <${ErrorBox} error=${error} />
    <${ErrorBox} error=${actError} />
    <p role="status" class="ok">${done}</p>
    ${secret && html`<div class="secret" id="token-secret" role="alert">
      <p>The secret of <strong>${shown(secret.name)}</strong>, shown this once: copy it now.</p>
      <code id="token-secret-value">${secret.token}</code>
      <button type="button" onClick=${() => setSecret(null)}>I have copied it</button>
    </div>`}
    <table id="tokens">
      <caption>Tokens, by name</caption>
      <thead><tr><th scope="col">Name</th><th scope="col">Role</th><th scope="col">Created by</th><th scope="col">Created</th><th scope="col">Expires</th><th scope="col">Last used</th><th scope="col">Actions</th></tr></thead>
      <tbody>
        ${tokens.length === 0 ? html`<tr><td colspan="7" class="muted">No tokens.</td></tr>` : ""}
        ${tokens.map((t) => html`<tr data-name=${t.name}>
          <th scope="row">${shown(t.name)}</th><td>${t.role}</td><td>${shown(t.created_by) || "–"}</td><td>${when(t.created_at)}</td>
          <td class=${t.expires_at && Date.parse(t.expires_at) <= now ? "expired" : ""}>${t.expires_at ? when(t.expires_at) + (Date.parse(t.expires_at) <= now ? " (expired)" : "") : "never"}</td>
          <td>${t.last_used_at ? when(t.last_used_at) : "never"}</td>
          <td><button type="button" class="danger" onClick=${() => revoke(t)} aria-label=${"Revoke token " + shown(t.name)}>Revoke</button></td>
        </tr>`)}
      </tbody>
    </table>
    <h3 id="h-new-token">New token</h3>
    <form class="row" aria-labelledby="h-new-token" onSubmit=${create}>
      <${Field} id="tok-name" label="Name" value=${f.name} onInput=${set("name")} required />
      <${Select} id="tok-role" label="Role" value=${f.role} onInput=${set("role")} options=${[["read", "read"], ["write", "write"], ["admin", "admin"]]} />
      <${Field} id="tok-ttl" label="Lasts (ttl; empty: no end)" value=${f.ttl} onInput=${set("ttl")} />
      <button type="submit" class="primary">Create token</button>
    </form>
  </section>`;
}

const PAGES = [
  ["overview", "Overview", Overview],
  ["top", "Top consumers", Top],
  ["caller", "Caller quota", Caller],
  ["history", "Usage history", History],
  ["violations", "Violations", Violations],
  ["overrides", "Overrides & exemptions", Overrides],
  ["domains", "Envoy domains", Domains],
  ["audit", "Audit", Audit],
  ["nodes", "Nodes", Nodes],
  ["tokens", "Tokens", Tokens],
];

function SignIn({ onDone }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState(null);
  const submit = (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.trim());
    api("GET", "stats").then(() => onDone(), (err) => {
      sessionStorage.removeItem(TOKEN_KEY);
      setError(err.status === 401 ? new Error("That token is not valid.") : err);
    });
  };
  return html`<main class="signin" id="main">
    <h1>Sluice dashboard</h1>
    <p class="muted">Sign in with an admin API token (a read token shows everything; changes need a write token). It is kept in this tab's session storage only.</p>
    <form onSubmit=${submit}>
      <label for="token">Admin token<input id="token" name="token" type="password" autocomplete="off" required value=${token} onInput=${(e) => setToken(e.currentTarget.value)} /></label>
      <${ErrorBox} error=${error} />
      <button type="submit" class="primary">Sign in</button>
    </form>
  </main>`;
}

function route() {
  const id = (location.hash || "").replace(/^#\/?/, "");
  return PAGES.find((p) => p[0] === id) || PAGES[0];
}

function App() {
  const [signedIn, setSignedIn] = useState(!!sessionStorage.getItem(TOKEN_KEY));
  const [page, setPage] = useState(route());
  useEffect(() => {
    const onHash = () => setPage(route());
    const onOut = () => setSignedIn(false);
    window.addEventListener("hashchange", onHash);
    window.addEventListener("sluice-signed-out", onOut);
    return () => { window.removeEventListener("hashchange", onHash); window.removeEventListener("sluice-signed-out", onOut); };
  }, []);
  useEffect(() => { document.title = page[1] + " · Sluice"; }, [page]);
  if (!signedIn) return html`<${SignIn} onDone=${() => setSignedIn(true)} />`;
  const Page = page[2];
  return html`<a class="skip" href="#main" onClick=${(e) => { e.preventDefault(); document.getElementById("main").focus(); }}>Skip to content</a>
    <header>
      <h1>Sluice</h1>
      <nav aria-label="Pages"><ul>${PAGES.map((p) => html`<li><a href=${"#/" + p[0]} aria-current=${p === page ? "page" : undefined}>${p[1]}</a></li>`)}</ul></nav>
      <button type="button" onClick=${() => { sessionStorage.removeItem(TOKEN_KEY); setSignedIn(false); }}>Sign out</button>
    </header>
    <main id="main" tabindex="-1"><${Page} key=${page[0]} /></main>`;
}

// The placeholder shown without JavaScript goes first: render keeps the nodes it did not make.
const root = document.getElementById("app");
root.replaceChildren();
render(html`<${App} />`, root);
