// Switchyard inventory web UI: plain DOM + fetch. The session lives only in the HttpOnly cookie
// the server sets; the CSRF token is kept in memory and sent as X-CSRF-Token on every
// state-changing request. Server data is inserted with textContent, never as HTML.

const $ = (sel) => document.querySelector(sel);

const state = {
  csrf: "",
  user: null,
  categories: [],
  locations: [],
  page: 1,
  totalPages: 1,
  editing: null, // item being edited (with images)
};

// ------------------------------------------------------------------ small helpers

/** Create an element: h("li", {class: "x", onclick: f}, child, "text"). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    // through the CSSOM: the page's CSP allows no inline style attributes
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** An error the server reported: its message and per-field details. */
class ServerError extends Error {
  constructor(status, body) {
    super((body && body.error) || `Request failed (HTTP ${status})`);
    this.status = status;
    this.details = (body && body.details) || [];
  }
}

/** The session ended during a call; the UI has already switched to the sign-in form. */
class SessionEnded extends Error {}

/** Call the API. `body`: object (sent as JSON), FormData, string (with `type`) or undefined. */
async function api(method, path, body, type) {
  const headers = {};
  const init = { method, headers, credentials: "same-origin", redirect: "manual" };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = state.csrf;
  if (body instanceof FormData) init.body = body;
  else if (typeof body === "string") {
    init.body = body;
    headers["Content-Type"] = type || "text/plain";
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(path, init);
  // sign-in and sign-out answer with a redirect: that is their success
  if (resp.type === "opaqueredirect") return { redirected: true };
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: text.slice(0, 200) };
  }
  if (resp.status === 401 && state.user && !path.startsWith("/api/auth/")) {
    // the session ended (expired or signed out elsewhere): the sign-in form says so
    showSignedOut("Your session has ended. Please sign in again.");
    throw new SessionEnded();
  }
  if (!resp.ok) throw new ServerError(resp.status, data);
  return data;
}

function flash(message) {
  $("#flash").textContent = message;
}

/** Show an error (with its field details) in `box` (default: the page's error box). */
function showError(err, box = $("#error")) {
  box.replaceChildren(h("strong", {}, err.message || String(err)));
  const details = (err.details || []).map((d) => d.message).filter((m) => m !== err.message);
  if (details.length) box.append(h("ul", {}, details.map((m) => h("li", {}, m))));
  box.hidden = false;
}

function clearError(box = $("#error")) {
  box.hidden = true;
  box.replaceChildren();
}

/** Run an action, reporting failures to the user instead of the console. */
async function guarded(fn, box) {
  clearError(box);
  try {
    await fn();
  } catch (err) {
    if (err instanceof SessionEnded) return;
    showError(err, box);
  }
}

async function refreshCsrf() {
  const data = await api("GET", "/api/auth/csrf");
  state.csrf = data.csrfToken;
}

// ------------------------------------------------------------------ session

function showSignedOut(message) {
  state.user = null;
  $("#loading").hidden = true;
  $("#app").hidden = true;
  $("#whoami").hidden = true;
  $("#auth").hidden = false;
  if ($("#item-dialog").open) $("#item-dialog").close();
  flash(message || "");
  $("#signin-email").focus();
}

async function showSignedIn(user) {
  state.user = user;
  $("#loading").hidden = true;
  $("#auth").hidden = true;
  $("#app").hidden = false;
  $("#whoami").hidden = false;
  $("#user-label").textContent = `${user.name || user.email}${user.role === "ADMIN" ? " (admin)" : ""}`;
  await loadLookups();
  state.page = 1;
  await loadItems();
}

async function boot() {
  await refreshCsrf();
  const session = await api("GET", "/api/auth/session");
  if (session && session.user) await showSignedIn(session.user);
  else showSignedOut();
}

async function signIn(email, password) {
  // a token from a session that has since ended is no longer valid: take the current one
  await refreshCsrf();
  await api("POST", "/api/auth/callback/credentials", { email, password, csrfToken: state.csrf });
  // the CSRF token is bound to the session: sign-in issued a new one
  await refreshCsrf();
  const session = await api("GET", "/api/auth/session");
  if (!session || !session.user) throw new Error("Signed in, but no session was created");
  $("#signin-form").reset();
  flash(`Signed in as ${session.user.email}`);
  await showSignedIn(session.user);
}

$("#signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  guarded(() => signIn(f.email.value.trim(), f.password.value));
});

$("#signup-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  guarded(async () => {
    const body = {
      email: f.email.value.trim(),
      password: f.password.value,
      confirmPassword: f.confirmPassword.value,
    };
    if (f.name.value.trim()) body.name = f.name.value.trim();
    const user = await api("POST", "/api/auth/register", body);
    f.reset();
    flash(`Account created for ${user.email}${user.role === "ADMIN" ? " (administrator)" : ""}. Sign in with your password.`);
    $("#signin-email").value = user.email;
    $("#signin-password").focus();
  });
});

$("#signout").addEventListener("click", () =>
  guarded(async () => {
    await api("POST", "/api/auth/signout", { csrfToken: state.csrf });
    await refreshCsrf();
    showSignedOut("You are signed out.");
  }),
);

// ------------------------------------------------------------------ tabs

const tabs = ["items", "categories", "locations", "transfer"];

function selectTab(name, focus = false) {
  for (const t of tabs) {
    const tab = $(`#tab-${t}`);
    const on = t === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`#panel-${t}`).hidden = !on;
    if (on && focus) tab.focus();
  }
}

for (const t of tabs) {
  const tab = $(`#tab-${t}`);
  tab.addEventListener("click", () => selectTab(t));
  tab.addEventListener("keydown", (e) => {
    const i = tabs.indexOf(t);
    if (e.key === "ArrowRight") selectTab(tabs[(i + 1) % tabs.length], true);
    else if (e.key === "ArrowLeft") selectTab(tabs[(i + tabs.length - 1) % tabs.length], true);
    else return;
    e.preventDefault();
  });
}

// ------------------------------------------------------------------ categories and locations

async function loadLookups() {
  const [c, l] = await Promise.all([api("GET", "/api/categories"), api("GET", "/api/locations")]);
  state.categories = c.categories;
  state.locations = l.locations;
  fillSelect($("#filter-category"), state.categories, "All");
  fillSelect($("#filter-location"), state.locations, "All");
  fillSelect($("#item-category"), state.categories, "None");
  fillSelect($("#item-location"), state.locations, "None");
  renderCategories();
  renderLocations();
}

function fillSelect(select, rows, emptyLabel) {
  const keep = select.value;
  select.replaceChildren(
    h("option", { value: "" }, emptyLabel),
    ...rows.map((r) => h("option", { value: r.id }, r.name)),
  );
  if (rows.some((r) => r.id === keep)) select.value = keep;
}

function count(row) {
  const n = (row._count && row._count.items) || 0;
  return `${n} item${n === 1 ? "" : "s"}`;
}

function renderCategories() {
  $("#categories").replaceChildren(
    ...state.categories.map((c) =>
      h(
        "li",
        {},
        h("span", { class: "name chip" }, h("span", { class: "swatch", style: `background:${c.color}`, "aria-hidden": "true" }), c.name),
        h("span", { class: "meta" }, `${c.color} · ${count(c)}`),
        h("button", { type: "button", class: "secondary", onclick: () => editCategory(c), "aria-label": `Edit category ${c.name}` }, "Edit"),
        h("button", { type: "button", class: "danger", onclick: () => deleteCategory(c), "aria-label": `Delete category ${c.name}` }, "Delete"),
      ),
    ),
  );
  if (!state.categories.length) $("#categories").append(h("li", {}, "No categories yet."));
}

function editCategory(c) {
  const f = $("#category-form");
  f.id.value = c.id;
  f.name.value = c.name;
  f.color.value = c.color;
  $("#category-form-title").textContent = `Edit category ${c.name}`;
  $("#category-save").textContent = "Save category";
  $("#category-cancel").hidden = false;
  f.name.focus();
}

function resetCategoryForm() {
  const f = $("#category-form");
  f.reset();
  f.id.value = "";
  $("#category-form-title").textContent = "New category";
  $("#category-save").textContent = "Add category";
  $("#category-cancel").hidden = true;
}

$("#category-cancel").addEventListener("click", resetCategoryForm);

$("#category-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  guarded(async () => {
    const body = { name: f.name.value.trim(), color: f.color.value };
    if (f.id.value) await api("PUT", `/api/categories/${encodeURIComponent(f.id.value)}`, body);
    else await api("POST", "/api/categories", body);
    flash(`Category ${body.name} saved`);
    resetCategoryForm();
    await loadLookups();
  });
});

function deleteCategory(c) {
  if (!confirm(`Delete category “${c.name}”? Its items become uncategorized.`)) return;
  guarded(async () => {
    await api("DELETE", `/api/categories/${encodeURIComponent(c.id)}`);
    flash(`Category ${c.name} deleted`);
    await loadLookups();
    await loadItems();
  });
}

function renderLocations() {
  $("#locations").replaceChildren(
    ...state.locations.map((l) =>
      h(
        "li",
        {},
        h("span", { class: "name" }, l.name),
        h("span", { class: "meta" }, [l.description, count(l)].filter(Boolean).join(" · ")),
        h("button", { type: "button", class: "secondary", onclick: () => editLocation(l), "aria-label": `Edit location ${l.name}` }, "Edit"),
        h("button", { type: "button", class: "danger", onclick: () => deleteLocation(l), "aria-label": `Delete location ${l.name}` }, "Delete"),
      ),
    ),
  );
  if (!state.locations.length) $("#locations").append(h("li", {}, "No locations yet."));
}

function editLocation(l) {
  const f = $("#location-form");
  f.id.value = l.id;
  f.name.value = l.name;
  f.description.value = l.description || "";
  $("#location-form-title").textContent = `Edit location ${l.name}`;
  $("#location-save").textContent = "Save location";
  $("#location-cancel").hidden = false;
  f.name.focus();
}

function resetLocationForm() {
  const f = $("#location-form");
  f.reset();
  f.id.value = "";
  $("#location-form-title").textContent = "New location";
  $("#location-save").textContent = "Add location";
  $("#location-cancel").hidden = true;
}

$("#location-cancel").addEventListener("click", resetLocationForm);

$("#location-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  guarded(async () => {
    const description = f.description.value.trim();
    const body = { name: f.name.value.trim(), description: description || null };
    if (f.id.value) await api("PUT", `/api/locations/${encodeURIComponent(f.id.value)}`, body);
    else await api("POST", "/api/locations", body);
    flash(`Location ${body.name} saved`);
    resetLocationForm();
    await loadLookups();
  });
});

function deleteLocation(l) {
  if (!confirm(`Delete location “${l.name}”? Its items keep existing without a location.`)) return;
  guarded(async () => {
    await api("DELETE", `/api/locations/${encodeURIComponent(l.id)}`);
    flash(`Location ${l.name} deleted`);
    await loadLookups();
    await loadItems();
  });
}

// ------------------------------------------------------------------ items

function listQuery() {
  const f = $("#filters");
  const [sortBy, sortOrder] = f.sort.value.split(":");
  const q = new URLSearchParams({ page: String(state.page), limit: "20", sortBy, sortOrder });
  if (f.search.value.trim()) q.set("search", f.search.value.trim());
  if (f.categoryId.value) q.set("categoryId", f.categoryId.value);
  if (f.locationId.value) q.set("locationId", f.locationId.value);
  if (f.lowStock.checked) q.set("lowStock", "true");
  return q;
}

async function loadItems() {
  const data = await api("GET", `/api/items?${listQuery()}`);
  const { page, totalPages, total } = data.pagination;
  state.page = page;
  state.totalPages = Math.max(totalPages, 1);
  $("#items").replaceChildren(...data.items.map(itemRow));
  if (!data.items.length) $("#items").append(h("li", {}, "No items match."));
  $("#items-summary").textContent = `${total} item${total === 1 ? "" : "s"}`;
  $("#page-label").textContent = `Page ${page} of ${state.totalPages}`;
  $("#prev-page").disabled = page <= 1;
  $("#next-page").disabled = page >= state.totalPages;
}

function itemRow(it) {
  const low = it.quantity <= it.minQuantity;
  const meta = [
    it.manufacturer,
    it.barcode && `barcode ${it.barcode}`,
    it.location && `at ${it.location.name}`,
  ].filter(Boolean);
  const thumb = it.images && it.images[0];
  return h(
    "li",
    { "data-item-id": it.id },
    thumb ? h("img", { class: "thumb", src: thumb.url, alt: "" }) : null,
    h("span", { class: "name" }, it.name),
    it.category
      ? h("span", { class: "chip" }, h("span", { class: "swatch", style: `background:${it.category.color}`, "aria-hidden": "true" }), it.category.name)
      : null,
    h("span", { class: low ? "low" : "" }, `Qty ${it.quantity} (min ${it.minQuantity})${low ? " — low stock" : ""}`),
    h("span", { class: "meta" }, meta.join(" · ")),
    h("button", { type: "button", class: "secondary", onclick: () => openItem(it.id), "aria-label": `Edit ${it.name}` }, "Edit"),
    h("button", { type: "button", class: "danger", onclick: () => deleteItem(it), "aria-label": `Delete ${it.name}` }, "Delete"),
  );
}

$("#filters").addEventListener("submit", (e) => {
  e.preventDefault();
  state.page = 1;
  guarded(loadItems);
});
for (const sel of ["#filter-category", "#filter-location", "#sort", "#low-stock"]) {
  $(sel).addEventListener("change", () => {
    state.page = 1;
    guarded(loadItems);
  });
}
$("#prev-page").addEventListener("click", () => {
  state.page = Math.max(1, state.page - 1);
  guarded(loadItems);
});
$("#next-page").addEventListener("click", () => {
  state.page = Math.min(state.totalPages, state.page + 1);
  guarded(loadItems);
});

function deleteItem(it) {
  if (!confirm(`Delete “${it.name}” and its images? This cannot be undone.`)) return;
  guarded(async () => {
    await api("DELETE", `/api/items/${encodeURIComponent(it.id)}`);
    flash(`${it.name} deleted`);
    await loadItems();
    await loadLookups();
  });
}

// ------------------------------------------------------------------ item dialog

function fillItemForm(it) {
  const f = $("#item-form");
  f.reset();
  f.id.value = it ? it.id : "";
  f.name.value = it ? it.name : "";
  f.description.value = (it && it.description) || "";
  f.manufacturer.value = (it && it.manufacturer) || "";
  f.barcode.value = (it && it.barcode) || "";
  f.quantity.value = it ? it.quantity : 1;
  f.minQuantity.value = it ? it.minQuantity : 0;
  f.buyPrice.value = it ? it.buyPrice : 0;
  f.buyDate.value = it && it.buyDate ? it.buyDate.slice(0, 10) : new Date().toISOString().slice(0, 10);
  f.categoryId.value = (it && it.categoryId) || "";
  f.locationId.value = (it && it.locationId) || "";
  $("#item-dialog-title").textContent = it ? `Edit ${it.name}` : "New item";
  $("#images-section").hidden = !it;
  renderGallery(it ? it.images : []);
}

async function openItem(id) {
  clearError($("#item-error"));
  state.editing = id ? await api("GET", `/api/items/${encodeURIComponent(id)}`) : null;
  fillItemForm(state.editing);
  if (!$("#item-dialog").open) $("#item-dialog").showModal();
  $("#item-name").focus();
}

$("#new-item").addEventListener("click", () => guarded(() => openItem(null)));
$("#item-close").addEventListener("click", () => $("#item-dialog").close());
$("#item-dialog").addEventListener("close", () => {
  state.editing = null;
  guarded(async () => {
    await loadItems();
    await loadLookups();
  });
});

function itemBody(f) {
  const text = (v) => (v.trim() ? v.trim() : null);
  const body = {
    name: f.name.value.trim(),
    description: text(f.description.value),
    manufacturer: text(f.manufacturer.value),
    barcode: text(f.barcode.value),
    categoryId: f.categoryId.value || null,
    locationId: f.locationId.value || null,
  };
  if (f.quantity.value !== "") body.quantity = Number(f.quantity.value);
  if (f.minQuantity.value !== "") body.minQuantity = Number(f.minQuantity.value);
  if (f.buyPrice.value !== "") body.buyPrice = Number(f.buyPrice.value);
  if (f.buyDate.value) body.buyDate = f.buyDate.value;
  return body;
}

$("#item-form").addEventListener("submit", (e) => {
  e.preventDefault(); // keep the dialog open: images can be added once the item exists
  const f = e.target;
  guarded(async () => {
    const body = itemBody(f);
    const saved = f.id.value
      ? await api("PUT", `/api/items/${encodeURIComponent(f.id.value)}`, body)
      : await api("POST", "/api/items", body);
    state.editing = saved;
    fillItemForm(saved);
    flash(`${saved.name} saved`);
    $("#image-file").focus();
  }, $("#item-error"));
});

function renderGallery(images) {
  const list = images || [];
  $("#gallery").replaceChildren(
    ...list.map((img) =>
      h(
        "li",
        { "data-image-id": img.id },
        h("img", { src: img.url, alt: img.filename || "item image", loading: "lazy" }),
        h("button", { type: "button", class: "danger", onclick: () => deleteImage(img), "aria-label": `Delete image ${img.filename || ""}`.trim() }, "Delete"),
      ),
    ),
  );
  if (!list.length) $("#gallery").append(h("li", { class: "empty" }, "No images yet."));
}

async function reloadImages() {
  const id = state.editing.id;
  const data = await api("GET", `/api/items/${encodeURIComponent(id)}/images`);
  state.editing.images = data.images;
  renderGallery(data.images);
}

$("#upload-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = $("#image-file");
  guarded(async () => {
    if (!state.editing) throw new Error("Save the item first");
    if (!input.files.length) throw new Error("Choose an image file first");
    const form = new FormData();
    form.append("file", input.files[0]);
    await api("POST", `/api/items/${encodeURIComponent(state.editing.id)}/images`, form);
    input.value = "";
    flash("Image uploaded");
    await reloadImages();
  }, $("#item-error"));
});

function deleteImage(img) {
  if (!confirm("Delete this image?")) return;
  guarded(async () => {
    const q = new URLSearchParams({ imageId: img.id });
    await api("DELETE", `/api/items/${encodeURIComponent(state.editing.id)}/images?${q}`);
    flash("Image deleted");
    await reloadImages();
  }, $("#item-error"));
}

// ------------------------------------------------------------------ import

$("#import-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = $("#import-file");
  const out = $("#import-result");
  out.replaceChildren();
  guarded(async () => {
    if (!input.files.length) throw new Error("Choose a file first");
    const file = input.files[0];
    const text = await file.text();
    const isJson = file.name.toLowerCase().endsWith(".json") || file.type === "application/json" || text.trimStart().startsWith("{");
    const result = await api("POST", "/api/import", text, isJson ? "application/json" : "text/csv");
    const line = (k) => {
      const r = result[k] || { created: 0, updated: 0 };
      return h("li", {}, `${k}: ${r.created} created, ${r.updated} updated`);
    };
    out.replaceChildren(h("p", {}, "Import done."), h("ul", {}, line("categories"), line("locations"), line("items")));
    input.value = "";
    await loadLookups();
    await loadItems();
  });
});

// ------------------------------------------------------------------ start

boot().catch((err) => {
  $("#loading").hidden = true;
  showError(err);
});
