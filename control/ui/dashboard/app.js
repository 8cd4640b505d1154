// Switchyard server dashboard: plain ES module, public management API only. The DOM helpers,
// the API call (session cookie + in-memory CSRF token) and the sign-in shell are common.js.

import {
  $, el, fill, statList, bytes, when, commaList, showError, flash, api, message, guarded,
  problemList, sectionList, warningList, renderResult, parseEditor, routeTester, setLive, shell,
} from './common.js';

let ws = null;
let wsPing = null;

const panels = {
  overview: loadOverview, backends: loadBackends, routes: loadRoutes, requests: loadRequests,
  cache: loadCache, config: loadConfig, auth: loadAuth, mesh: loadMesh,
};

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

function openWs() {
  closeWs();
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const sock = new WebSocket(`${proto}://${location.host}/api/v1/ws`);
  ws = sock;
  sock.addEventListener('open', () => {
    setLive(true);
    // The server closes silent clients; `ping` keeps the session alive.
    wsPing = setInterval(() => sock.readyState === 1 && sock.send('ping'), 25000);
    ui.refreshSoon(ui.current());
  });
  sock.addEventListener('message', (m) => {
    if (m.data === 'pong') return;
    let ev;
    try { ev = JSON.parse(m.data); } catch { return; }
    logEvent(ev);
    if (ev.type === 'stats.update' && ui.current() === 'overview') renderStats(ev.data);
    if (ev.type.startsWith('connection.')) ui.refreshSoon('overview');
    if (ev.type === 'backend.health') ui.refreshSoon('backends');
  });
  sock.addEventListener('close', () => {
    clearInterval(wsPing); setLive(false);
    ui.reopenLater(() => ws === sock, openWs);
  });
}

function closeWs() {
  clearInterval(wsPing);
  if (ws) { const s = ws; ws = null; s.close(); }
  setLive(false);
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

routeTester((r) => (r.matched_route
  ? `${r.domain} → route ${r.matched_route} (backends: ${r.backends.join(', ')})`
  : `${r.domain} → refused: no route matches (the proxy answers 403)`));

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
const yamlMode = () => $('#config-format').value === 'yaml';

/** The running configuration into the editor, as JSON or (the file's format) YAML. */
async function loadConfig(force) {
  if (configLoaded && force !== true) return;
  const res = yamlMode()
    ? await api('GET', '/api/v1/config/yaml', undefined, { text: true })
    : await api('GET', '/api/v1/config/full');
  if (!res.ok) { showError(message(res)); return; }
  $('#config-text').value = yamlMode() ? res.data : JSON.stringify(res.data, null, 2);
  configLoaded = true;
}
$('#config-reload-text').addEventListener('click', () => guarded(() => loadConfig(true)));
$('#config-format').addEventListener('change', () => guarded(() => loadConfig(true)));

const renderConfigResult = (cls, headline, parts) => renderResult($('#config-result'), cls, headline, parts);

/** The editor's text as a request body: YAML as is, JSON parsed (undefined when invalid). */
function editedBody() {
  if (yamlMode()) return { body: $('#config-text').value, opts: { type: 'application/yaml' } };
  const config = parseEditor($('#config-text'), $('#config-result'));
  return config === undefined ? undefined : { body: config, opts: {} };
}

$('#config-validate').addEventListener('click', () => guarded(async () => {
  const edited = editedBody();
  if (edited === undefined) return;
  const path = yamlMode() ? '/api/v1/config/yaml/validate' : '/api/v1/config/validate';
  const res = await api('POST', path, edited.body, edited.opts);
  const v = res.data || {};
  if (!res.ok) { renderConfigResult('bad', message(res), []); return; }
  renderConfigResult(v.valid ? 'ok' : 'bad', v.valid ? 'Valid configuration.' : `Invalid: ${v.message || 'see the errors'}`, [
    ...problemList(v.errors), ...warningList(v.warnings),
  ]);
}));

$('#config-save').addEventListener('click', () => guarded(async () => {
  const edited = editedBody();
  if (edited === undefined) return;
  const backup = $('#config-backup').checked;
  const res = yamlMode()
    ? await api('PUT', `/api/v1/config/yaml?create_backup=${backup}`, edited.body, edited.opts)
    : await api('PUT', '/api/v1/config', { config: edited.body, create_backup: backup });
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
  ui.refreshSoon('mesh');
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

const ui = shell({
  panels, first: 'overview', onEnter: openWs,
  onLeave: () => { closeWs(); syncMeshStreams([]); },
});
