// Building the page. Every value from the API goes in as text (textContent), never as HTML:
// names may hold <, & and quotes.

// h("td", {class: "num"}, "text", node, ...): an element; strings and numbers become text
// nodes, null/undefined/false children are skipped, arrays are flattened. Attributes whose
// name starts with "on" are listeners; others are set with setAttribute (values as text).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "value") el.value = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

// Replace an element's children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// A link to one of the UI's pages: parts are encoded as path segments.
export function link(text, ...parts) {
  return h("a", { href: "#/" + parts.map(encodeURIComponent).join("/") }, text);
}

// ------------------------------------------------------------------ formats
// Counts as plain digits (no grouping): what is shown can be read back as a number.
export function num(value) {
  return typeof value === "number" ? String(value) : value ?? "";
}

export function rate(details) {
  const value = details?.rate;
  return typeof value === "number" ? `${value.toFixed(value >= 100 ? 0 : 1)}/s` : "";
}

export function bytes(value) {
  if (typeof value !== "number") return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i++; }
  return `${value.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function yesNo(value) {
  return value ? "yes" : "no";
}

export function json(value) {
  return value && typeof value === "object" && Object.keys(value).length ? JSON.stringify(value) : "";
}

// ------------------------------------------------------------------ tables
// columns: [{title, cell: item => content, class?}]. A row gets `rowAttrs(item)` if given.
export function table(columns, items, { id, rowAttrs, empty = "none" } = {}) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.class }, c.title)));
  const rows = items.length
    ? items.map((item) => h("tr", rowAttrs ? rowAttrs(item) : {},
      columns.map((c) => h("td", { class: c.class }, c.cell(item)))))
    : [h("tr", { class: "empty" }, h("td", { colspan: columns.length }, empty))];
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, rows));
}

// A two-column table of label/value pairs (values may be nodes).
export function kv(pairs, attrs = {}) {
  return h("table", { class: "kv", ...attrs },
    pairs.filter(Boolean).map(([label, value, id]) => h("tr", {}, h("th", {}, label), h("td", { id }, value))));
}

// A label/value table refreshed in place: rows [key, label, id?] are made once (so their
// cells, and the ids tests and users hold on to, stay); `set({key: value})` replaces the
// values and hides the rows whose value is null or undefined.
export function liveKv(rows) {
  const cells = {};
  const element = h("table", { class: "kv" }, rows.map(([key, label, id]) =>
    h("tr", {}, h("th", {}, label), (cells[key] = h("td", { id })))));
  const set = (values) => {
    for (const [key, cell] of Object.entries(cells)) {
      const value = values[key];
      cell.parentElement.hidden = value === undefined || value === null;
      fill(cell, value);
    }
  };
  return { element, set };
}

// A used/limit bar: the fraction is set through the CSSOM (the page's CSP allows no
// inline style attributes).
export function bar(used, limit, alarm) {
  const inner = h("div");
  inner.style.width = `${limit ? Math.min(100, (100 * used) / limit) : 0}%`;
  return h("div", { class: alarm ? "bar alarm" : "bar" }, inner);
}

// ------------------------------------------------------------------ forms
export function select(id, options, selected) {
  return h("select", { id, name: id },
    options.map((o) => {
      const [value, text] = Array.isArray(o) ? o : [o, o];
      return h("option", { value, selected: value === selected }, text);
    }));
}

// A form whose submit runs `action(form)` (async); a failure is shown in #error.
export function form(attrs, children, action) {
  const el = h("form", attrs, children);
  el.addEventListener("submit", (event) => {
    event.preventDefault();
    attempt(() => action(el));
  });
  return el;
}

// A button that asks first (window.confirm) when `question` is given.
export function button(text, action, { question, id, danger } = {}) {
  return h("button", {
    type: "button", id, class: danger ? "danger" : undefined,
    onclick: () => {
      if (!question || window.confirm(question)) attempt(action);
    },
  }, text);
}

// ------------------------------------------------------------------ errors
// Run an action of the user's; its failure (the API's reason) is shown in #error.
export async function attempt(action) {
  clearError();
  try {
    await action();
  } catch (err) {
    showError(err);
  }
}

export function showError(err) {
  const box = document.getElementById("error");
  box.textContent = err instanceof Error ? err.message : String(err);
  box.hidden = false;
  if (!(err instanceof Error && "status" in err)) console.error(err);
}

export function clearError() {
  const box = document.getElementById("error");
  box.hidden = true;
  box.textContent = "";
}
