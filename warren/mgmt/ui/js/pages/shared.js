// Parts that several pages show: Admin's sections, the vhost chooser of the add forms, and
// bindings.

import * as api from "../api.js";
import { button, fill, form, h, json, link, select, table } from "../dom.js";

export const input = (id, attrs = {}) => h("input", { id, name: id, ...attrs });
export const submit = (id, text) => h("button", { type: "submit", id }, text);
export const remove = (path, what, after) => button("Delete", async () => {
  await api.del(path);
  await after();
}, { danger: true, question: `Delete ${what}?` });

// An Admin section: a heading, the table `load` fills, and the add form `makeForm(refresh)`
// gives, if any.
export function section(title, id, load, makeForm) {
  const body = h("div", { id });
  const refresh = async () => fill(body, await load(refresh));
  return { element: h("section", {}, h("h2", {}, title), body, makeForm?.(refresh)), refresh };
}

// A <select> of the vhosts the user sees, filled when /api/vhosts answers.
export function vhostSelect(id) {
  const el = select(id, ["/"], "/");
  api.get("/vhosts?columns=name").then((vhosts) => {
    el.replaceChildren(...vhosts.map((v) => h("option", { value: v.name, selected: v.name === "/" }, v.name)));
  }, () => { /* keep "/": the form's own call reports what is wrong */ });
  return el;
}

// The default exchange is "" in the API's JSON and "amq.default" in its paths.
export const exchangePath = (name) => name || "amq.default";
export const exchangeLabel = (name) => name || "(AMQP default)";

// Arguments typed as a JSON object, or as key=value lines (values that parse as JSON, such as
// numbers and booleans, are taken as such; others are strings).
export function parseArguments(text) {
  text = text.trim();
  if (!text) return {};
  if (text.startsWith("{")) return JSON.parse(text);
  const out = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`"${line}": expected key=value`);
    const key = line.slice(0, at).trim();
    const value = line.slice(at + 1).trim();
    try {
      out[key] = JSON.parse(value);
    } catch (_) {
      out[key] = value;
    }
  }
  return out;
}

// A table of bindings with an Unbind button each; `after` runs once one is removed.
export function bindingsTable(bindings, after) {
  const dest = (b) => b.destination_type === "queue"
    ? link(b.destination, "queues", b.vhost, b.destination)
    : link(exchangeLabel(b.destination), "exchanges", b.vhost, exchangePath(b.destination));
  return table([
    { title: "From", cell: (b) => link(exchangeLabel(b.source), "exchanges", b.vhost, exchangePath(b.source)) },
    { title: "To", cell: dest },
    { title: "Routing key", cell: (b) => b.routing_key },
    { title: "Arguments", cell: (b) => json(b.arguments) },
    { title: "", cell: (b) => b.source === "" ? "" : button("Unbind", async () => {
      const kind = b.destination_type === "queue" ? "q" : "e";
      await api.del(`/bindings/${api.seg(b.vhost)}/e/${api.seg(b.source)}/${kind}/${api.seg(b.destination)}/${api.seg(b.properties_key)}`);
      await after();
    }, { question: "Remove this binding?" }) },
  ], bindings, { empty: "no bindings" });
}

// A form binding `from` (an exchange) to a queue or exchange; `fixed` says which end is this
// page's object: {vhost, source} on an exchange's page, {vhost, queue} on a queue's.
export function bindForm(fixed, after) {
  const other = h("input", { name: "other", required: true });
  const kind = select("bind-kind", [["q", "To queue"], ["e", "To exchange"]], "q");
  const key = h("input", { name: "routing_key" });
  const args = h("textarea", { name: "arguments", rows: 2, placeholder: "key=value lines or a JSON object" });
  const ends = fixed.queue !== undefined
    ? [h("label", {}, "From exchange", other)]
    : [h("label", {}, "Destination", kind), h("label", {}, "Name", other)];
  return form({ class: "inline" }, [...ends, h("label", {}, "Routing key", key), h("label", {}, "Arguments", args),
    h("button", { type: "submit" }, "Bind")], async () => {
    const [source, destKind, dest] = fixed.queue !== undefined
      ? [exchangePath(other.value), "q", fixed.queue]
      : [exchangePath(fixed.source), kind.value, other.value];
    await api.post(`/bindings/${api.seg(fixed.vhost)}/e/${api.seg(source)}/${destKind}/${api.seg(dest)}`,
      { routing_key: key.value, arguments: parseArguments(args.value) });
    other.value = key.value = args.value = "";
    await after();
  });
}
