// Admin's sections of the shovel and federation plugins, after RabbitMQ's Admin tabs
// (rabbitmq_shovel_management, rabbitmq_federation_management): Shovel Status and Federation
// Status (/api/shovels, /api/federation-links: monitoring users and administrators), Shovel
// Management and Federation Upstreams (the "shovel" and "federation-upstream" runtime
// parameters: policymakers and administrators).

import * as api from "../api.js";
import { button, form, h, link, num, select, table } from "../dom.js";
import { input, remove, section, submit, vhostSelect } from "./shared.js";

// ------------------------------------------------------------------ formats
// A URI as RabbitMQ's UI shows one (fmt_uri_with_credentials, fmt_shortened_uri): the
// password masked, the query cut short (whole in the tooltip); a list one per line.
function uriText(uri) {
  return [uri ?? []].flat().map((u, i) => {
    const masked = String(u).replace(/^([a-zA-Z0-9+.-]+):\/\/(.*):(.*)@/, "$1://$2:[redacted]@");
    const query = masked.indexOf("?");
    return [i ? h("br") : null, query < 0 ? masked : h("abbr", { title: masked }, masked.slice(0, query) + "?...")];
  });
}

// A shovel's end as RabbitMQ's UI shows it (fmt_shovel_endpoint): its queue, or its exchange
// ("as published": the message's own) and routing key.
function endpoint(queue, exchange, key) {
  if (queue !== undefined) return [queue, " ", h("sub", {}, "queue")];
  return [exchange || h("i", {}, "as published"), key ? ` : ${key}` : "", " ", h("sub", {}, "exchange")];
}

const state = (value) => h("span", { class: `state-${value}` }, value);
const seconds = (value) => (value === undefined ? "" : `${value} s`);
const millis = (value) => (value === undefined ? "" : `${value} ms`);
const yesNo = (value) => (value === undefined ? "" : value ? "yes" : "no");

// ------------------------------------------------------------------ form values
// Form fields to a parameter's value as RabbitMQ's UI sends them (put_parameter): empty
// fields left out, numbers as numbers, several URIs separated by spaces as a list.
function uris(text) {
  const list = text.trim().split(/\s+/).filter(Boolean);
  return list.length > 1 ? list : list[0];
}

const number = (el) => (el.value === "" ? undefined : Number(el.value));

function compact(value) {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined && v !== ""));
}

const numberInput = (id, attrs = {}) => input(id, { type: "number", min: 0, step: 1, ...attrs });
const ackModes = [["on-confirm", "On confirm"], ["on-publish", "On publish"], ["no-ack", "No ack"]];

// A label shown only while `show()` holds, checked again when `control` changes.
function shownWhen(label, control, show) {
  const update = () => { label.hidden = !show(); };
  control.addEventListener("change", update);
  update();
  return label;
}

// ------------------------------------------------------------------ shovels
export function shovelStatus() {
  return section("Shovel Status", "shovels", async (refresh) => table([
    { title: "Name", cell: (s) => s.name },
    { title: "Virtual host", cell: (s) => s.vhost },
    { title: "State", cell: (s) => state(s.state) },
    { title: "Source", cell: (s) => s.src_uri === undefined ? "" :
      [uriText(s.src_uri), h("br"), endpoint(s.src_queue, s.src_exchange, s.src_exchange_key)] },
    { title: "Destination", cell: (s) => s.dest_uri === undefined ? "" :
      [uriText(s.dest_uri), h("br"), endpoint(s.dest_queue, s.dest_exchange, s.dest_exchange_key)] },
    { title: "Reason", cell: (s) => s.reason === undefined ? "" : h("code", { class: "reason" }, s.reason) },
    { title: "Last changed", cell: (s) => s.timestamp },
    { title: "", cell: (s) => {
      const path = `/shovels/vhost/${api.seg(s.vhost)}/${api.seg(s.name)}`;
      return [button("Restart", async () => {
        await api.del(`${path}/restart`);
        await refresh();
      }, { question: `Restart shovel ${s.name}?` }), " ", remove(path, `shovel ${s.name}`, refresh)];
    } },
  ], await api.get("/shovels"), {
    id: "shovels-table", empty: "no shovels",
    rowAttrs: (s) => ({ "data-name": s.name, "data-vhost": s.vhost, "data-state": s.state }),
  }));
}

// The source or destination fields of the add-shovel form (`end` "src" or "dest").
function shovelEnd(end) {
  const id = (field) => `add-shovel-${end}-${field}`;
  const uri = input(id("uri"), { value: "amqp://", required: true, size: 28 });
  const kind = select(id("kind"), [["queue", "Queue"], ["exchange", "Exchange"]], "queue");
  const name = input(id("name"));
  const key = input(id("key"));
  const fields = [
    h("label", {}, "URI", uri), h("label", {}, "Kind", kind), h("label", {}, "Name", name),
    shownWhen(h("label", {}, "Routing key", key), kind, () => kind.value === "exchange"),
  ];
  const value = () => (kind.value === "queue"
    ? { [`${end}-uri`]: uris(uri.value), [`${end}-queue`]: name.value }
    : { [`${end}-uri`]: uris(uri.value), [`${end}-exchange`]: name.value, [`${end}-exchange-key`]: key.value });
  const clear = () => { name.value = key.value = ""; };
  return { fields, value, clear };
}

export function shovelManagement() {
  return section("Shovel Management", "shovel-parameters", async (refresh) => table([
    { title: "Virtual host", cell: (p) => p.vhost },
    { title: "Name", cell: (p) => p.name },
    { title: "Source", cell: (p) => [uriText(p.value["src-uri"]), h("br"),
      endpoint(p.value["src-queue"], p.value["src-exchange"], p.value["src-exchange-key"])] },
    { title: "Prefetch", cell: (p) => num(p.value["src-prefetch-count"] ?? p.value["prefetch-count"]), class: "num" },
    { title: "Destination", cell: (p) => [uriText(p.value["dest-uri"]), h("br"),
      endpoint(p.value["dest-queue"], p.value["dest-exchange"], p.value["dest-exchange-key"])] },
    { title: "Forward headers", cell: (p) => yesNo(p.value["dest-add-forward-headers"] ?? p.value["add-forward-headers"]) },
    { title: "Reconnect delay", cell: (p) => seconds(p.value["reconnect-delay"]), class: "num" },
    { title: "Ack mode", cell: (p) => p.value["ack-mode"] ?? "" },
    { title: "Delete after", cell: (p) => num(p.value["src-delete-after"] ?? p.value["delete-after"]) },
    { title: "", cell: (p) => remove(`/parameters/shovel/${api.seg(p.vhost)}/${api.seg(p.name)}`, `shovel ${p.name}`, refresh) },
  ], await api.get("/parameters/shovel"), {
    id: "shovel-parameters-table", empty: "no shovels",
    rowAttrs: (p) => ({ "data-name": p.name, "data-vhost": p.vhost }),
  }), (refresh) => {
    const vhost = vhostSelect("add-shovel-vhost");
    const name = input("add-shovel-name", { required: true });
    const source = shovelEnd("src");
    const destination = shovelEnd("dest");
    const prefetch = numberInput("add-shovel-prefetch", { placeholder: "1000" });
    const deleteAfter = select("add-shovel-delete-after",
      [["never", "Never"], ["queue-length", "After initial length transferred"], ["count", "After a number of messages"]], "never");
    const count = numberInput("add-shovel-delete-after-count");
    const forward = select("add-shovel-forward-headers", [["false", "No"], ["true", "Yes"]], "false");
    const reconnect = numberInput("add-shovel-reconnect-delay", { placeholder: "5" });
    const ackMode = select("add-shovel-ack-mode", ackModes, "on-confirm");
    return form({ id: "add-shovel-form", class: "inline" }, [
      h("label", {}, "Virtual host", vhost), h("label", {}, "Name", name),
      h("fieldset", {}, h("legend", {}, "Source"), source.fields, h("label", {}, "Prefetch count", prefetch),
        h("label", {}, "Auto-delete", deleteAfter),
        shownWhen(h("label", {}, "Messages", count), deleteAfter, () => deleteAfter.value === "count")),
      h("fieldset", {}, h("legend", {}, "Destination"), destination.fields,
        h("label", {}, "Add forwarding headers", forward)),
      h("label", {}, "Reconnect delay (s)", reconnect), h("label", {}, "Acknowledgement mode", ackMode),
      submit("add-shovel-submit", "Add shovel"),
    ], async () => {
      const value = compact({
        ...source.value(), ...destination.value(),
        "src-prefetch-count": number(prefetch),
        "src-delete-after": deleteAfter.value === "count" ? number(count) : deleteAfter.value,
        "dest-add-forward-headers": forward.value === "true",
        "reconnect-delay": number(reconnect), "ack-mode": ackMode.value,
      });
      await api.put(`/parameters/shovel/${api.seg(vhost.value)}/${api.seg(name.value)}`,
        { component: "shovel", vhost: vhost.value, name: name.value, value });
      name.value = "";
      source.clear();
      destination.clear();
      await refresh();
    });
  });
}

// ------------------------------------------------------------------ federation
export function federationStatus() {
  return section("Federation Status", "federation-links", async (refresh) => table([
    { title: "Upstream", cell: (l) => {
      const upstreamName = l.type === "exchange" ? l.upstream_exchange : l.upstream_queue;
      return [l.upstream, upstreamName !== l[l.type] ? [" ", h("sub", {}, upstreamName)] : null];
    } },
    { title: "URI", cell: (l) => uriText(l.uri) },
    { title: "Virtual host", cell: (l) => l.vhost },
    { title: "Exchange / queue", cell: (l) => [
      link(l[l.type], l.type === "exchange" ? "exchanges" : "queues", l.vhost, l[l.type]), " ", h("sub", {}, l.type)] },
    { title: "State", cell: (l) => state(l.status) },
    { title: "Error", cell: (l) => l.error === undefined ? "" : h("code", { class: "reason" }, l.error) },
    { title: "Last changed", cell: (l) => l.timestamp },
    { title: "", cell: (l) => button("Restart", async () => {
      await api.del(`/federation-links/vhost/${api.seg(l.vhost)}/${api.seg(l.id)}/${api.seg(l.node)}/restart`);
      await refresh();
    }, { question: `Restart the link to ${l.upstream}?` }) },
  ], await api.get("/federation-links"), {
    id: "federation-links-table", empty: "no links",
    rowAttrs: (l) => ({ "data-upstream": l.upstream, "data-vhost": l.vhost, "data-target": l[l.type], "data-status": l.status }),
  }));
}

export function federationUpstreams() {
  return section("Federation Upstreams", "federation-upstreams", async (refresh) => table([
    { title: "Virtual host", cell: (p) => p.vhost },
    { title: "Name", cell: (p) => p.name },
    { title: "URI", cell: (p) => uriText(p.value.uri) },
    { title: "Exchange", cell: (p) => p.value.exchange ?? "" },
    { title: "Queue", cell: (p) => p.value.queue ?? "" },
    { title: "Max hops", cell: (p) => num(p.value["max-hops"]), class: "num" },
    { title: "Expires", cell: (p) => millis(p.value.expires), class: "num" },
    { title: "Message TTL", cell: (p) => millis(p.value["message-ttl"]), class: "num" },
    { title: "Prefetch", cell: (p) => num(p.value["prefetch-count"]), class: "num" },
    { title: "Reconnect delay", cell: (p) => seconds(p.value["reconnect-delay"]), class: "num" },
    { title: "Ack mode", cell: (p) => p.value["ack-mode"] ?? "" },
    { title: "Trust user id", cell: (p) => yesNo(p.value["trust-user-id"]) },
    { title: "", cell: (p) => remove(`/parameters/federation-upstream/${api.seg(p.vhost)}/${api.seg(p.name)}`,
      `upstream ${p.name}`, refresh) },
  ], await api.get("/parameters/federation-upstream"), {
    id: "federation-upstreams-table", empty: "no upstreams",
    rowAttrs: (p) => ({ "data-name": p.name, "data-vhost": p.vhost }),
  }), (refresh) => {
    const vhost = vhostSelect("add-upstream-vhost");
    const name = input("add-upstream-name", { required: true });
    const uri = input("add-upstream-uri", { required: true, size: 36, placeholder: "amqp://user:password@host:5672/vhost" });
    const exchange = input("add-upstream-exchange", { placeholder: "the federated one's name" });
    const queue = input("add-upstream-queue", { placeholder: "the federated one's name" });
    const maxHops = numberInput("add-upstream-max-hops", { min: 1, placeholder: "1" });
    const expires = numberInput("add-upstream-expires", { min: 1 });
    const ttl = numberInput("add-upstream-message-ttl");
    const prefetch = numberInput("add-upstream-prefetch", { placeholder: "1000" });
    const reconnect = numberInput("add-upstream-reconnect-delay", { placeholder: "5" });
    const ackMode = select("add-upstream-ack-mode", ackModes, "on-confirm");
    const trust = select("add-upstream-trust-user-id", [["false", "No"], ["true", "Yes"]], "false");
    return form({ id: "add-upstream-form", class: "inline" }, [
      h("label", {}, "Virtual host", vhost), h("label", {}, "Name", name), h("label", {}, "URI", uri),
      h("label", {}, "Exchange", exchange), h("label", {}, "Queue", queue), h("label", {}, "Max hops", maxHops),
      h("label", {}, "Expires (ms)", expires), h("label", {}, "Message TTL (ms)", ttl),
      h("label", {}, "Prefetch count", prefetch), h("label", {}, "Reconnect delay (s)", reconnect),
      h("label", {}, "Acknowledgement mode", ackMode), h("label", {}, "Trust user id", trust),
      submit("add-upstream-submit", "Add upstream"),
    ], async () => {
      const value = compact({
        uri: uris(uri.value), exchange: exchange.value, queue: queue.value, "max-hops": number(maxHops),
        expires: number(expires), "message-ttl": number(ttl), "prefetch-count": number(prefetch),
        "reconnect-delay": number(reconnect), "ack-mode": ackMode.value, "trust-user-id": trust.value === "true",
      });
      await api.put(`/parameters/federation-upstream/${api.seg(vhost.value)}/${api.seg(name.value)}`,
        { component: "federation-upstream", vhost: vhost.value, name: name.value, value });
      name.value = uri.value = exchange.value = queue.value = "";
      await refresh();
    });
  });
}
