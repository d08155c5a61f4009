// Streams: the stream queues with their sizes and offsets; a stream's page (the queue page)
// shows its consumers' offsets and lag.
//
// The API filters lists by name only, so the streams are found by sorting the queues by type,
// descending: "stream" sorts after "classic" and "quorum", so the streams come first, and a
// page that ends with another type has shown the last of them.

import * as api from "../api.js";
import { attempt, bytes, fill, h, link, num, rate, table } from "../dom.js";

const PAGE_SIZE = 100;
const FIELDS = ["name", "vhost", "type", "state", "consumers", "messages", "message_bytes", "stream",
  "message_stats.publish_details", "message_stats.deliver_get_details"];

export function mount(main) {
  let page = 1;
  const filter = h("input", { id: "streams-filter", type: "search", placeholder: "Filter by name" });
  const prev = h("button", { type: "button", id: "streams-prev" }, "‹ Previous");
  const next = h("button", { type: "button", id: "streams-next" }, "Next ›");
  const info = h("span", { id: "streams-page-info" });
  const body = h("div");

  const fetchPage = () => api.page("/queues", {
    page, pageSize: PAGE_SIZE, name: filter.value, columns: FIELDS, sort: "type", reverse: true,
  });
  const refresh = async () => {
    let result;
    try {
      result = await fetchPage();
    } catch (err) {
      // The list shrank below this page (the API answers 400 "page out of range").
      if (err.status !== 400 || page === 1) throw err;
      page = 1;
      result = await fetchPage();
    }
    const streams = result.items.filter((q) => q.type === "stream");
    const more = streams.length === result.items.length && result.page < result.page_count;
    prev.disabled = page <= 1;
    next.disabled = !more;
    const first = (page - 1) * PAGE_SIZE;
    info.textContent = streams.length ? `streams ${first + 1} to ${first + streams.length}` : "no streams";
    fill(body, table([
      { title: "Virtual host", cell: (q) => q.vhost },
      { title: "Name", cell: (q) => link(q.name, "queues", q.vhost, q.name) },
      { title: "State", cell: (q) => q.state },
      { title: "Messages", cell: (q) => num(q.messages), class: "num messages" },
      { title: "Size", cell: (q) => bytes(q.stream?.bytes ?? q.message_bytes), class: "num" },
      { title: "Segments", cell: (q) => num(q.stream?.segments), class: "num" },
      { title: "First offset", cell: (q) => num(q.stream?.first_offset), class: "num" },
      { title: "Last offset", cell: (q) => num(q.stream?.last_offset), class: "num" },
      { title: "Consumers", cell: (q) => num(q.consumers), class: "num" },
      { title: "Incoming", cell: (q) => rate(q.message_stats?.publish_details), class: "num" },
      { title: "Delivered", cell: (q) => rate(q.message_stats?.deliver_get_details), class: "num" },
    ], streams, { id: "streams-table", empty: "no streams", rowAttrs: (q) => ({ "data-name": q.name, "data-vhost": q.vhost }) }));
  };

  const go = (to) => { page = Math.max(1, to); attempt(refresh); };
  let typing = null;
  filter.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => go(1), 250); });
  prev.addEventListener("click", () => go(page - 1));
  next.addEventListener("click", () => go(page + 1));
  main.append(h("h1", {}, "Streams"),
    h("p", { class: "muted" }, "Consumers' offsets and lag are on each stream's page."),
    h("div", { class: "pager", id: "streams-pager" }, filter, prev, info, next), body);
  return refresh;
}
