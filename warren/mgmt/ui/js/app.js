// The single page: login, the hash routes to the pages, and the periodic refresh.

import * as api from "./api.js";
import { clearError, showError } from "./dom.js";
import * as overview from "./pages/overview.js";
import * as connections from "./pages/connections.js";
import * as exchanges from "./pages/exchanges.js";
import * as queues from "./pages/queues.js";
import * as streams from "./pages/streams.js";
import * as admin from "./pages/admin.js";
import * as definitions from "./pages/definitions.js";

// Hash routes: "#/queues/%2F/q1" is ["queues", "/", "q1"]; a page is chosen by its first
// part and the number of parts, and mounted with the rest.
const ROUTES = {
  "": { 0: overview.mount },
  connections: { 0: connections.mountList, 1: connections.mountOne },
  channels: { 0: connections.mountChannels },
  exchanges: { 0: exchanges.mountList, 2: exchanges.mountOne },
  queues: { 0: queues.mountList, 2: queues.mountOne },
  streams: { 0: streams.mount },
  admin: { 0: admin.mount },
  definitions: { 0: definitions.mount },
};

const REFRESH_KEY = "warren.refresh";
const $ = (id) => document.getElementById(id);

let user = null; // /api/whoami's answer once logged in
let refresh = null; // the mounted page's refresh function
let generation = 0; // bumped at each navigation: a slow refresh of a page left is ignored
let running = -1; // the generation whose refresh is under way
let inflight = null; // that refresh's promise
let stale = false; // #error shows a failed refresh: the next one that works clears it
let timer = null;

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "");
  let decoded;
  try {
    decoded = parts.map(decodeURIComponent);
  } catch (_) {
    decoded = parts;
  }
  const [page = "", ...params] = decoded;
  return { page, params, mount: ROUTES[page]?.[params.length] };
}

async function navigate() {
  const { page, params, mount } = route();
  const main = $("main");
  generation++;
  refresh = null;
  clearError();
  stale = false;
  main.replaceChildren();
  window.scrollTo(0, 0);
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === (page || "overview"));
  }
  if (!mount) {
    main.textContent = "No such page.";
    return;
  }
  refresh = mount(main, params, { user, leaving }) || null;
  await update();
}

// A page about to delete what it shows stops refreshing first: a refresh under way would
// ask for the deleted object (a 404 in the console).
async function leaving() {
  refresh = null;
  await inflight?.catch(() => {});
}

// Run the page's refresh (at navigation and at each tick), unless one is still running.
async function update() {
  if (!refresh || running === generation) return;
  const mine = running = generation;
  try {
    await (inflight = refresh());
    if (stale && mine === generation) clearError();
    stale = false;
  } catch (err) {
    if (mine !== generation) return;
    if (err.status === 401 && err.message === "Login failed") {
      signOut(); // the password was changed or the user deleted meanwhile
      return;
    }
    showError(err);
    stale = true;
  } finally {
    if (running === mine) running = -1;
  }
}

function schedule() {
  clearInterval(timer);
  const every = Number($("refresh-interval").value);
  // A hidden tab does not poll: nobody sees it, and the broker has less to answer.
  if (every > 0) timer = setInterval(() => { if (!document.hidden) update(); }, every);
}

function showApp(whoami) {
  user = whoami;
  user.tags = Array.isArray(whoami.tags) ? whoami.tags : String(whoami.tags || "").split(",").filter(Boolean);
  $("login-form").hidden = true;
  $("nav").hidden = false;
  $("session").hidden = false;
  $("whoami").textContent = user.name;
  // Admin holds the administrator's sections, the policies and link parameters for
  // policymakers, the shovels' and federation links' status for monitoring users.
  document.querySelector('#nav a[data-page="admin"]').hidden = !(api.setsPolicies(user) || api.monitors(user));
  document.querySelector('#nav a[data-page="definitions"]').hidden = !api.administers(user);
  schedule();
  navigate();
}

function showLogin(message) {
  user = null;
  refresh = null;
  clearInterval(timer);
  $("main").replaceChildren();
  $("nav").hidden = true;
  $("session").hidden = true;
  clearError();
  $("login-form").hidden = false;
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
  $("login-password").value = "";
  $("login-username").focus();
}

function signOut(message) {
  api.logout();
  showLogin(message);
}

// The credentials are checked as RabbitMQ's UI checks them: GET /api/whoami answers 401 with
// "Login failed" for a wrong password and "Not management user" for a user without a
// management tag.
async function logIn(event) {
  event.preventDefault();
  api.login($("login-username").value, $("login-password").value);
  try {
    showApp(await api.get("/whoami"));
  } catch (err) {
    signOut(err.message);
  }
}

function start() {
  const select = $("refresh-interval");
  const saved = localStorage.getItem(REFRESH_KEY);
  if (saved !== null && [...select.options].some((o) => o.value === saved)) select.value = saved;
  select.addEventListener("change", () => {
    localStorage.setItem(REFRESH_KEY, select.value);
    schedule();
  });
  $("login-form").addEventListener("submit", logIn);
  $("logout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => { if (user) navigate(); });
  if (!api.loggedIn()) {
    showLogin();
    return;
  }
  api.get("/whoami").then(showApp, (err) => signOut(err.message));
}

start();
