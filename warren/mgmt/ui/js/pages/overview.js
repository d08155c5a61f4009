// Overview: totals, live message rates and queued messages, the node's memory and disk
// against their limits, alarms, the cluster's nodes and listeners (/api/overview and /api/nodes).

import * as api from "../api.js";
import { Chart, rates } from "../chart.js";
import { bar, bytes, fill, h, liveKv, num, table } from "../dom.js";

const RATES = ["publish", "confirm", "deliver_get", "redeliver", "ack", "return_unroutable"];
const QUEUED = ["messages", "messages_ready", "messages_unacknowledged"];

// /api/nodes is for monitoring users and administrators; others get the overview alone. It
// lists every member of a cluster: this node's figures are its own entry.
async function nodesOrNone(user) {
  return api.monitors(user) ? await api.get("/nodes") : null;
}

// The node's figures come from /api/nodes, or from the overview, which carries them too for
// monitoring users; a plain management user sees neither.
const HIDDEN = () => h("span", { class: "muted" }, "monitoring users only");

function memory(f) {
  if (f.mem_limit === undefined) return HIDDEN();
  return [bar(f.mem_used, f.mem_limit, f.mem_alarm), `${bytes(f.mem_used)} used of ${bytes(f.mem_limit)} high watermark`];
}

// The disk alarm is raised when free space falls below the limit: the bar fills as it nears.
function disk(f) {
  if (f.disk_free_limit === undefined) return HIDDEN();
  return [bar(f.disk_free_limit, f.disk_free, f.disk_free_alarm), `${bytes(f.disk_free)} free, limit ${bytes(f.disk_free_limit)}`];
}

function alarms(f) {
  if (f.mem_alarm === undefined) return HIDDEN();
  const raised = [f.mem_alarm && "memory", f.disk_free_alarm && "disk"].filter(Boolean);
  return raised.length ? raised.map((name) => h("div", { class: "alarm" }, `${name} alarm`)) : h("span", { class: "ok" }, "none");
}

export function mount(main, _params, { user }) {
  const rateChart = new Chart("chart-message-rates", RATES, { unit: "/s" });
  const queuedChart = new Chart("chart-queued-messages", QUEUED);
  const totals = liveKv([["connections", "Connections"], ["channels", "Channels"], ["exchanges", "Exchanges"],
    ["queues", "Queues"], ["consumers", "Consumers"], ["messages", "Messages"], ["messages_ready", "Ready"],
    ["messages_unacknowledged", "Unacked"]]);
  totals.element.id = "overview-totals";
  const node = liveKv([["memory", "Memory", "node-memory"], ["disk", "Disk space", "node-disk"], ["alarms", "Alarms", "alarms"],
    ["cluster", "Cluster"], ["node", "Node"], ["version", "Version"], ["uptime", "Uptime"], ["fds", "File descriptors"]]);
  const listeners = h("div", { id: "listeners" });
  const nodeList = h("div", { id: "nodes" });
  main.append(
    h("h1", {}, "Overview"),
    h("div", { class: "row" },
      h("div", {}, h("h2", {}, "Queued messages"), queuedChart.element),
      h("div", {}, h("h2", {}, "Message rates"), rateChart.element)),
    h("div", { class: "row" },
      h("div", {}, h("h2", {}, "Totals"), totals.element),
      h("div", {}, h("h2", {}, "Node"), node.element)),
    h("h2", {}, "Nodes"), nodeList,
    h("h2", {}, "Listeners"), listeners);

  return async () => {
    const [overview, nodes] = await Promise.all([api.get("/overview"), nodesOrNone(user)]);
    const figures = nodes?.find((n) => n.name === overview.node) ?? null;
    rateChart.add(rates(overview.message_stats, RATES));
    queuedChart.add(overview.queue_totals ?? {});

    const counts = { ...overview.object_totals, ...overview.queue_totals };
    totals.set(Object.fromEntries(Object.entries(counts).map(([key, value]) => [key, num(value)])));
    const f = figures ?? overview;
    node.set({
      memory: memory(f), disk: disk(f), alarms: alarms(f),
      cluster: overview.cluster_name, node: overview.node,
      version: `${overview.product_name} ${overview.product_version} (RabbitMQ ${overview.rabbitmq_version})`,
      uptime: figures && `${Math.round(figures.uptime / 1000)} s`,
      fds: figures && `${num(figures.fd_used)} of ${num(figures.fd_total)}`,
    });
    // Every member of a cluster, running or not (monitoring users and administrators).
    fill(nodeList, nodes ? table([
      { title: "Name", cell: (n) => n.name },
      { title: "State", cell: (n) => h("span", { class: n.running ? "ok" : "alarm" }, n.running ? "running" : "not running") },
      { title: "Uptime", cell: (n) => (n.running && n.uptime !== undefined ? `${Math.round(n.uptime / 1000)} s` : ""), class: "num" },
    ], nodes) : HIDDEN());
    fill(listeners, table([
      { title: "Node", cell: (l) => l.node },
      { title: "Protocol", cell: (l) => l.protocol },
      { title: "Bound to", cell: (l) => l.ip_address },
      { title: "Port", cell: (l) => l.port, class: "num" },
    ], overview.listeners ?? []));
  };
}
