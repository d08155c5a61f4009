// Calls to the management HTTP API with the logged-in user's credentials.
// The credentials live in sessionStorage, as RabbitMQ's UI keeps them: gone with the tab.

const KEY = "warren.auth";

class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

// Basic auth of a name and password in UTF-8 (btoa alone takes Latin-1 only).
function basic(username, password) {
  const bytes = new TextEncoder().encode(`${username}:${password}`);
  return "Basic " + btoa(String.fromCharCode(...bytes));
}

export function login(username, password) {
  sessionStorage.setItem(KEY, basic(username, password));
}

export function logout() {
  sessionStorage.removeItem(KEY);
}

export function loggedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

// What a user's tags allow, as the API decides it (warren/mgmt/access.py): the UI offers
// nothing it would be refused. Node-wide views (/api/nodes, /api/shovels): monitoring users
// and administrators; policies and runtime parameters (a move's shovel): policymakers and
// administrators; users, vhosts, definitions: administrators.
export const monitors = (user) => user.tags.includes("monitoring") || administers(user);
export const setsPolicies = (user) => user.tags.includes("policymaker") || administers(user);
export const administers = (user) => user.tags.includes("administrator");

// A path segment: a vhost or object name, "/" included (the default vhost is %2F).
export const seg = encodeURIComponent;

// The API's reason for a failure: its JSON {"error", "reason"}, else the status line.
async function failure(response) {
  let reason = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.reason !== undefined) {
      reason = typeof body.reason === "string" ? body.reason : JSON.stringify(body.reason);
    }
  } catch (_) { /* an empty or non-JSON body: keep the status line */ }
  return new ApiError(response.status, reason);
}

// One API call: `path` below /api, an optional JSON body. Resolves to the parsed JSON
// (null for an empty answer) or rejects with an ApiError carrying the API's reason.
// credentials "omit": the browser adds nothing of its own and never pops up its Basic auth
// dialog on a 401; the Authorization header is ours.
export async function call(method, path, body, headers = {}) {
  const init = { method, credentials: "omit", headers: { ...headers } };
  const auth = sessionStorage.getItem(KEY);
  if (auth) init.headers.Authorization = auth;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch("/api" + path, init);
  if (!response.ok) throw await failure(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path) => call("GET", path);
export const put = (path, body) => call("PUT", path, body ?? {});
export const post = (path, body) => call("POST", path, body ?? {});
export const del = (path, headers) => call("DELETE", path, undefined, headers);

// A page of a list through the API's pagination, filtered by name (not a regex), sorted by
// the API's default order or by `sort` (a field, descending if `reverse`).
export function page(path, { page = 1, pageSize = 100, name = "", columns = [], sort = "", reverse = false } = {}) {
  const query = new URLSearchParams({ page, page_size: pageSize, name, use_regex: "false", pagination: "true" });
  if (columns.length) query.set("columns", columns.join(","));
  if (sort) query.set("sort", sort);
  if (reverse) query.set("sort_reverse", "true");
  return get(`${path}?${query}`);
}
