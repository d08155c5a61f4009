// A list shown a page at a time through the API's pagination (?page=&page_size=&name=):
// the browser never asks for, nor holds, more than one page, however many objects there are.

import * as api from "./api.js";
import { attempt, fill, h, select, table } from "./dom.js";

const PAGE_SIZES = ["20", "100", "500"]; // the API takes at most 500

export class PagedList {
  // prefix: of the element ids (`${prefix}-table`, -filter, -pager, -prev, -next,
  // -page-info, -page-size); noun: what the items are ("queues"); path: the API's list;
  // columns: the table's ({title, cell, class}); fields: the ?columns= asked for;
  // rowAttrs: a row's attributes from its item.
  constructor({ prefix, noun, path, columns, fields = [], rowAttrs }) {
    Object.assign(this, { prefix, noun, path, columns, fields, rowAttrs });
    this.page = 1;
    this.filter = h("input", { id: `${prefix}-filter`, type: "search", placeholder: "Filter by name" });
    this.size = select(`${prefix}-page-size`, PAGE_SIZES, "100");
    this.prev = h("button", { type: "button", id: `${prefix}-prev` }, "‹ Previous");
    this.next = h("button", { type: "button", id: `${prefix}-next` }, "Next ›");
    this.info = h("span", { id: `${prefix}-page-info` });
    this.body = h("div");
    let typing = null;
    this.filter.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => this.go(1), 250); // one request when the user pauses
    });
    this.size.addEventListener("change", () => this.go(1));
    this.prev.addEventListener("click", () => this.go(this.page - 1));
    this.next.addEventListener("click", () => this.go(this.page + 1));
    this.element = h("div", {},
      h("div", { class: "pager", id: `${prefix}-pager` },
        this.filter, this.prev, this.info, this.next, h("label", {}, "Page size ", this.size)),
      this.body);
  }

  go(page) {
    this.page = Math.max(1, page);
    attempt(() => this.refresh());
  }

  async refresh() {
    const query = { page: this.page, pageSize: Number(this.size.value), name: this.filter.value, columns: this.fields };
    let result;
    try {
      result = await api.page(this.path, query);
    } catch (err) {
      // The list shrank below this page (the API answers 400 "page out of range").
      if (err.status !== 400 || this.page === 1) throw err;
      this.page = 1;
      result = await api.page(this.path, { ...query, page: 1 });
    }
    this.page = result.page;
    this.prev.disabled = result.page <= 1;
    this.next.disabled = result.page >= result.page_count;
    this.info.textContent = `page ${result.page} of ${result.page_count}, ${result.filtered_count} ${this.noun}`;
    this.info.title = `${result.total_count} ${this.noun} in all`;
    fill(this.body, table(this.columns, result.items, { id: `${this.prefix}-table`, rowAttrs: this.rowAttrs }));
    return result;
  }
}
