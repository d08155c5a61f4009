// Small live line charts drawn as inline SVG. The API gives the current figures only (and
// rates as *_details.rate), so the history is kept here, one sample per refresh, for as long
// as the tab lives: leaving a page and coming back continues its charts.

import { h } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 140;
const PAD = { left: 48, right: 8, top: 8, bottom: 18 };
const KEEP = 120; // samples per chart: 10 minutes at the default 5 s
const COLOURS = ["#e6550d", "#3182bd", "#31a354", "#756bb1", "#d6616b", "#636363", "#bcbd22", "#17becf"];

const histories = new Map(); // chart key -> [{t, values}]

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}

function short(value) {
  if (value >= 1e9) return `${+(value / 1e9).toFixed(1)}G`;
  if (value >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (value >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
  return `${+value.toFixed(value < 10 ? 1 : 0)}`;
}

export class Chart {
  // id: the <svg>'s id; series: the names drawn, in order; key: whose history (e.g. a
  // queue's), so two queues' pages do not share one; unit: shown after values ("/s").
  constructor(id, series, { key = id, unit = "" } = {}) {
    this.series = series;
    this.unit = unit;
    if (!histories.has(key)) histories.set(key, []);
    this.samples = histories.get(key);
    this.svg = svg("svg", { id, viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: WIDTH, height: HEIGHT, role: "img" });
    this.legend = h("div", { class: "legend" });
    this.element = h("div", { class: "chart" }, this.svg, this.legend);
    this.draw();
  }

  // Add one sample: {series name: number}; missing series count as 0.
  add(values) {
    const sample = {};
    for (const name of this.series) sample[name] = Number(values[name]) || 0;
    this.samples.push({ t: Date.now(), values: sample });
    if (this.samples.length > KEEP) this.samples.splice(0, this.samples.length - KEEP);
    this.draw();
  }

  draw() {
    const samples = this.samples;
    const latest = samples.length ? samples[samples.length - 1].values : {};
    this.svg.setAttribute("data-samples", String(samples.length));
    this.svg.setAttribute("data-latest", JSON.stringify(latest));
    this.svg.replaceChildren();
    const top = Math.max(1, ...samples.flatMap((s) => Object.values(s.values)));
    const x0 = PAD.left, x1 = WIDTH - PAD.right, y0 = HEIGHT - PAD.bottom, y1 = PAD.top;
    const first = samples.length ? samples[0].t : 0;
    const span = samples.length > 1 ? samples[samples.length - 1].t - first : 1;
    const x = (t) => (samples.length > 1 ? x0 + ((t - first) / span) * (x1 - x0) : x1);
    const y = (v) => y0 - (v / top) * (y0 - y1);

    for (const [value, at] of [[top, y1], [top / 2, (y0 + y1) / 2], [0, y0]]) {
      this.svg.append(svg("line", { x1: x0, x2: x1, y1: at, y2: at, stroke: "#e5e5e5" }));
      const label = svg("text", { x: x0 - 4, y: at + 4, "text-anchor": "end", "font-size": 11, fill: "#666" });
      label.textContent = short(value) + this.unit;
      this.svg.append(label);
    }
    const seconds = Math.round(span / 1000);
    if (samples.length > 1 && seconds > 0) {
      const label = svg("text", { x: x0, y: HEIGHT - 4, "font-size": 11, fill: "#666" });
      label.textContent = `last ${seconds} s`;
      this.svg.append(label);
    }
    this.series.forEach((name, i) => {
      const colour = COLOURS[i % COLOURS.length];
      const points = samples.map((s) => `${x(s.t).toFixed(1)},${y(s.values[name]).toFixed(1)}`);
      if (points.length === 1) {
        const [cx, cy] = points[0].split(",");
        this.svg.append(svg("circle", { cx, cy, r: 2.5, fill: colour, "data-series": name }));
      } else if (points.length) {
        this.svg.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour, "stroke-width": 1.5, "data-series": name }));
      }
    });
    this.legend.replaceChildren(...this.series.map((name, i) => {
      const swatch = h("span", { class: "swatch" });
      swatch.style.background = COLOURS[i % COLOURS.length];
      const value = name in latest ? ` ${short(latest[name])}${this.unit}` : "";
      return h("span", {}, swatch, name, h("b", {}, value));
    }));
  }
}

// The rates of a message_stats object as chart values: {publish: rate, ...}.
export function rates(stats, names) {
  const out = {};
  for (const name of names) out[name] = stats?.[`${name}_details`]?.rate ?? 0;
  return out;
}
