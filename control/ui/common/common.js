// Shared by the server dashboard and the client web UI (served to each as /ui/common.js):
// DOM helpers, the API call with the in-memory CSRF token, and the sign-in / panel shell.
// Session: the HttpOnly cookie of POST /api/v1/login. CSRF: the X-CSRF-Token header value of
// cookie-authenticated responses, held in memory only and sent on every state change.

export const $ = (sel) => document.querySelector(sel);

/** Builds an element; children are nodes or text (never parsed as HTML). */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ''));
  return e;
}

/** Replaces a table body's rows; one muted row saying `empty` when there are none. */
export function fill(tbody, rows, empty, cols) {
  tbody.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: String(cols), class: 'muted' }, empty))]));
}

export function statList(dl, pairs) {
  dl.replaceChildren(...pairs.map(([k, v]) => el('div', {}, el('dt', {}, k), el('dd', {}, v))));
}

export const bytes = (n) => {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0; let v = Number(n) || 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${u[i]}`;
};
export const when = (t) => (t ? new Date(t).toLocaleTimeString() : '');
export const commaList = (text) => text.split(',').map((d) => d.trim()).filter(Boolean);

export function showError(msg) { const e = $('#error'); e.textContent = msg; e.hidden = !msg; if (msg) $('#flash').hidden = true; }
export function flash(msg) { const f = $('#flash'); f.textContent = msg; f.hidden = false; $('#error').hidden = true; }

export class Unauthorized extends Error {}

let csrf = null;
let onUnauthorized = () => {};

/** True when the session is a cookie session (the API has a token to sign in with). */
export const hasSession = () => !!csrf;

/**
 * One API call: {status, ok, data}. `body` is sent as JSON, or as is when `opts.type` names
 * its content type; `opts.text` reads the answer as text. A 401 returns to the sign-in view.
 */
export async function api(method, path, body, opts = {}) {
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = opts.type || 'application/json';
  if (csrf && method !== 'GET') headers['X-CSRF-Token'] = csrf;
  const r = await fetch(path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : (opts.type ? body : JSON.stringify(body)),
  });
  const token = r.headers.get('X-CSRF-Token');
  if (token) csrf = token;
  let data = null;
  if (opts.text && r.ok) data = await r.text();
  else { try { data = await r.json(); } catch { data = null; } }
  if (r.status === 401 && path !== '/api/v1/login') { onUnauthorized(); throw new Unauthorized(); }
  return { status: r.status, ok: r.ok, data };
}

export const message = (res) => res.data?.message || `HTTP ${res.status}`;

/** Runs an action, showing its failure in the error banner. */
export async function guarded(fn) {
  try { await fn(); } catch (e) { if (!(e instanceof Unauthorized)) showError(`Request failed: ${e.message}`); }
}

/** `{section, field, message}` entries as a list. */
export function problemList(errors) {
  if (!errors?.length) return [];
  return [el('ul', { class: 'errors' }, ...errors.map((e) =>
    el('li', { class: 'bad' }, [e.section, e.field].filter(Boolean).join('.') + (e.section || e.field ? ': ' : '') + e.message)))];
}

export function sectionList(label, items, cls) {
  return el('p', { class: cls }, `${label}: `, items.length ? items.join(', ') : 'none');
}

export function warningList(warnings) {
  return warnings?.length ? [el('ul', {}, ...warnings.map((w) => el('li', { class: 'warn' }, w)))] : [];
}

/** Shows a save/validate outcome in `box`: a headline of class `cls` and detail nodes. */
export function renderResult(box, cls, headline, parts) {
  box.replaceChildren(el('div', { class: 'result' }, el('p', { class: cls }, headline), ...parts));
}

/** Parses the JSON of a config editor, showing a parse error in `box`; undefined when invalid. */
export function parseEditor(textarea, box) {
  try {
    return JSON.parse(textarea.value);
  } catch (e) {
    renderResult(box, 'bad', `Not valid JSON: ${e.message}`, []);
    return undefined;
  }
}

/** The route tester (#route-test-form): asks GET /api/v1/routes/test and shows
 * `describe(answer)` in #route-test-result. */
export function routeTester(describe) {
  $('#route-test-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const out = $('#route-test-result');
      const res = await api('GET', `/api/v1/routes/test?domain=${encodeURIComponent($('#route-test-domain').value.trim())}`);
      out.textContent = res.ok ? describe(res.data) : message(res);
      out.className = res.ok ? 'ok' : 'bad';
    });
  });
}

/** The live-channel badge (WebSocket or event stream). */
export function setLive(on) {
  const b = $('#live-state');
  b.textContent = on ? 'live: on' : 'live: off';
  b.classList.toggle('on', on);
}

/**
 * The page shell both UIs share: the sign-in form (#signin-form, #signin-token), sign-out
 * (#signout), the "no API token" badge (#open-api), the live badge (#live-state), and panels
 * (`nav button[data-panel=x]` shows `section#panel-x` and runs `panels[x]`). `onEnter` and
 * `onLeave` open and close the UI's live channel.
 */
export function shell({ panels, first, onEnter, onLeave }) {
  let signedIn = false;
  let current = first;
  let refreshTimer = null;

  function signedOut() {
    signedIn = false; csrf = null;
    onLeave();
    setLive(false);
    $('#app').hidden = true; $('#signout').hidden = true; $('#live-state').hidden = true;
    $('#signin').hidden = false;
    $('#signin-token').focus();
  }
  onUnauthorized = signedOut;

  function show(name) {
    // A banner belongs to the panel it was shown on.
    if (current !== name) { $('#flash').hidden = true; $('#error').hidden = true; }
    current = name;
    for (const b of document.querySelectorAll('nav button')) {
      if (b.dataset.panel === name) b.setAttribute('aria-current', 'page'); else b.removeAttribute('aria-current');
    }
    for (const p of document.querySelectorAll('.panel')) p.hidden = p.id !== `panel-${name}`;
    guarded(panels[name]);
  }

  async function enter() {
    signedIn = true;
    $('#signin').hidden = true; $('#app').hidden = false;
    // Cookie-authenticated answers carry a CSRF token; without one the API has no token
    // configured (open, e.g. on loopback): there is nothing to sign out of.
    $('#signout').hidden = !csrf; $('#live-state').hidden = false;
    $('#open-api').hidden = !!csrf;
    onEnter();
    show(current);
  }

  for (const b of document.querySelectorAll('nav button')) b.addEventListener('click', () => show(b.dataset.panel));

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

  const ui = {
    show,
    isSignedIn: () => signedIn,
    current: () => current,
    /** Coalesces bursts of events into one refresh of `panel` if it is the visible one. */
    refreshSoon(panel) {
      if (current !== panel || refreshTimer) return;
      refreshTimer = setTimeout(() => { refreshTimer = null; if (signedIn && current === panel) guarded(panels[panel]); }, 150);
    },
    /** After a live channel closed: reopen it (2 s later) while the session lasts and it is
     * still the current one; a 401 on the way returns to the sign-in view. */
    reopenLater(stillCurrent, open) {
      if (!signedIn || !stillCurrent()) return;
      setTimeout(() => guarded(async () => {
        if (!signedIn || !stillCurrent()) return;
        const res = await api('GET', '/api/v1/status');
        if (res.ok && signedIn && stillCurrent()) open();
      }), 2000);
    },
  };

  guarded(async () => {
    const res = await api('GET', '/api/v1/status').catch((e) => { if (e instanceof Unauthorized) return null; throw e; });
    if (res?.ok) await enter();
  });
  return ui;
}
