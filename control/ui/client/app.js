// Switchyard client web UI: plain ES module over the client's public API only (the same API the
// web UI listener answers beside these files). Helpers, the API call with the in-memory CSRF
// token and the sign-in shell are common.js; the live channel is the log stream (SSE).

import {
  $, el, fill, statList, bytes, when, commaList, showError, flash, api, message, guarded,
  problemList, sectionList, warningList, renderResult, parseEditor, routeTester, setLive, shell,
} from './common.js';

const enc = encodeURIComponent;

/** Runs an API action from a button or form: flashes `done` on success, the API's message
 * (prefixed with `failed`) otherwise, then refreshes the visible panel. */
async function act(method, path, body, done, failed) {
  await guarded(async () => {
    const res = await api(method, path, body);
    if (res.ok) flash(typeof done === 'function' ? done(res.data) : done);
    else showError(`${failed}: ${message(res)}`);
    await panels[ui.current()]();
  });
}

// ---- status ----------------------------------------------------------------------------

async function loadStatus() {
  const res = await api('GET', '/api/v1/status');
  if (!res.ok) { showError(message(res)); return; }
  const s = res.data;
  // the kill switch (routing.when_disconnected: block) reports itself in `status`
  const blocked = s.status.startsWith('blocked') ? s.status : '';
  statList($('#status'), [
    ['Server', s.server_connected ? `connected to ${s.server_address}` : (blocked || 'not connected: every destination goes direct')],
    ['HTTP proxy', s.http_proxy || 'off'], ['SOCKS5 proxy', s.socks5_proxy || 'off'],
    ['VPN', s.vpn_status], ['Active connections', s.active_connections],
    ['Sent', bytes(s.bytes_sent)], ['Received', bytes(s.bytes_received)],
    ['Debug entries', s.debug_entries], ['Uptime', s.uptime], ['Version', s.version],
  ]);
  $('#connect').disabled = s.server_connected;
  $('#disconnect').disabled = !s.server_connected;
}

$('#connect').addEventListener('click', () => act('POST', '/api/v1/connect', undefined, 'Connected.', 'Not connected'));
$('#disconnect').addEventListener('click', () => act('POST', '/api/v1/disconnect', undefined, 'Disconnected.', 'Not disconnected'));
$('#status-refresh').addEventListener('click', () => guarded(loadStatus));

// ---- servers and quick settings --------------------------------------------------------

async function loadServers() {
  const [servers, settings] = await Promise.all([api('GET', '/api/v1/servers'), api('GET', '/api/v1/settings')]);
  if (!servers.ok) { showError(message(servers)); return; }
  const current = settings.ok ? settings.data.current_server : '';
  fill($('#servers tbody'), servers.data.map((s) => {
    const selected = s.name === current;
    return el('tr', { 'data-server': s.name, class: selected ? 'selected' : '' },
      el('td', {}, s.name), el('td', { class: 'url' }, s.address), el('td', {}, s.protocol),
      el('td', { class: ['connected', 'online'].includes(s.status) ? 'ok' : (s.status === 'offline' ? 'bad' : 'warn') }, s.status),
      el('td', {}, s.latency_ms ? `${s.latency_ms} ms` : '—'), el('td', {}, s.is_default ? 'yes' : ''),
      el('td', {}, el('button', {
        type: 'button', class: 'select', 'aria-pressed': String(selected), 'aria-label': `Select server ${s.name}`,
        onclick: () => act('POST', '/api/v1/server/select', { server: s.name }, (d) => `Server ${d.server} selected.`, 'Not selected'),
      }, selected ? 'Selected' : 'Select')));
  }), 'No servers configured: every destination goes direct.', 7);
}

async function loadSettings() {
  const [settings, servers] = await Promise.all([api('GET', '/api/v1/settings'), api('GET', '/api/v1/servers')]);
  if (!settings.ok) { showError(message(settings)); return; }
  const s = settings.data;
  $('#set-auto-connect').checked = s.auto_connect;
  $('#set-start-minimized').checked = s.start_minimized;
  $('#set-show-notifications').checked = s.show_notifications;
  $('#set-system-proxy').checked = s.system_proxy_enabled;
  const names = servers.ok ? servers.data.map((x) => x.name) : [];
  $('#set-current-server').replaceChildren(el('option', { value: '' }, '(none)'), ...names.map((n) => el('option', { value: n }, n)));
  $('#set-current-server').value = s.current_server;
  // vpn_enabled is not a setting here: the VPN panel switches the VPN itself.
  $('#settings-form').dataset.vpnEnabled = String(s.vpn_enabled);
}

$('#settings-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  act('POST', '/api/v1/settings', {
    auto_connect: $('#set-auto-connect').checked,
    start_minimized: $('#set-start-minimized').checked,
    show_notifications: $('#set-show-notifications').checked,
    system_proxy_enabled: $('#set-system-proxy').checked,
    vpn_enabled: $('#settings-form').dataset.vpnEnabled === 'true',
    current_server: $('#set-current-server').value,
  }, 'Settings saved.', 'Settings not saved');
});

// ---- routes ----------------------------------------------------------------------------

async function loadRoutes() {
  const res = await api('GET', '/api/v1/routes');
  if (!res.ok) { showError(message(res)); return; }
  fill($('#routes tbody'), res.data.map((r) => el('tr', { 'data-route': r.name },
    el('td', {}, r.name), el('td', { class: 'url' }, r.patterns.join(', ')), el('td', {}, r.action),
    el('td', {}, r.priority),
    el('td', {}, el('button', { type: 'button', class: 'delete', 'aria-label': `Delete route ${r.name}`,
      onclick: () => act('DELETE', `/api/v1/routes/${enc(r.name)}`, undefined, `Route ${r.name} deleted.`, 'Route not deleted') }, 'Delete')))),
  'No routes: every destination takes the default action.', 5);
}

$('#route-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const body = {
    name: $('#route-name').value.trim(), domains: commaList($('#route-domains').value),
    action: $('#route-action').value, priority: Number($('#route-priority').value) || 0,
  };
  act('POST', '/api/v1/routes', body, (d) => {
    $('#route-name').value = ''; $('#route-domains').value = '';
    return `Route ${d.route} created.`;
  }, 'Route not created');
});

routeTester((r) => `${r.domain} → ${r.action} ${r.matched_route ? `(route ${r.matched_route})` : '(no route matched: the default action)'}`);

// ---- VPN and split tunnel --------------------------------------------------------------

function ruleItems(list, items, label, path) {
  list.replaceChildren(...(items.length ? items.map(([key, text]) => el('li', { 'data-rule': key }, text, ' ',
    el('button', { type: 'button', class: 'delete', 'aria-label': `Remove ${label} ${key}`,
      onclick: () => act('DELETE', `${path}/${enc(key)}`, undefined, `Removed ${label} ${key}.`, `${label} not removed`) }, 'Remove')))
    : [el('li', { class: 'muted' }, 'none')]));
}

async function loadVpn() {
  const [status, rules, conns] = await Promise.all([
    api('GET', '/api/v1/vpn/status'), api('GET', '/api/v1/vpn/split/rules'), api('GET', '/api/v1/vpn/connections'),
  ]);
  if (status.ok) {
    const v = status.data;
    statList($('#vpn-status'), [
      ['State', v.status], ['Device', v.interface_name], ['Address', v.ip || v.local_ip || '—'],
      ['Gateway', v.gateway || '—'], ['MTU', v.mtu], ['DNS', (v.dns || v.dns_servers || []).join(', ') || '—'],
      ['Classifier', v.mechanism || '—'], ['Sent', bytes(v.bytes_sent)], ['Received', bytes(v.bytes_received)],
      ['Since', when(v.connected_at || v.connected_since) || '—'],
    ]);
    $('#vpn-error').textContent = v.error ? `VPN error: ${v.error}` : '';
    $('#vpn-error').hidden = !v.error;
    $('#vpn-enable').disabled = v.enabled; $('#vpn-disable').disabled = !v.enabled && v.status !== 'error';
  }
  if (rules.ok) {
    const r = rules.data;
    $('#split-mode').value = r.mode;
    ruleItems($('#split-apps'), r.apps.map((a) => [a.name, a.path ? `${a.name} (${a.path})` : a.name]), 'app', '/api/v1/vpn/split/apps');
    ruleItems($('#split-domains'), r.domains.map((d) => [d, d]), 'domain', '/api/v1/vpn/split/domains');
    ruleItems($('#split-ips'), r.ips.map((i) => [i, i]), 'IP', '/api/v1/vpn/split/ips');
    $('#split-bypass').textContent = r.always_bypass.length ? `Always bypassed: ${r.always_bypass.join(', ')}` : '';
    $('#split-lan').textContent = r.allow_lan === false
      ? 'Directly connected LAN: through the VPN like any other destination (vpn.split.allow_lan: false).'
      : 'Directly connected LAN: bypasses the VPN (vpn.split.allow_lan: true).';
  }
  if (conns.ok) {
    fill($('#vpn-connections tbody'), conns.data.map((c) => el('tr', {},
      el('td', {}, c.protocol), el('td', {}, c.local_addr), el('td', { class: 'url' }, c.remote_addr),
      el('td', {}, when(c.started_at)), el('td', {}, bytes(c.bytes_sent)), el('td', {}, bytes(c.bytes_received)))),
    'No flows through the VPN.', 6);
  }
}

$('#vpn-enable').addEventListener('click', () => act('POST', '/api/v1/vpn/enable', undefined, 'VPN enabled.', 'VPN not enabled'));
$('#vpn-disable').addEventListener('click', () => act('POST', '/api/v1/vpn/disable', undefined, 'VPN disabled.', 'VPN not disabled'));

/** A split-tunnel form: sends `body()` to `path`, clears its inputs on success. */
function splitForm(form, method, path, body, what) {
  $(form).addEventListener('submit', (ev) => {
    ev.preventDefault();
    act(method, path, body(), () => {
      for (const i of $(form).querySelectorAll('input')) i.value = '';
      return `${what} saved.`;
    }, `${what} not saved`);
  });
}
splitForm('#split-mode-form', 'PUT', '/api/v1/vpn/split/mode', () => ({ mode: $('#split-mode').value }), 'Split-tunnel mode');
splitForm('#split-app-form', 'POST', '/api/v1/vpn/split/apps', () => ({ name: $('#split-app-name').value.trim(), path: $('#split-app-path').value.trim() }), 'App rule');
splitForm('#split-domain-form', 'POST', '/api/v1/vpn/split/domains', () => ({ pattern: $('#split-domain').value.trim() }), 'Domain rule');
splitForm('#split-ip-form', 'POST', '/api/v1/vpn/split/ips', () => ({ cidr: $('#split-ip').value.trim() }), 'IP rule');

// ---- live log (SSE) and debug entries --------------------------------------------------

const LOG_KEPT = 500;
let logLines = [];
let logSource = null;
let logLoaded = false;

function logLine(e) {
  const fields = Object.entries(e.fields || {}).map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`);
  return el('li', { class: `level-${e.level}` }, `${when(e.timestamp)} ${e.level.toUpperCase()} ${e.message}`,
    fields.length ? el('span', { class: 'muted' }, ` ${fields.join(' ')}`) : '');
}

function showLog(e) {
  const level = $('#log-level').value;
  if (level && e.level !== level) return;
  const list = $('#log');
  list.prepend(logLine(e));
  while (list.children.length > LOG_KEPT) list.lastChild.remove();
}

function addLog(e) {
  logLines.push(e);
  if (logLines.length > LOG_KEPT) logLines = logLines.slice(-LOG_KEPT);
  showLog(e);
}

function renderLog() {
  $('#log').replaceChildren();
  for (const e of logLines) showLog(e);
}

function openLog() {
  closeLog();
  const source = new EventSource('/api/v1/logs/stream');
  logSource = source;
  source.addEventListener('message', (m) => {
    let e;
    try { e = JSON.parse(m.data); } catch { return; }
    if (e.type === 'connected') { setLive(true); return; }
    if (e.level && e.message !== undefined) addLog(e);
  });
  source.addEventListener('error', () => {
    setLive(false);
    // A closed source (refused, e.g. a 401 or the subscriber limit) does not retry by itself.
    if (source.readyState === EventSource.CLOSED) ui.reopenLater(() => logSource === source, openLog);
  });
}

function closeLog() {
  if (logSource) { const s = logSource; logSource = null; s.close(); }
  setLive(false);
}

/** Signed out: the stream closes and the page keeps none of the log. */
function leaveLive() {
  closeLog();
  logLines = []; logLoaded = false;
  renderLog();
}

async function enterLive() {
  openLog();
  if (logLoaded) return;
  // The retained log (newest first) before the live entries.
  const res = await api('GET', '/api/v1/logs?limit=200');
  if (res.ok) {
    logLoaded = true;
    logLines = [...res.data.entries].reverse().concat(logLines).slice(-LOG_KEPT);
    renderLog();
  }
}

$('#log-level').addEventListener('change', renderLog);
$('#log-clear-view').addEventListener('click', () => { logLines = []; renderLog(); });

async function loadLogs() {
  const res = await api('GET', $('#debug-errors-only').checked ? '/api/v1/debug/errors' : '/api/v1/debug/entries');
  if (!res.ok) { showError(message(res)); return; }
  fill($('#debug-entries tbody'), res.data.slice(-200).reverse().map((d) => el('tr', {},
    el('td', {}, when(d.timestamp)), el('td', {}, d.method), el('td', { class: 'url' }, d.host),
    el('td', { class: 'url' }, d.path), el('td', {}, d.status_code || ''), el('td', {}, d.action),
    el('td', {}, d.duration), el('td', {}, bytes(d.bytes_sent)), el('td', {}, bytes(d.bytes_recv)),
    el('td', { class: d.error ? 'bad' : '' }, d.error))), 'No debug entries.', 10);
}

$('#debug-errors-only').addEventListener('change', () => guarded(loadLogs));
$('#debug-refresh').addEventListener('click', () => guarded(loadLogs));
$('#debug-clear').addEventListener('click', () => act('DELETE', '/api/v1/debug/entries', undefined, (d) => d.message, 'Not cleared'));

// ---- cache -----------------------------------------------------------------------------

async function loadCache() {
  const [stats, entries] = await Promise.all([api('GET', '/api/v1/cache/stats'), api('GET', '/api/v1/cache/entries?limit=100')]);
  if (stats.ok) {
    const s = stats.data;
    statList($('#cache-stats'), [
      ['Cache', s.enabled ? `on (${s.storage_type})` : 'off'], ['Entries', s.entries],
      ['Size', `${bytes(s.total_size_bytes)} / ${bytes(s.max_size_bytes)}`], ['Hit rate', `${(s.hit_rate * 100).toFixed(1)} %`],
      ['Hits / misses', `${s.hit_count} / ${s.miss_count}`], ['Evictions', s.eviction_count], ['Rules', s.rules_count],
    ]);
  }
  const list = entries.ok ? entries.data.entries || [] : [];
  fill($('#cache-entries tbody'), list.map((e) => el('tr', {},
    el('td', { class: 'url' }, e.url), el('td', {}, e.content_type), el('td', {}, bytes(e.size)), el('td', {}, when(e.expires_at)),
    el('td', {}, el('button', { type: 'button', 'aria-label': `Delete ${e.url}`,
      onclick: () => act('DELETE', `/api/v1/cache/entries/${enc(e.key)}`, undefined, 'Entry deleted.', 'Entry not deleted') }, 'Delete')))),
  entries.ok ? 'No cached entries.' : message(entries), 5);
}

$('#cache-clear').addEventListener('click', () => act('POST', '/api/v1/cache/clear', undefined, 'Cache cleared.', 'Cache not cleared'));

// ---- mesh ------------------------------------------------------------------------------

async function loadMesh() {
  const [status, peers, routes] = await Promise.all([
    api('GET', '/api/v1/mesh/status'), api('GET', '/api/v1/mesh/peers'), api('GET', '/api/v1/mesh/routes'),
  ]);
  if (status.ok) {
    const m = status.data;
    statList($('#mesh-status'), [
      ['State', m.status], ['Network', m.network_id ? `${m.network_id} (${m.network_cidr})` : '—'],
      ['Peer', m.peer_name || m.peer_id || '—'], ['Virtual IP', m.virtual_ip || '—'],
      ['Peers', `${m.connected_peers} / ${m.peer_count}`], ['Sent', bytes(m.bytes_sent)], ['Received', bytes(m.bytes_received)],
    ]);
    $('#mesh-state').textContent = m.enabled ? `Mesh ${m.status}.` : `Mesh is ${m.status}: the client reports no mesh peer running.`;
    $('#mesh-enable').disabled = m.enabled; $('#mesh-disable').disabled = !m.enabled;
  }
  fill($('#mesh-peers tbody'), (peers.ok ? peers.data : []).map((p) => el('tr', {},
    el('td', {}, p.name), el('td', {}, p.virtual_ip), el('td', {}, p.status), el('td', {}, p.connection_type),
    el('td', {}, `${p.latency_ms} ms`), el('td', {}, when(p.last_seen)))), peers.ok ? 'No peers.' : message(peers), 6);
  fill($('#mesh-routes tbody'), (routes.ok ? routes.data : []).map((r) => el('tr', {},
    el('td', {}, r.dest_ip), el('td', {}, r.next_hop || 'direct'), el('td', {}, r.type), el('td', {}, r.metric),
    el('td', {}, r.hop_count), el('td', {}, r.active ? 'yes' : 'no'))), routes.ok ? 'No routes.' : message(routes), 6);
}

$('#mesh-enable').addEventListener('click', () => act('POST', '/api/v1/mesh/enable', undefined, 'Mesh enabled.', 'Mesh not enabled'));
$('#mesh-disable').addEventListener('click', () => act('POST', '/api/v1/mesh/disable', undefined, 'Mesh disabled.', 'Mesh not disabled'));

// ---- configuration ---------------------------------------------------------------------

let configLoaded = null;
async function loadConfig(force) {
  if (configLoaded && force !== true) return;
  const res = await api('GET', '/api/v1/config');
  if (!res.ok) { showError(message(res)); return; }
  configLoaded = res.data;
  $('#config-text').value = JSON.stringify(res.data, null, 2);
}
$('#config-reload-text').addEventListener('click', () => guarded(() => loadConfig(true)));

/** Keys (at most two levels deep, e.g. `routing.rules`) whose values differ. */
function changedKeys(a, b, prefix = '') {
  const isObj = (v) => v && typeof v === 'object' && !Array.isArray(v);
  const keys = [...new Set([...Object.keys(a || {}), ...Object.keys(b || {})])];
  return keys.flatMap((k) => {
    const path = prefix + k;
    if (!prefix && isObj(a?.[k]) && isObj(b?.[k])) return changedKeys(a[k], b[k], `${k}.`);
    return JSON.stringify(a?.[k]) === JSON.stringify(b?.[k]) ? [] : [path];
  });
}

const configBox = () => $('#config-result');

$('#config-validate').addEventListener('click', () => guarded(async () => {
  const config = parseEditor($('#config-text'), configBox());
  if (config === undefined) return;
  const res = await api('POST', '/api/v1/config/validate', config);
  const v = res.data || {};
  if (!res.ok) { renderResult(configBox(), 'bad', message(res), []); return; }
  renderResult(configBox(), v.valid ? 'ok' : 'bad', v.valid ? 'Valid configuration.' : `Invalid: ${v.message || 'see the errors'}`,
    [...problemList(v.errors), ...warningList(v.warnings)]);
}));

/** The outcome of PUT /config or POST /config/import in `box`. */
function showSaved(box, res, verb, changed) {
  const r = res.data || {};
  if (!res.ok) {
    renderResult(box, 'bad', `Not ${verb}: ${message(res)}`, problemList(r.errors));
    return;
  }
  const fields = r.restart_fields || [];
  renderResult(box, r.restart_required ? 'warn' : 'ok',
    r.restart_required ? `${verb[0].toUpperCase()}${verb.slice(1)}. Restart required for: ${fields.join(', ')}`
      : `${verb[0].toUpperCase()}${verb.slice(1)}: the running configuration is updated.`, [
      ...(changed ? [sectionList('Changed', changed, 'changed')] : []),
      sectionList('Restart required', fields, 'restart-required'),
      ...warningList(r.warnings),
    ]);
}

$('#config-save').addEventListener('click', () => guarded(async () => {
  const config = parseEditor($('#config-text'), configBox());
  if (config === undefined) return;
  const before = configLoaded;
  const res = await api('PUT', '/api/v1/config', config);
  if (res.ok) await loadConfig(true);
  showSaved(configBox(), res, 'saved', res.ok ? changedKeys(before, configLoaded) : null);
}));

$('#config-export').addEventListener('click', () => guarded(async () => {
  const format = $('#config-format').value;
  const res = await api('POST', `/api/v1/config/export?format=${format}`, undefined, { text: true });
  if (!res.ok) { showError(`Not exported: ${message(res)}`); return; }
  $('#import-text').value = res.data;
  const link = $('#config-download');
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(new Blob([res.data], { type: format === 'json' ? 'application/json' : 'application/yaml' }));
  link.download = `switchyard-client.${format}`;
  link.textContent = `Download switchyard-client.${format}`;
  link.hidden = false;
  flash(`Exported as ${format.toUpperCase()} (shown below, ready to edit and import).`);
}));

$('#import-file').addEventListener('change', () => guarded(async () => {
  const file = $('#import-file').files[0];
  if (!file) return;
  $('#import-text').value = await file.text();
  if (/\.json$/i.test(file.name)) $('#config-format').value = 'json';
  else if (/\.ya?ml$/i.test(file.name)) $('#config-format').value = 'yaml';
}));

$('#config-import').addEventListener('click', () => guarded(async () => {
  const format = $('#config-format').value;
  const before = configLoaded;
  const res = await api('POST', `/api/v1/config/import?format=${format}`, $('#import-text').value,
    { type: format === 'json' ? 'application/json' : 'application/yaml' });
  if (res.ok) await loadConfig(true);
  showSaved($('#import-result'), res, 'imported', res.ok && before ? changedKeys(before, configLoaded) : null);
}));

// ---- start -----------------------------------------------------------------------------

const panels = {
  status: loadStatus, servers: loadServers, settings: loadSettings, routes: loadRoutes, vpn: loadVpn,
  logs: loadLogs, cache: loadCache, mesh: loadMesh, config: loadConfig,
};

// The status panel follows the counters while it is visible.
setInterval(() => { if (ui.isSignedIn() && ui.current() === 'status' && !document.hidden) guarded(loadStatus); }, 3000);

const ui = shell({ panels, first: 'status', onEnter: () => guarded(enterLive), onLeave: leaveLive });
