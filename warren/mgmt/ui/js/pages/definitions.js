// Definitions: export (GET /api/definitions, saved as a file) and import (POST from a file),
// of the whole broker or of one virtual host.

import * as api from "../api.js";
import { form, h, select } from "../dom.js";

// "" (every vhost) or a vhost's name, filled when /api/vhosts answers.
function scope(id) {
  const el = select(id, [["", "All"]], "");
  api.get("/vhosts?columns=name").then((vhosts) => {
    el.append(...vhosts.map((v) => h("option", { value: v.name }, v.name)));
  }, () => { /* all only */ });
  return el;
}

const path = (vhost) => (vhost ? `/definitions/${api.seg(vhost)}` : "/definitions");

function exportForm() {
  const vhost = scope("definitions-export-vhost");
  const name = h("input", { id: "definitions-filename", value: `warren_${location.hostname}_${new Date().toISOString().slice(0, 10)}.json` });
  return form({ id: "definitions-export-form", class: "inline" }, [
    h("label", {}, "Virtual host", vhost), h("label", {}, "File name", name),
    h("button", { type: "submit", id: "definitions-export-submit" }, "Download broker definitions"),
  ], async () => {
    const definitions = await api.get(path(vhost.value));
    const url = URL.createObjectURL(new Blob([JSON.stringify(definitions, null, 2)], { type: "application/json" }));
    const a = h("a", { href: url, download: name.value || "definitions.json" });
    document.body.append(a);
    a.click();
    a.remove();
    URL.revokeObjectURL(url);
  });
}

function importForm() {
  const vhost = scope("definitions-import-vhost");
  const file = h("input", { id: "definitions-file", type: "file", accept: ".json,application/json", required: true });
  const result = h("p", { id: "definitions-result" });
  return form({ id: "definitions-import-form", class: "inline" }, [
    h("label", {}, "Virtual host", vhost), h("label", {}, "Definitions file", file),
    h("button", { type: "submit", id: "definitions-import-submit" }, "Upload broker definitions"), result,
  ], async () => {
    result.textContent = "";
    await api.call("POST", path(vhost.value), await file.files[0].text());
    result.textContent = "Definitions imported.";
  });
}

export function mount(main) {
  main.append(h("h1", {}, "Definitions"),
    h("h2", {}, "Export"), h("p", { class: "muted" },
      "Users, virtual hosts, permissions, parameters, policies, queues, exchanges and bindings, as JSON."),
    exportForm(),
    h("h2", {}, "Import"), h("p", { class: "muted" },
      "Adds what the file defines to the broker; objects already there with the same name are updated."),
    importForm());
  return null;
}
