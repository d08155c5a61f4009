// Exchanges: the list, adding one, and an exchange's page (bindings, publish, delete).

import * as api from "../api.js";
import { button, fill, form, h, json, kv, link, rate, select, yesNo } from "../dom.js";
import { PagedList } from "../paged.js";
import { bindForm, bindingsTable, exchangeLabel, exchangePath, parseArguments, vhostSelect } from "./shared.js";

const TYPES = ["direct", "fanout", "topic", "headers", "x-consistent-hash"];

function addForm(after) {
  const vhost = vhostSelect("add-exchange-vhost");
  const name = h("input", { id: "add-exchange-name", required: true });
  const type = select("add-exchange-type", TYPES, "direct");
  const durable = select("add-exchange-durable", [["true", "Durable"], ["false", "Transient"]], "true");
  const autoDelete = select("add-exchange-auto-delete", [["false", "No"], ["true", "Yes"]], "false");
  const internal = select("add-exchange-internal", [["false", "No"], ["true", "Yes"]], "false");
  const args = h("textarea", { id: "add-exchange-arguments", rows: 2, placeholder: "key=value lines or a JSON object" });
  return form({ id: "add-exchange-form", class: "inline" }, [
    h("label", {}, "Virtual host", vhost), h("label", {}, "Name", name), h("label", {}, "Type", type),
    h("label", {}, "Durability", durable), h("label", {}, "Auto delete", autoDelete),
    h("label", {}, "Internal", internal), h("label", {}, "Arguments", args),
    h("button", { type: "submit", id: "add-exchange-submit" }, "Add exchange"),
  ], async () => {
    await api.put(`/exchanges/${api.seg(vhost.value)}/${api.seg(name.value)}`, {
      type: type.value, durable: durable.value === "true", auto_delete: autoDelete.value === "true",
      internal: internal.value === "true", arguments: parseArguments(args.value),
    });
    name.value = args.value = "";
    await after();
  });
}

export function mountList(main) {
  const list = new PagedList({
    prefix: "exchanges", noun: "exchanges", path: "/exchanges",
    columns: [
      { title: "Virtual host", cell: (x) => x.vhost },
      { title: "Name", cell: (x) => link(exchangeLabel(x.name), "exchanges", x.vhost, exchangePath(x.name)) },
      { title: "Type", cell: (x) => x.type },
      { title: "Features", cell: (x) => [x.durable && "D", x.auto_delete && "AD", x.internal && "I"].filter(Boolean).join(" ") },
      { title: "Policy", cell: (x) => x.policy ?? "" },
      { title: "Publish in", cell: (x) => rate(x.message_stats?.publish_in_details), class: "num" },
      { title: "Publish out", cell: (x) => rate(x.message_stats?.publish_out_details), class: "num" },
    ],
    rowAttrs: (x) => ({ "data-name": x.name, "data-vhost": x.vhost }),
  });
  main.append(h("h1", {}, "Exchanges"), list.element, h("h2", {}, "Add a new exchange"), addForm(() => list.refresh()));
  return () => list.refresh();
}

function publishForm(vhost, name) {
  const key = h("input", { id: "publish-routing-key" });
  const mode = select("publish-delivery-mode", [["1", "1 - Non-persistent"], ["2", "2 - Persistent"]], "1");
  const headers = h("textarea", { id: "publish-headers", rows: 2, placeholder: "key=value lines or a JSON object" });
  const props = h("textarea", { id: "publish-properties", rows: 2, placeholder: "content_type=text/plain, as key=value lines or JSON" });
  const payload = h("textarea", { id: "publish-payload", rows: 4 });
  const result = h("p", { id: "publish-result" });
  const el = form({ id: "publish-form", class: "stack" }, [
    h("label", {}, "Routing key", key), h("label", {}, "Delivery mode", mode),
    h("label", {}, "Headers", headers), h("label", {}, "Properties", props), h("label", {}, "Payload", payload),
    h("div", {}, h("button", { type: "submit", id: "publish-submit" }, "Publish message")), result,
  ], async () => {
    result.textContent = "";
    const properties = { ...parseArguments(props.value), delivery_mode: Number(mode.value) };
    const extra = parseArguments(headers.value);
    if (Object.keys(extra).length) properties.headers = extra;
    const answer = await api.post(`/exchanges/${api.seg(vhost)}/${api.seg(name)}/publish`, {
      properties, routing_key: key.value, payload: payload.value, payload_encoding: "string",
    });
    result.textContent = answer.routed ? "Message published." : "Message published, but not routed.";
  });
  return el;
}

export function mountOne(main, [vhost, name], { leaving }) {
  const path = `/exchanges/${api.seg(vhost)}/${api.seg(name)}`;
  const details = h("div");
  const bindings = h("div", { id: "exchange-bindings" });
  const refresh = async () => {
    const [x, source, destination] = await Promise.all([
      api.get(path), api.get(`${path}/bindings/source`), api.get(`${path}/bindings/destination`)]);
    fill(details, kv([
      ["Virtual host", x.vhost], ["Type", x.type], ["Durable", yesNo(x.durable)],
      ["Auto delete", yesNo(x.auto_delete)], ["Internal", yesNo(x.internal)],
      ["Arguments", json(x.arguments)], ["Policy", x.policy ?? ""],
      ["Publish in", rate(x.message_stats?.publish_in_details)], ["Publish out", rate(x.message_stats?.publish_out_details)],
    ]));
    fill(bindings, h("h3", {}, "From this exchange"), bindingsTable(source, refresh),
      h("h3", {}, "To this exchange"), bindingsTable(destination, refresh));
  };
  const isDefault = name === "amq.default";
  main.append(
    h("h1", {}, "Exchange ", h("b", {}, exchangeLabel(isDefault ? "" : name))), details,
    h("h2", {}, "Bindings"), bindings, !isDefault && bindForm({ vhost, source: name }, refresh),
    h("h2", {}, "Publish message"), publishForm(vhost, name),
    !isDefault && h("h2", {}, "Delete"),
    !isDefault && button("Delete this exchange", async () => {
      await leaving();
      await api.del(path);
      location.hash = "#/exchanges";
    }, { id: "delete-exchange-submit", danger: true, question: `Delete exchange ${name}?` }));
  return refresh;
}
