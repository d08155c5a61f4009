// Connections (their state, flow and blocked included, and each one's channels) and channels.

import * as api from "../api.js";
import { bytes, button, fill, h, kv, link, num, rate, table, yesNo } from "../dom.js";
import { PagedList } from "../paged.js";

// flow / blocking / blocked are shown as the API says them, highlighted.
const state = (s) => h("span", { class: `state-${s}` }, s);

const CHANNEL_COLUMNS = [
  { title: "Channel", cell: (c) => c.connection_details ? link(c.name, "connections", c.connection_details.name) : c.name },
  { title: "User", cell: (c) => c.user },
  { title: "Virtual host", cell: (c) => c.vhost },
  { title: "State", cell: (c) => state(c.state) },
  { title: "Mode", cell: (c) => [c.confirm && "confirm", c.transactional && "transactional"].filter(Boolean).join(", ") },
  { title: "Prefetch", cell: (c) => num(c.prefetch_count), class: "num" },
  { title: "Consumers", cell: (c) => num(c.consumer_count), class: "num" },
  { title: "Unacked", cell: (c) => num(c.messages_unacknowledged), class: "num" },
  { title: "Unconfirmed", cell: (c) => num(c.messages_unconfirmed), class: "num" },
  { title: "Publish", cell: (c) => rate(c.message_stats?.publish_details), class: "num" },
  { title: "Deliver / get", cell: (c) => rate(c.message_stats?.deliver_get_details), class: "num" },
  { title: "Ack", cell: (c) => rate(c.message_stats?.ack_details), class: "num" },
];

export function mountList(main) {
  const list = new PagedList({
    prefix: "connections", noun: "connections", path: "/connections",
    fields: ["name", "user", "vhost", "state", "protocol", "channels", "ssl", "peer_host", "peer_port",
      "recv_oct_details", "send_oct_details", "client_properties.product"],
    columns: [
      { title: "Name", cell: (c) => link(c.name, "connections", c.name) },
      { title: "User", cell: (c) => c.user },
      { title: "Virtual host", cell: (c) => c.vhost },
      { title: "State", cell: (c) => state(c.state) },
      { title: "Protocol", cell: (c) => c.protocol },
      { title: "TLS", cell: (c) => yesNo(c.ssl) },
      { title: "Client", cell: (c) => c.client_properties?.product },
      { title: "Channels", cell: (c) => num(c.channels), class: "num" },
      { title: "From client", cell: (c) => `${bytes(c.recv_oct_details?.rate)}/s`, class: "num" },
      { title: "To client", cell: (c) => `${bytes(c.send_oct_details?.rate)}/s`, class: "num" },
    ],
    rowAttrs: (c) => ({ "data-name": c.name }),
  });
  main.append(h("h1", {}, "Connections"), list.element);
  return () => list.refresh();
}

export function mountOne(main, [name], { leaving }) {
  const details = h("div");
  const channels = h("div", { id: "connection-channels" });
  const close = button("Force close", async () => {
    await leaving();
    await api.del(`/connections/${api.seg(name)}`, { "X-Reason": "Closed via management plugin" });
    location.hash = "#/connections";
  }, { id: "connection-close", danger: true, question: `Close connection ${name}?` });
  main.append(h("h1", {}, "Connection ", h("b", {}, name)), details, h("h2", {}, "Channels"), channels, h("h2", {}, "Close"), close);

  return async () => {
    const path = `/connections/${api.seg(name)}`;
    const [c, chans] = await Promise.all([api.get(path), api.get(`${path}/channels`)]);
    fill(details, kv([
      ["User", c.user], ["Virtual host", c.vhost], ["State", state(c.state), "connection-state"],
      ["Last blocked by", c.last_blocked_by], ["Protocol", c.protocol], ["TLS", yesNo(c.ssl)],
      c.ssl && ["TLS protocol", c.ssl_protocol], c.peer_cert_subject && ["Client certificate", c.peer_cert_subject],
      ["Authentication", c.auth_mechanism], ["Client", `${c.client_properties?.product ?? ""} ${c.client_properties?.version ?? ""}`],
      ["Peer", `${c.peer_host}:${c.peer_port}`], ["Connected at", new Date(c.connected_at).toLocaleString()],
      ["Heartbeat", `${c.timeout} s`], ["Frame max", num(c.frame_max)], ["Channel max", num(c.channel_max)],
      ["Received", `${bytes(c.recv_oct)} (${bytes(c.recv_oct_details?.rate)}/s)`],
      ["Sent", `${bytes(c.send_oct)} (${bytes(c.send_oct_details?.rate)}/s)`],
    ]));
    fill(channels, table(CHANNEL_COLUMNS, chans));
  };
}

export function mountChannels(main) {
  const list = new PagedList({
    prefix: "channels", noun: "channels", path: "/channels", columns: CHANNEL_COLUMNS,
    rowAttrs: (c) => ({ "data-name": c.name }),
  });
  main.append(h("h1", {}, "Channels"), list.element);
  return () => list.refresh();
}
