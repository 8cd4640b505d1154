// Switchyard server dashboard: plain ES module, public management API only.
// Session: the HttpOnly cookie of POST /api/v1/login. CSRF: the X-CSRF-Token header value of
// cookie-authenticated responses, held in memory only and sent on every state change.

const $ = (sel) => document.querySelector(sel);
let csrf = null;
let ws = null;
let wsPing = null;
let signedIn = false;
let current = 'overview';

/** Builds an element; children are nodes or text (never parsed as HTML). */
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ''));
  return e;
}

function fill(tbody, rows, empty, cols) {
  tbody.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: String(cols), class: 'muted' }, empty))]));
}

const bytes = (n) => {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0; let v = Number(n) || 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${u[i]}`;
};
const when = (t) => (t ? new Date(t).toLocaleTimeString() : '');
const commaList = (text) => text.split(',').map((d) => d.trim()).filter(Boolean);

function showError(msg) { const e = $('#error'); e.textContent = msg; e.hidden = !msg; if (msg) $('#flash').hidden = true; }
function flash(msg) { const f = $('#flash'); f.textContent = msg; f.hidden = false; $('#error').hidden = true; }

class Unauthorized extends Error {}

/** One API call: {status, ok, data}. A 401 returns to the sign-in view. */
async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (csrf && method !== 'GET') headers['X-CSRF-Token'] = csrf;
  const r = await fetch(path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const token = r.headers.get('X-CSRF-Token');
  if (token) csrf = token;
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (r.status === 401 && path !== '/api/v1/login') { signedOut(); throw new Unauthorized(); }
  return { status: r.status, ok: r.ok, data };
}

const message = (res) => res.data?.message || `HTTP ${res.status}`;

/** Runs an action, showing its failure in the error banner. */
async function guarded(fn) {
  try { await fn(); } catch (e) { if (!(e instanceof Unauthorized)) showError(`Request failed: ${e.message}`); }
}

// ---- sign-in ---------------------------------------------------------------------------

function signedOut() {
  signedIn = false; csrf = null;
  closeWs();
  syncMeshStreams([]);
  $('#app').hidden = true; $('#signout').hidden = true; $('#ws-state').hidden = true;
  $('#signin').hidden = false;
  $('#signin-token').focus();
}

async function enter() {
  signedIn = true;
  $('#signin').hidden = true; $('#app').hidden = false;
  // Cookie-authenticated answers carry a CSRF token; without one the API has no token
  // configured (open, e.g. on loopback): there is nothing to sign out of.
  $('#signout').hidden = !csrf; $('#ws-state').hidden = false;
  $('#open-api').hidden = !!csrf;
  openWs();
  show(current);
}

$('#signin-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  guarded(async () => {
    const res = await api('POST', '/api/v1/login', { token: $('#signin-token').value });
    if (!res.ok) { showError(`Sign-in failed: ${message(res)}`); return; }
    $('#signin-token').value = '';
    showError('');
    // The first cookie-authenticated answer carries the CSRF token.
    const status = await api('GET', '/api/v1/status');
    if (status.ok) { flash('Signed in.'); await enter(); }
  });
});

$('#signout').addEventListener('click', () => guarded(async () => {
  await api('POST', '/api/v1/logout');
  signedOut();
  flash('Signed out.');
}));

// ---- panels ----------------------------------------------------------------------------

const panels = {
  overview: loadOverview, backends: loadBackends, routes: loadRoutes, requests: loadRequests,
  cache: loadCache, config: loadConfig, auth: loadAuth, mesh: loadMesh,
};

function show(name) {
  if (current !== name) $('#flash').hidden = true;
  current = name;
  for (const b of document.querySelectorAll('nav button')) {
    if (b.dataset.panel === name) b.setAttribute('aria-current', 'page'); else b.removeAttribute('aria-current');
  }
  for (const p of document.querySelectorAll('.panel')) p.hidden = p.id !== `panel-${name}`;
  guarded(panels[name]);
}

for (const b of document.querySelectorAll('nav button')) b.addEventListener('click', () => show(b.dataset.panel));

function statList(dl, pairs) {
  dl.replaceChildren(...pairs.map(([k, v]) => el('div', {}, el('dt', {}, k), el('dd', {}, v))));
}

// ---- overview and live events ------------------------------------------------------------

function renderStats(s) {
  statList($('#stats'), [
    ['Active connections', s.active_connections], ['Total connections', s.total_connections],
    ['Sent', bytes(s.bytes_sent)], ['Received', bytes(s.bytes_received)],
    ...(s.backends ? [['Healthy backends', `${s.backends.healthy} / ${s.backends.total}`]] : []),
  ]);
}

async function loadOverview() {
  const [stats, conns] = await Promise.all([api('GET', '/api/v1/stats'), api('GET', '/api/v1/connections')]);
  if (stats.ok) renderStats(stats.data);
  if (conns.ok) {
    $('#connections-count').textContent = `(${conns.data.count})`;
    fill($('#connections tbody'), conns.data.connections.map((c) => el('tr', {},
      el('td', {}, c.protocol), el('td', { class: 'url' }, c.host), el('td', {}, c.backend),
      el('td', {}, `${c.client_ip}:${c.client_port}`), el('td', {}, when(c.start_time)),
      el('td', {}, bytes(c.bytes_sent)), el('td', {}, bytes(c.bytes_recv)))), 'No live connections.', 7);
  }
}

let refreshTimer = null;
/** Coalesces bursts of events into one refresh of the visible panel. */
function refreshSoon(panel) {
  if (current !== panel || refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; if (signedIn && current === panel) guarded(panels[panel]); }, 150);
}

function logEvent(ev) {
  const d = ev.data || {};
  const text = {
    'connection.new': () => `${d.protocol} ${d.host} via ${d.backend} from ${d.client_ip}`,
    'connection.close': () => `closed ${d.protocol} ${d.host}`,
    'backend.health': () => `backend ${d.name} is ${d.healthy ? 'healthy' : 'unhealthy'}`,
    'config.reload': () => `config reloaded: ${(d.changed_sections || []).join(', ') || 'no changes'}`,
    'config.saved': () => `config saved: ${(d.changed_sections || []).join(', ') || 'no changes'}`,
    'stats.update': () => null,
  }[ev.type];
  const line = text ? text() : JSON.stringify(d);
  if (line === null) return;
  const list = $('#events');
  list.prepend(el('li', {}, `${when(ev.timestamp)} ${ev.type}: ${line}`));
  while (list.children.length > 50) list.lastChild.remove();
}

function setWsState(on) {
  const b = $('#ws-state');
  b.textContent = on ? 'live: on' : 'live: off';
  b.classList.toggle('on', on);
}

function openWs() {
  closeWs();
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const sock = new WebSocket(`${proto}://${location.host}/api/v1/ws`);
  ws = sock;
  sock.addEventListener('open', () => {
    setWsState(true);
    // The server closes silent clients; `ping` keeps the session alive.
    wsPing = setInterval(() => sock.readyState === 1 && sock.send('ping'), 25000);
    refreshSoon(current);
  });
  sock.addEventListener('message', (m) => {
    if (m.data === 'pong') return;
    let ev;
    try { ev = JSON.parse(m.data); } catch { return; }
    logEvent(ev);
    if (ev.type === 'stats.update' && current === 'overview') renderStats(ev.data);
    if (ev.type.startsWith('connection.')) refreshSoon('overview');
    if (ev.type === 'backend.health') refreshSoon('backends');
  });
  sock.addEventListener('close', () => {
    clearInterval(wsPing); setWsState(false);
    // Reconnect while the session lasts (a 401 here returns to the sign-in view).
    if (signedIn && ws === sock) {
      setTimeout(() => guarded(async () => {
        if (!signedIn || ws !== sock) return;
        const res = await api('GET', '/api/v1/status');
        if (res.ok && signedIn && ws === sock) openWs();
      }), 2000);
    }
  });
}

function closeWs() {
  clearInterval(wsPing);
  if (ws) { const s = ws; ws = null; s.close(); }
  setWsState(false);
}

// ---- backends --------------------------------------------------------------------------

async function loadBackends() {
  const res = await api('GET', '/api/v1/backends');
  if (!res.ok) { showError(message(res)); return; }
  const details = await Promise.all(res.data.map((b) =>
    api('GET', `/api/v1/backends/${encodeURIComponent(b.name)}/stats`).then((r) => (r.ok ? r.data : null))));
  fill($('#backends tbody'), res.data.map((b, i) => {
    const d = details[i];
    const result = el('span', { class: 'test-result', 'data-backend': b.name });
    const button = el('button', { type: 'button', class: 'test', 'data-backend': b.name,
      onclick: () => testBackend(b.name, result) }, 'Test');
    return el('tr', { 'data-backend': b.name },
      el('td', {}, b.name), el('td', {}, b.type),
      el('td', { class: b.healthy ? 'ok' : 'bad' }, b.healthy ? 'healthy' : 'unhealthy'),
      el('td', {}, b.stats.active_connections), el('td', {}, b.stats.total_connections),
      el('td', {}, d ? d.errors : ''), el('td', {}, d ? `${d.latency_ms} ms` : ''),
      el('td', {}, bytes(b.stats.bytes_sent)), el('td', {}, bytes(b.stats.bytes_received)),
      el('td', {}, button, ' ', result));
  }), 'No backends.', 10);
}

async function testBackend(name, out) {
  out.textContent = 'testing…';
  out.className = 'test-result muted';
  await guarded(async () => {
    const res = await api('POST', `/api/v1/backends/${encodeURIComponent(name)}/test`, {});
    if (!res.ok) { out.textContent = message(res); out.className = 'test-result bad'; return; }
    const r = res.data;
    out.textContent = `${r.status} → ${r.target} in ${r.duration}${r.error ? `: ${r.error}` : ''}`;
    out.className = `test-result ${r.status === 'ok' ? 'ok' : 'bad'}`;
  });
}

// ---- routes ----------------------------------------------------------------------------

async function loadRoutes() {
  const [routes, backends] = await Promise.all([api('GET', '/api/v1/routes'), api('GET', '/api/v1/backends')]);
  if (backends.ok) {
    const sel = $('#route-backend');
    const keep = sel.value;
    sel.replaceChildren(...backends.data.map((b) => el('option', { value: b.name }, b.name)));
    if (keep) sel.value = keep;
  }
  if (!routes.ok) { showError(message(routes)); return; }
  fill($('#routes tbody'), routes.data.map((r) => el('tr', { 'data-route': r.name },
    el('td', {}, r.name), el('td', { class: 'url' }, r.domains.join(', ')),
    el('td', {}, r.backend ?? (r.backends || []).join(', ')), el('td', {}, r.priority),
    el('td', {}, r.enabled ? 'yes' : 'no'),
    el('td', {}, el('button', { type: 'button', class: 'delete', 'aria-label': `Delete route ${r.name}`,
      onclick: () => deleteRoute(r.name) }, 'Delete')))), 'No routes.', 6);
}

$('#route-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  guarded(async () => {
    const body = {
      name: $('#route-name').value.trim(),
      domains: commaList($('#route-domains').value),
      backend: $('#route-backend').value,
      priority: Number($('#route-priority').value) || 0,
    };
    const res = await api('POST', '/api/v1/routes', body);
    if (!res.ok) { showError(`Route not created: ${message(res)}`); return; }
    flash(`Route ${res.data.route} created.`);
    $('#route-name').value = ''; $('#route-domains').value = '';
    await loadRoutes();
  });
});

async function deleteRoute(name) {
  await guarded(async () => {
    const res = await api('DELETE', `/api/v1/routes/${encodeURIComponent(name)}`);
    if (!res.ok) { showError(`Route not deleted: ${message(res)}`); return; }
    flash(`Route ${name} deleted.`);
    await loadRoutes();
  });
}

// ---- request log -----------------------------------------------------------------------

async function loadRequests() {
  const [list, stats] = await Promise.all([api('GET', '/api/v1/requests?limit=500'), api('GET', '/api/v1/requests/stats')]);
  if (stats.ok) {
    const s = stats.data;
    statList($('#request-stats'), [
      ['Logging', s.enabled ? 'on' : 'off'], ['Kept', `${s.count} / ${s.max_size}`],
      ['Total requests', s.total_requests], ['Sent', bytes(s.total_bytes_sent)], ['Received', bytes(s.total_bytes_recv)],
      ['Top host', s.top_hosts[0] ? `${s.top_hosts[0].host} (${s.top_hosts[0].count})` : '—'],
    ]);
  }
  if (!list.ok) { showError(message(list)); return; }
  const host = $('#filter-host').value.trim().toLowerCase();
  const method = $('#filter-method').value;
  const status = $('#filter-status').value;
  const rows = list.data.requests.filter((r) => (!host || r.host.toLowerCase().includes(host))
    && (!method || r.method === method)
    && (!status || (status === '0' ? (r.error || r.status_code === 0) : String(r.status_code).startsWith(status))));
  fill($('#requests tbody'), rows.map((r) => el('tr', {},
    el('td', {}, when(r.timestamp)), el('td', {}, r.protocol), el('td', {}, r.method),
    el('td', { class: 'url' }, r.url || `${r.host}${r.path}`), el('td', {}, r.status_code || ''),
    el('td', {}, r.backend), el('td', {}, r.client_ip), el('td', {}, `${r.duration_ms} ms`),
    el('td', { class: r.error ? 'bad' : '' }, r.error))),
  list.data.enabled ? 'No requests match.' : 'The request log is off (api.enable_request_log).', 9);
}

$('#request-filters').addEventListener('submit', (ev) => { ev.preventDefault(); guarded(loadRequests); });
for (const id of ['#filter-method', '#filter-status']) $(id).addEventListener('change', () => guarded(loadRequests));
$('#requests-clear').addEventListener('click', () => guarded(async () => {
  const res = await api('DELETE', '/api/v1/requests');
  if (res.ok) flash(message(res)); else showError(message(res));
  await loadRequests();
}));

// ---- cache -----------------------------------------------------------------------------

async function loadCache() {
  const [stats, presets, rules, entries] = await Promise.all([
    api('GET', '/api/v1/cache/stats'), api('GET', '/api/v1/cache/presets'),
    api('GET', '/api/v1/cache/rules'), api('GET', '/api/v1/cache/entries?limit=100'),
  ]);
  if (stats.ok) {
    const s = stats.data;
    statList($('#cache-stats'), [
      ['Cache', s.enabled ? `on (${s.storage_type})` : 'off'], ['Hit rate', `${(s.hit_rate * 100).toFixed(1)} %`],
      ['Hits / misses', `${s.cache_hits} / ${s.cache_misses}`],
      ['Memory', `${s.memory.entries} · ${bytes(s.memory.size_bytes)}`], ['Disk', `${s.disk.entries} · ${bytes(s.disk.size_bytes)}`],
      ['Evictions', s.evictions], ['Store errors', s.store_errors],
    ]);
  }
  if (presets.ok) {
    fill($('#cache-presets tbody'), presets.data.presets.map((p) => el('tr', { 'data-preset': p.name },
      el('td', {}, p.name), el('td', {}, p.description), el('td', {}, p.ttl), el('td', {}, p.enabled ? 'yes' : 'no'),
      el('td', {}, el('button', { type: 'button', onclick: () => cacheAction('POST', `/api/v1/cache/presets/${encodeURIComponent(p.name)}/${p.enabled ? 'disable' : 'enable'}`) },
        p.enabled ? 'Disable' : 'Enable')))), 'No presets.', 5);
  }
  if (rules.ok) {
    fill($('#cache-rules tbody'), rules.data.rules.map((r) => el('tr', { 'data-rule': r.name },
      el('td', {}, r.name), el('td', { class: 'url' }, r.domains.join(', ')), el('td', {}, r.ttl), el('td', {}, r.priority),
      el('td', {}, r.enabled ? 'yes' : 'no'),
      el('td', {}, el('button', { type: 'button', onclick: () => cacheAction('DELETE', `/api/v1/cache/rules/${encodeURIComponent(r.name)}`) }, 'Delete')))),
    'No rules.', 6);
  }
  if (entries.ok) {
    fill($('#cache-entries tbody'), entries.data.entries.map((e) => el('tr', {},
      el('td', { class: 'url' }, e.url), el('td', {}, e.content_type), el('td', {}, bytes(e.size)), el('td', {}, e.tier),
      el('td', {}, when(e.expires_at)),
      el('td', {}, el('button', { type: 'button', onclick: () => cacheAction('DELETE', `/api/v1/cache/entries/${encodeURIComponent(e.key)}`) }, 'Delete')))),
    'No cached entries.', 6);
  }
}

async function cacheAction(method, path) {
  await guarded(async () => {
    const res = await api(method, path);
    if (res.ok) flash(message(res)); else showError(message(res));
    await loadCache();
  });
}
$('#cache-rule-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  guarded(async () => {
    const body = { name: $('#cache-rule-name').value.trim(), domains: commaList($('#cache-rule-domains').value), ttl: $('#cache-rule-ttl').value.trim() };
    const res = await api('POST', '/api/v1/cache/rules', body);
    if (!res.ok) { showError(`Cache rule not created: ${message(res)}`); return; }
    $('#cache-rule-name').value = ''; $('#cache-rule-domains').value = '';
    flash(message(res));
    await loadCache();
  });
});
$('#cache-clear').addEventListener('click', () => cacheAction('DELETE', '/api/v1/cache/entries'));

// ---- configuration ---------------------------------------------------------------------

let configLoaded = false;
async function loadConfig(force) {
  if (configLoaded && force !== true) return;
  const res = await api('GET', '/api/v1/config/full');
  if (!res.ok) { showError(message(res)); return; }
  $('#config-text').value = JSON.stringify(res.data, null, 2);
  configLoaded = true;
}
$('#config-reload-text').addEventListener('click', () => guarded(() => loadConfig(true)));

function editedConfig() {
  try {
    return JSON.parse($('#config-text').value);
  } catch (e) {
    renderConfigResult('bad', `Not valid JSON: ${e.message}`, []);
    return undefined;
  }
}

function sectionList(label, items, cls) {
  return el('p', { class: cls }, `${label}: `, items.length ? items.join(', ') : 'none');
}

function renderConfigResult(cls, headline, parts) {
  const box = el('div', { class: 'result' }, el('p', { class: cls }, headline), ...parts);
  $('#config-result').replaceChildren(box);
}

function problemList(errors) {
  if (!errors?.length) return [];
  return [el('ul', { class: 'errors' }, ...errors.map((e) =>
    el('li', { class: 'bad' }, [e.section, e.field].filter(Boolean).join('.') + (e.section || e.field ? ': ' : '') + e.message)))];
}

$('#config-validate').addEventListener('click', () => guarded(async () => {
  const config = editedConfig();
  if (config === undefined) return;
  const res = await api('POST', '/api/v1/config/validate', config);
  const v = res.data || {};
  if (!res.ok) { renderConfigResult('bad', message(res), []); return; }
  renderConfigResult(v.valid ? 'ok' : 'bad', v.valid ? 'Valid configuration.' : `Invalid: ${v.message || 'see the errors'}`, [
    ...problemList(v.errors),
    ...(v.warnings?.length ? [el('ul', {}, ...v.warnings.map((w) => el('li', { class: 'warn' }, w)))] : []),
  ]);
}));

$('#config-save').addEventListener('click', () => guarded(async () => {
  const config = editedConfig();
  if (config === undefined) return;
  const res = await api('PUT', '/api/v1/config', { config, create_backup: $('#config-backup').checked });
  const r = res.data || {};
  if (res.ok) {
    // The editor shows what was saved before the result appears (so the next edit starts there).
    await loadConfig(true);
    const headline = r.requires_restart ? `Saved. Restart required for: ${r.restart_required_sections.join(', ')}`
      : `Saved. ${r.message}`;
    renderConfigResult(r.requires_restart ? 'warn' : 'ok', headline, [
      sectionList('Changed', r.changed_sections, 'changed'),
      sectionList('Hot-reloaded', r.hot_reloaded_sections, 'hot-reloaded'),
      sectionList('Restart required', r.restart_required_sections, 'restart-required'),
      ...(r.backup_path ? [el('p', {}, `Backup: ${r.backup_path}`)] : []),
      ...problemList(r.errors),
    ]);
  } else {
    renderConfigResult('bad', `Not saved: ${message(res)}`, problemList(r.errors));
  }
}));

// ---- auth plugins ----------------------------------------------------------------------

async function loadAuth() {
  const res = await api('GET', '/api/v1/auth/plugins');
  if (!res.ok) { showError(message(res)); return; }
  fill($('#auth-plugins tbody'), res.data.plugins.map((p) => el('tr', {},
    el('td', {}, p.name), el('td', {}, p.type),
    el('td', { class: p.availability.state === 'available' ? 'ok' : 'bad' },
      p.availability.state + (p.availability.reason ? ` (${p.availability.reason})` : '')),
    el('td', {}, p.description))), 'No plugins.', 4);
}

// ---- mesh ------------------------------------------------------------------------------

/** One event stream per listed network (`/api/v1/mesh/networks/{id}/events`), kept across
 *  refreshes so no event is missed while the tables reload. */
const meshStreams = new Map();
let meshPing = null;

function meshEvent(network, ev) {
  const d = ev.data || {};
  const what = {
    'peer.joined': () => `${d.name || d.peer_id} joined as ${d.virtual_ip}`,
    'peer.left': () => `${d.name || d.peer_id} left`,
    'peer.updated': () => `${d.peer_id} updated its endpoints (${(d.endpoints || []).map((e) => `${e.address}:${e.port}`).join(', ') || 'none'})`,
  }[ev.type];
  if (!what) return;
  const list = $('#mesh-events');
  list.prepend(el('li', { 'data-type': ev.type },
    `${when(ev.timestamp)} ${network}: ${what()}`));
  while (list.children.length > 50) list.lastChild.remove();
  refreshSoon('mesh');
}

/** Says how many of the listed networks' streams are open (measured, not assumed). */
function showMeshLive() {
  const open = [...meshStreams.values()].filter((s) => s.readyState === 1).length;
  const badge = $('#mesh-live');
  badge.textContent = `live: ${open} of ${meshStreams.size} network${meshStreams.size === 1 ? '' : 's'}`;
  badge.classList.toggle('on', meshStreams.size > 0 && open === meshStreams.size);
}

function syncMeshStreams(ids) {
  for (const [id, sock] of meshStreams) {
    if (!ids.includes(id)) { meshStreams.delete(id); sock.close(); }
  }
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  for (const id of ids) {
    if (meshStreams.has(id)) continue;
    const sock = new WebSocket(`${proto}://${location.host}/api/v1/mesh/networks/${encodeURIComponent(id)}/events`);
    meshStreams.set(id, sock);
    sock.addEventListener('message', (m) => {
      if (m.data === 'pong') return;
      try { meshEvent(id, JSON.parse(m.data)); } catch { /* not an envelope */ }
    });
    // Gone (network deleted, server restarted): the next refresh opens it again if listed.
    sock.addEventListener('open', showMeshLive);
    sock.addEventListener('close', () => {
      if (meshStreams.get(id) === sock) meshStreams.delete(id);
      showMeshLive();
    });
  }
  showMeshLive();
  if (!meshPing) {
    // The server closes silent clients; `ping` keeps the streams alive.
    meshPing = setInterval(() => { for (const s of meshStreams.values()) if (s.readyState === 1) s.send('ping'); }, 25000);
  }
}

async function loadMesh() {
  const box = $('#mesh');
  const res = await api('GET', '/api/v1/mesh/networks');
  if (res.status === 503 && res.data?.code === 'MESH_REGISTRY_DISABLED') {
    syncMeshStreams([]);
    box.replaceChildren(el('p', { class: 'muted', id: 'mesh-unavailable' },
      'The mesh registry is off (mesh.registry.enabled: false in the server configuration).'));
    return;
  }
  if (res.status === 404 || res.status === 501) {
    box.replaceChildren(el('p', { class: 'muted', id: 'mesh-unavailable' },
      `The mesh registry is not available in this build (the server answered HTTP ${res.status}).`));
    return;
  }
  if (!res.ok) { box.replaceChildren(el('p', { class: 'bad' }, message(res))); return; }
  const networks = res.data.networks || [];
  syncMeshStreams(networks.map((n) => n.id));
  const blocks = await Promise.all(networks.map(async (n) => {
    const peers = await api('GET', `/api/v1/mesh/networks/${encodeURIComponent(n.id)}/peers`);
    const rows = peers.ok ? (peers.data.peers || []).map((p) => el('tr', { 'data-peer': p.id },
      el('td', {}, p.id), el('td', {}, p.name), el('td', {}, p.virtual_ip),
      el('td', {}, p.endpoints.map((e) => `${e.address}:${e.port} (${e.type})`).join(', ')),
      el('td', {}, p.connection_type || ''), el('td', {}, p.latency === undefined ? '' : `${p.latency} ms`),
      el('td', {}, when(p.last_seen)),
      el('td', {}, when(p.lease_expires)))) : [];
    const table = el('table', { class: 'mesh-peers', 'data-network': n.id },
      el('thead', {}, el('tr', {}, ...['Peer', 'Name', 'Address', 'Endpoints', 'Connection', 'Latency', 'Last seen', 'Lease until'].map((h) => el('th', {}, h)))),
      el('tbody'));
    fill(table.querySelector('tbody'), rows, peers.ok ? 'No peers hold a lease.' : message(peers), 8);
    return el('div', { 'data-network': n.id },
      el('h3', {}, `${n.name} — ${n.id}, ${n.cidr}, ${n.peer_count} peer${n.peer_count === 1 ? '' : 's'}`),
      el('div', { class: 'scroll' }, table));
  }));
  box.replaceChildren(...(blocks.length ? blocks : [el('p', { class: 'muted' }, 'No mesh networks.')]));
}

// ---- start -----------------------------------------------------------------------------

guarded(async () => {
  const res = await api('GET', '/api/v1/status').catch((e) => { if (e instanceof Unauthorized) return null; throw e; });
  if (res?.ok) await enter();
});
