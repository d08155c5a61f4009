// Admin: users, virtual hosts, permissions, policies, vhost and user limits (list, add,
// delete), and the shovel and federation plugins' sections (links.js). Each section is shown
// to the users the API would answer: administrators see all; policymakers the policies,
// shovel parameters and federation upstreams; monitoring users the shovels' and federation
// links' status.

import * as api from "../api.js";
import { form, h, json, num, select, table } from "../dom.js";
import { input, parseArguments, remove, section, submit, vhostSelect } from "./shared.js";
import { federationStatus, federationUpstreams, shovelManagement, shovelStatus } from "./links.js";

function users() {
  return section("Users", "users", async (refresh) => table([
    { title: "Name", cell: (u) => u.name },
    { title: "Tags", cell: (u) => [u.tags].flat().join(", ") },
    { title: "Limits", cell: (u) => json(u.limits) },
    { title: "", cell: (u) => remove(`/users/${api.seg(u.name)}`, `user ${u.name}`, refresh) },
  ], await api.get("/users"), { id: "users-table", rowAttrs: (u) => ({ "data-name": u.name }) }), (refresh) => {
    const name = input("add-user-name", { required: true });
    const password = input("add-user-password", { type: "password", autocomplete: "new-password" });
    const tags = input("add-user-tags", { placeholder: "administrator, monitoring, policymaker, management" });
    return form({ id: "add-user-form", class: "inline" }, [
      h("label", {}, "Username", name), h("label", {}, "Password", password), h("label", {}, "Tags", tags),
      submit("add-user-submit", "Add user"),
    ], async () => {
      // An empty password: a user who cannot log in with one (RabbitMQ's "no password").
      const body = password.value ? { password: password.value, tags: tags.value } : { password_hash: "", tags: tags.value };
      await api.put(`/users/${api.seg(name.value)}`, body);
      name.value = password.value = tags.value = "";
      await refresh();
    });
  });
}

function vhosts() {
  return section("Virtual hosts", "vhosts", async (refresh) => table([
    { title: "Name", cell: (v) => v.name },
    { title: "Description", cell: (v) => v.description ?? "" },
    { title: "Messages", cell: (v) => num(v.messages), class: "num" },
    { title: "", cell: (v) => remove(`/vhosts/${api.seg(v.name)}`, `virtual host ${v.name} and everything in it`, refresh) },
  ], await api.get("/vhosts"), { id: "vhosts-table", rowAttrs: (v) => ({ "data-name": v.name }) }), (refresh) => {
    const name = input("add-vhost-name", { required: true });
    const description = input("add-vhost-description");
    return form({ id: "add-vhost-form", class: "inline" }, [
      h("label", {}, "Name", name), h("label", {}, "Description", description), submit("add-vhost-submit", "Add virtual host"),
    ], async () => {
      await api.put(`/vhosts/${api.seg(name.value)}`, description.value ? { description: description.value } : {});
      name.value = description.value = "";
      await refresh();
    });
  });
}

function permissions() {
  return section("Permissions", "permissions", async (refresh) => table([
    { title: "User", cell: (p) => p.user },
    { title: "Virtual host", cell: (p) => p.vhost },
    { title: "Configure", cell: (p) => p.configure },
    { title: "Write", cell: (p) => p.write },
    { title: "Read", cell: (p) => p.read },
    { title: "", cell: (p) => remove(`/permissions/${api.seg(p.vhost)}/${api.seg(p.user)}`, `${p.user}'s permissions in ${p.vhost}`, refresh) },
  ], await api.get("/permissions"), { id: "permissions-table" }), (refresh) => {
    const user = input("set-permission-user", { required: true });
    const vhost = vhostSelect("set-permission-vhost");
    const [configure, write, read] = ["configure", "write", "read"].map((k) => input(`set-permission-${k}`, { value: ".*" }));
    return form({ id: "set-permission-form", class: "inline" }, [
      h("label", {}, "User", user), h("label", {}, "Virtual host", vhost), h("label", {}, "Configure", configure),
      h("label", {}, "Write", write), h("label", {}, "Read", read), submit("set-permission-submit", "Set permission"),
    ], async () => {
      await api.put(`/permissions/${api.seg(vhost.value)}/${api.seg(user.value)}`,
        { configure: configure.value, write: write.value, read: read.value });
      await refresh();
    });
  });
}

function policies() {
  return section("Policies", "policies", async (refresh) => table([
    { title: "Virtual host", cell: (p) => p.vhost },
    { title: "Name", cell: (p) => p.name },
    { title: "Pattern", cell: (p) => p.pattern },
    { title: "Apply to", cell: (p) => p["apply-to"] },
    { title: "Definition", cell: (p) => json(p.definition) },
    { title: "Priority", cell: (p) => num(p.priority), class: "num" },
    { title: "", cell: (p) => remove(`/policies/${api.seg(p.vhost)}/${api.seg(p.name)}`, `policy ${p.name}`, refresh) },
  ], await api.get("/policies"), { id: "policies-table", rowAttrs: (p) => ({ "data-name": p.name, "data-vhost": p.vhost }) }), (refresh) => {
    const vhost = vhostSelect("add-policy-vhost");
    const name = input("add-policy-name", { required: true });
    const pattern = input("add-policy-pattern", { required: true });
    const applyTo = select("add-policy-apply-to", [["all", "Exchanges and queues"], ["queues", "Queues"], ["exchanges", "Exchanges"]], "all");
    const priority = input("add-policy-priority", { type: "number", value: "0" });
    const definition = h("textarea", { id: "add-policy-definition", rows: 2, placeholder: "max-length=1000, as key=value lines or JSON" });
    return form({ id: "add-policy-form", class: "inline" }, [
      h("label", {}, "Virtual host", vhost), h("label", {}, "Name", name), h("label", {}, "Pattern", pattern),
      h("label", {}, "Apply to", applyTo), h("label", {}, "Priority", priority), h("label", {}, "Definition", definition),
      submit("add-policy-submit", "Add policy"),
    ], async () => {
      await api.put(`/policies/${api.seg(vhost.value)}/${api.seg(name.value)}`, {
        pattern: pattern.value, "apply-to": applyTo.value, priority: Number(priority.value),
        definition: parseArguments(definition.value),
      });
      name.value = pattern.value = definition.value = "";
      await refresh();
    });
  });
}

// Vhost limits (max-connections, max-queues) or user limits (max-connections, max-channels):
// one row per limit set, as the API lists them per vhost or user.
function limits(kind, owner, names) {
  const base = `/${kind}-limits`;
  return section(kind === "vhost" ? "Virtual host limits" : "User limits", `${kind}-limits`, async (refresh) => {
    const rows = (await api.get(base)).flatMap((item) =>
      Object.entries(item.value).map(([name, value]) => ({ owner: item[owner], name, value })));
    return table([
      { title: kind === "vhost" ? "Virtual host" : "User", cell: (l) => l.owner },
      { title: "Limit", cell: (l) => l.name },
      { title: "Value", cell: (l) => num(l.value), class: "num" },
      { title: "", cell: (l) => remove(`${base}/${api.seg(l.owner)}/${api.seg(l.name)}`, `the ${l.name} limit of ${l.owner}`, refresh) },
    ], rows, { id: `${kind}-limits-table` });
  }, (refresh) => {
    const who = kind === "vhost" ? vhostSelect(`set-${kind}-limit-owner`) : input(`set-${kind}-limit-owner`, { required: true });
    const name = select(`set-${kind}-limit-name`, names, names[0]);
    const value = input(`set-${kind}-limit-value`, { type: "number", required: true });
    return form({ id: `set-${kind}-limit-form`, class: "inline" }, [
      h("label", {}, kind === "vhost" ? "Virtual host" : "User", who), h("label", {}, "Limit", name),
      h("label", {}, "Value", value), submit(`set-${kind}-limit-submit`, "Set limit"),
    ], async () => {
      await api.put(`${base}/${api.seg(who.value)}/${api.seg(name.value)}`, { value: Number(value.value) });
      value.value = "";
      await refresh();
    });
  });
}

export function mount(main, _params, { user }) {
  const admin = api.administers(user);
  const policymaker = api.setsPolicies(user);
  const monitor = api.monitors(user);
  const sections = [
    admin && users(), admin && vhosts(), admin && permissions(), policymaker && policies(),
    admin && limits("vhost", "vhost", ["max-connections", "max-queues"]),
    admin && limits("user", "user", ["max-connections", "max-channels"]),
    monitor && shovelStatus(), policymaker && shovelManagement(),
    monitor && federationStatus(), policymaker && federationUpstreams(),
  ].filter(Boolean);
  main.append(h("h1", {}, "Admin"), ...sections.map((s) => s.element));
  return () => Promise.all(sections.map((s) => s.refresh()));
}
