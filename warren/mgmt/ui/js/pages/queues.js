// Queues: the paginated list, adding one, and a queue's page (depth and rate charts,
// consumers, bindings, get messages, move, purge, delete).

import * as api from "../api.js";
import { Chart, rates } from "../chart.js";
import { bytes, button, fill, form, h, json, kv, link, liveKv, num, rate, select, table, yesNo } from "../dom.js";
import { PagedList } from "../paged.js";
import { bindForm, bindingsTable, parseArguments, vhostSelect } from "./shared.js";

const LENGTHS = ["messages", "messages_ready", "messages_unacknowledged"];
const RATES = ["publish", "deliver_get", "ack"];

function features(q) {
  return [q.durable && "D", q.auto_delete && "AD", q.exclusive && "Excl"].filter(Boolean).join(" ");
}

function addForm(after) {
  const vhost = vhostSelect("add-queue-vhost");
  const name = h("input", { id: "add-queue-name", required: true });
  const type = select("add-queue-type", ["classic", "quorum", "stream"], "classic");
  const durable = select("add-queue-durable", [["true", "Durable"], ["false", "Transient"]], "true");
  const autoDelete = select("add-queue-auto-delete", [["false", "No"], ["true", "Yes"]], "false");
  const args = h("textarea", { id: "add-queue-arguments", rows: 2, placeholder: "x-max-length=1000, as key=value lines or JSON" });
  return form({ id: "add-queue-form", class: "inline" }, [
    h("label", {}, "Virtual host", vhost), h("label", {}, "Name", name), h("label", {}, "Type", type),
    h("label", {}, "Durability", durable), h("label", {}, "Auto delete", autoDelete), h("label", {}, "Arguments", args),
    h("button", { type: "submit", id: "add-queue-submit" }, "Add queue"),
  ], async () => {
    const body = { durable: durable.value === "true", auto_delete: autoDelete.value === "true",
      arguments: { ...parseArguments(args.value), "x-queue-type": type.value } };
    await api.put(`/queues/${api.seg(vhost.value)}/${api.seg(name.value)}`, body);
    name.value = args.value = "";
    await after();
  });
}

export function mountList(main) {
  const list = new PagedList({
    prefix: "queues", noun: "queues", path: "/queues",
    // Only what the table shows: a page of 500 queues stays small.
    fields: ["name", "vhost", "type", "state", "durable", "auto_delete", "exclusive", "policy", "consumers",
      "messages", "messages_ready", "messages_unacknowledged", "message_stats.publish_details",
      "message_stats.deliver_get_details", "message_stats.ack_details"],
    columns: [
      { title: "Virtual host", cell: (q) => q.vhost },
      { title: "Name", cell: (q) => link(q.name, "queues", q.vhost, q.name) },
      { title: "Type", cell: (q) => q.type },
      { title: "Features", cell: features },
      { title: "Policy", cell: (q) => q.policy ?? "" },
      { title: "State", cell: (q) => h("span", { class: `state-${q.state}` }, q.state) },
      { title: "Consumers", cell: (q) => num(q.consumers), class: "num consumers" },
      { title: "Ready", cell: (q) => num(q.messages_ready), class: "num ready" },
      { title: "Unacked", cell: (q) => num(q.messages_unacknowledged), class: "num unacked" },
      { title: "Total", cell: (q) => num(q.messages), class: "num messages" },
      { title: "Incoming", cell: (q) => rate(q.message_stats?.publish_details), class: "num" },
      { title: "Deliver / get", cell: (q) => rate(q.message_stats?.deliver_get_details), class: "num" },
      { title: "Ack", cell: (q) => rate(q.message_stats?.ack_details), class: "num" },
    ],
    rowAttrs: (q) => ({ "data-name": q.name, "data-vhost": q.vhost }),
  });
  main.append(h("h1", {}, "Queues"), list.element, h("h2", {}, "Add a new queue"), addForm(() => list.refresh()));
  return () => list.refresh();
}

// ------------------------------------------------------------------ one queue
function message(m) {
  return h("div", { class: "message" }, kv([
    ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
    ["Redelivered", yesNo(m.redelivered)], ["Remaining in queue", num(m.message_count)],
    ["Properties", json(m.properties)], ["Payload", `${num(m.payload_bytes)} bytes, encoding ${m.payload_encoding}`],
  ]), h("pre", { class: "message-payload" }, m.payload));
}

function getForm(path) {
  const count = h("input", { id: "get-count", type: "number", min: 1, value: "1" });
  const ackmode = select("get-ackmode", [["ack_requeue_true", "Nack, requeue true"], ["ack_requeue_false", "Ack, requeue false"],
    ["reject_requeue_true", "Reject, requeue true"], ["reject_requeue_false", "Reject, requeue false"]], "ack_requeue_true");
  const encoding = select("get-encoding", [["auto", "Automatic string/base64"], ["base64", "base64"]], "auto");
  const truncate = h("input", { id: "get-truncate", type: "number", min: 1, value: "50000" });
  const results = h("div", { id: "get-results" });
  const el = form({ id: "get-form", class: "inline" }, [
    h("label", {}, "Messages", count), h("label", {}, "Ack mode", ackmode), h("label", {}, "Encoding", encoding),
    h("label", {}, "Truncate at (bytes)", truncate),
    h("button", { type: "submit", id: "get-submit" }, "Get messages"),
  ], async () => {
    const got = await api.post(`${path}/get`, {
      count: Number(count.value), ackmode: ackmode.value, encoding: encoding.value, truncate: Number(truncate.value),
    });
    fill(results, got.length ? got.map(message) : h("p", { class: "muted" }, "Queue is empty."));
  });
  return [el, results];
}

// "Move messages" as RabbitMQ's UI does it (rabbitmq_management's queue.ejs with the shovel
// plugin): a dynamic shovel from this queue to another of the vhost, which deletes itself
// once it has moved the messages the queue held when it started.
const shovelName = (q) => `Move from ${q.name}`;

function moveForm(q, started) {
  const destination = h("input", { id: "move-destination", required: true });
  const uri = `amqp:///${encodeURIComponent(q.vhost)}`;
  return form({ id: "move-form", class: "inline" }, [
    h("label", {}, "Destination queue", destination), h("button", { type: "submit", id: "move-submit" }, "Move messages"),
  ], async () => {
    await api.put(`/parameters/shovel/${api.seg(q.vhost)}/${api.seg(shovelName(q))}`, {
      component: "shovel", vhost: q.vhost, name: shovelName(q),
      value: {
        "src-uri": uri, "src-queue": q.name, "src-protocol": "amqp091", "src-prefetch-count": 1000,
        "src-delete-after": "queue-length", "dest-protocol": "amqp091", "dest-uri": uri,
        "dest-add-forward-headers": false, "ack-mode": "on-confirm", "dest-queue": destination.value,
        // (RabbitMQ's form sends {} for other queues: its stream offset field is unset.)
        "src-consumer-args": q.type === "stream" ? { "x-stream-offset": "first" } : {},
      },
    });
    started(destination.value);
  });
}

// The move's shovel as GET /api/shovels/{vhost} shows it: its state, or that it has
// finished (deleted itself). Returns whether it is still there. A policymaker may start a
// move but not read /api/shovels (monitoring users only, as in RabbitMQ): for them the
// vhost's shovel parameters say whether it is still there.
async function moveStatus(q, status, user) {
  const name = shovelName(q);
  const mine = api.monitors(user)
    ? (await api.get(`/shovels/${api.seg(q.vhost)}`)).find((s) => s.name === name)
    : (await api.get(`/parameters/shovel/${api.seg(q.vhost)}`)).some((p) => p.name === name)
      && { name, state: "running" };
  status.textContent = mine
    ? `Shovel "${mine.name}": ${mine.state}${mine.reason ? ` (${mine.reason})` : ""}`
    : `Shovel "${name}" has finished.`;
  return Boolean(mine);
}

function streamDetails(q) {
  const s = q.stream ?? {};
  return [
    kv([["First offset", num(s.first_offset)], ["Last offset", num(s.last_offset)], ["Next offset", num(s.next_offset)],
      ["Segments", num(s.segments)], ["Size", bytes(s.bytes)],
      ["First message at", s.first_timestamp ? new Date(s.first_timestamp).toLocaleString() : ""]], { id: "stream-details" }),
    h("h3", {}, "Consumers' offsets"),
    table([
      { title: "Consumer tag", cell: (c) => c.consumer_tag },
      { title: "Channel", cell: (c) => c.channel_details?.name },
      { title: "Offset", cell: (c) => num(c.stream_offset), class: "num" },
      { title: "Lag", cell: (c) => num(c.stream_lag), class: "num" },
    ], q.consumer_details ?? [], { id: "stream-consumers", empty: "no consumers" }),
  ];
}

export function mountOne(main, [vhost, name], { user, leaving }) {
  const path = `/queues/${api.seg(vhost)}/${api.seg(name)}`;
  const key = `${vhost}\u0000${name}`; // the charts' history is this queue's
  const lengths = new Chart("chart-queue-lengths", LENGTHS, { key: `lengths:${key}` });
  const rateChart = new Chart("chart-queue-rates", RATES, { key: `rates:${key}`, unit: "/s" });
  const details = liveKv([["type", "Type"], ["state", "State"], ["features", "Features"], ["arguments", "Arguments"],
    ["policy", "Policy"], ["consumers", "Consumers"], ["messages", "Total", "queue-messages"],
    ["messages_ready", "Ready", "queue-ready"], ["messages_unacknowledged", "Unacked", "queue-unacked"],
    ["bytes", "Bytes"]]);
  const stream = h("div");
  const consumers = h("div", { id: "queue-consumers" });
  const bindings = h("div", { id: "queue-bindings" });
  const status = h("p", { id: "move-status" });
  const move = h("div");
  const mover = api.setsPolicies(user); // a move is a shovel: a runtime parameter
  let moving = false; // a move was started here and its shovel has not finished

  const refresh = async () => {
    const [q, bound] = await Promise.all([api.get(path), api.get(`${path}/bindings`)]);
    lengths.add(q);
    rateChart.add(rates(q.message_stats, RATES));
    details.set({
      type: q.type, state: q.state, features: features(q), arguments: json(q.arguments), policy: q.policy ?? "",
      consumers: num(q.consumers), messages: num(q.messages), messages_ready: num(q.messages_ready),
      messages_unacknowledged: num(q.messages_unacknowledged), bytes: bytes(q.message_bytes),
    });
    if (q.type === "stream") fill(stream, h("h2", {}, "Stream"), streamDetails(q));
    fill(consumers, table([
      { title: "Consumer tag", cell: (c) => c.consumer_tag },
      { title: "Channel", cell: (c) => c.channel_details ? link(c.channel_details.name, "connections", c.channel_details.connection_name) : "" },
      { title: "Ack required", cell: (c) => yesNo(c.ack_required) },
      { title: "Exclusive", cell: (c) => yesNo(c.exclusive) },
      { title: "Prefetch", cell: (c) => num(c.prefetch_count), class: "num" },
      { title: "Active", cell: (c) => yesNo(c.active) },
      { title: "Arguments", cell: (c) => json(c.arguments) },
    ], q.consumer_details ?? [], { empty: "no consumers" }));
    fill(bindings, bindingsTable(bound, refresh));
    if (mover && !move.firstChild) {
      fill(move, moveForm(q, (destination) => {
        status.textContent = `Moving messages to ${destination}: shovel "${shovelName(q)}" started.`;
        moving = true;
      }));
    }
    if (moving) {
      moving = await moveStatus(q, status, user).catch((err) => {
        status.textContent = `Shovel status unavailable: ${err.message}`;
        return false;
      });
    }
  };

  const [getEl, getResults] = getForm(path);
  main.append(
    h("h1", {}, "Queue ", h("b", {}, name), h("span", { class: "muted" }, ` in virtual host ${vhost}`)),
    h("div", { class: "row" },
      h("div", {}, h("h2", {}, "Queued messages"), lengths.element),
      h("div", {}, h("h2", {}, "Message rates"), rateChart.element)),
    h("h2", {}, "Details"), details.element, stream,
    h("h2", {}, "Consumers"), consumers,
    h("h2", {}, "Bindings"), bindings, bindForm({ vhost, queue: name }, refresh),
    h("h2", {}, "Get messages"), h("p", { class: "muted" }, "Getting messages is a destructive action: with a requeue mode they come back redelivered."),
    getEl, getResults,
    mover && h("h2", {}, "Move messages"), mover && move, mover && status,
    h("h2", {}, "Purge"),
    button("Purge messages", async () => {
      await api.del(`${path}/contents`);
      await refresh();
    }, { id: "purge-submit", danger: true, question: `Purge every message of queue ${name}?` }),
    h("h2", {}, "Delete"),
    button("Delete queue", async () => {
      await leaving();
      await api.del(path);
      location.hash = "#/queues";
    }, { id: "delete-submit", danger: true, question: `Delete queue ${name}?` }));
  return refresh;
}
