
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}
const SVG = "http://www.w3.org/2000/svg";
function sv(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function bytes(text) {
  const raw = atob(text), out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}
// A legend's figure: two significant digits (0.005 read "0.01", and at a
// thousand tokens every maximum read "0.00").
function figure(v) { return v >= 0.1 ? v.toFixed(2) : v.toPrecision(2); }
function floats(text) { const b = bytes(text); return new Float32Array(b.buffer, 0, b.length / 4); }
const CMAPS = {};
for (const [name, text] of Object.entries(D.colormaps)) CMAPS[name] = bytes(text);
function colour(name, t) {
  const i = Math.max(0, Math.min(255, Math.round(t * 255))) * 3, c = CMAPS[name];
  return [c[i], c[i + 1], c[i + 2]];
}
const css = (rgb, a) => a == null ? `rgb(${rgb[0]},${rgb[1]},${rgb[2]})` : `rgba(${rgb[0]},${rgb[1]},${rgb[2]},${a})`;
const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const headColour = (h) => TAB10[h % 10];
// Token labels as shown: blanks and control characters (a newline) visible.
const shown = (t) => t === "" ? "\u2205" : t.replace(/ /g, "\u2423")
  .replace(/[\x00-\x1f\x7f]/g, (c) => c === "\x7f" ? "\u2421" : String.fromCharCode(0x2400 + c.charCodeAt(0)));
const tooltip = $("tooltip");
function showTip(event, text) {
  tooltip.hidden = false; tooltip.textContent = text;
  tooltip.style.left = (event.clientX + 14) + "px"; tooltip.style.top = (event.clientY + 12) + "px";
}
function hideTip() { tooltip.hidden = true; }

// Attention layers: rows quantised to uint8 over their maximum, decoded
// once per head (and once for the mean of heads) when first drawn.
class Layer {
  constructor(spec) {
    Object.assign(this, spec);
    this.codes = bytes(spec.data); this.scales = floats(spec.scale);
    this.cache = new Map();
  }
  matrix(head) {  // head: a number, or "mean" ("all" reads as the mean)
    if (head === "all") head = "mean";
    if (this.cache.has(head)) return this.cache.get(head);
    const size = this.rows * this.cols, out = new Float32Array(size);
    if (head === "mean") {
      for (let h = 0; h < this.heads; h++) {
        const m = this.matrix(h);
        for (let k = 0; k < size; k++) out[k] += m[k] / this.heads;
      }
    } else {
      const base = head * size;
      for (let i = 0; i < this.rows; i++) {
        const scale = this.scales[head * this.rows + i] / 255;
        for (let j = 0; j < this.cols; j++) out[i * this.cols + j] = this.codes[base + i * this.cols + j] * scale;
      }
    }
    this.cache.set(head, out);
    return out;
  }
  row(head, i) { return this.matrix(head).subarray(i * this.cols, (i + 1) * this.cols); }
  column(head, j) {
    const m = this.matrix(head), out = new Float32Array(this.rows);
    for (let i = 0; i < this.rows; i++) out[i] = m[i * this.cols + j];
    return out;
  }
  top(head) {
    const key = "top:" + head;
    if (!this.cache.has(key)) this.cache.set(key, max(this.matrix(head)));
    return this.cache.get(key);
  }
}
const max = (a) => { let m = 0; for (const v of a) if (v > m) m = v; return m; };

// Draws values (rows x cols) into a canvas of that many pixels, coloured.
const min = (a) => { let m = Infinity; for (const v of a) if (v < m) m = v; return m; };
function paint(canvas, values, rows, cols, cmap, stretch) {
  canvas.width = cols; canvas.height = rows;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(cols, rows);
  // Heat maps start at 0; overlays stretch min..max, as the PNG plots do.
  const low = stretch ? min(values) : 0, span = (max(values) - low) || 1;
  const table = CMAPS[cmap], data = img.data;
  for (let k = 0; k < rows * cols; k++) {
    const t = (values[k] - low) / span, c = 3 * Math.max(0, Math.min(255, Math.round(t * 255)));
    data[4 * k] = table[c]; data[4 * k + 1] = table[c + 1]; data[4 * k + 2] = table[c + 2]; data[4 * k + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}
function legend(cmap, low, high, label) {
  const bar = el("canvas", { width: 120, height: 10 });
  const ctx = bar.getContext("2d");
  for (let x = 0; x < 120; x++) { ctx.fillStyle = css(colour(cmap, x / 119)); ctx.fillRect(x, 0, 1, 10); }
  return el("div", { class: "legend" }, el("span", { text: low }), bar, el("span", { text: high }),
    el("span", { text: label || "" }));
}
function select(id, label, options, value, onchange) {
  const s = el("select", { id });
  for (const [v, text] of options) s.append(el("option", { value: v, text }));
  s.value = value;
  s.addEventListener("change", () => onchange(s.value));
  return el("label", {}, label, s);
}
function headOptions(layer, withAll) {
  const o = withAll ? [["all", "all heads"]] : [];
  o.push(["mean", "mean of heads"]);
  for (let h = 0; h < layer.heads; h++) o.push([String(h), `head ${h}`]);
  return o;
}
const parseHead = (v) => (v === "all" || v === "mean") ? v : Number(v);
function panel(title, hint, ...children) {
  return el("section", { class: "panel" }, el("h2", { text: title }), hint ? el("p", { class: "hint", text: hint }) : null, ...children);
}

// Images: the picture once, overlays drawn on a larger canvas.
function imageCanvas(spec) {
  const c = document.createElement("canvas");
  c.width = spec.width; c.height = spec.height;
  const ctx = c.getContext("2d"), img = ctx.createImageData(spec.width, spec.height);
  const px = bytes(spec.pixels);
  for (let k = 0; k < spec.width * spec.height; k++) img.data.set([px[3 * k], px[3 * k + 1], px[3 * k + 2], 255], 4 * k);
  ctx.putImageData(img, 0, 0);
  return c;
}
function heatCanvas(values, rows, cols, cmap, stretch) {
  const c = document.createElement("canvas");
  paint(c, values, rows, cols, cmap, stretch);
  return c;
}
// The picture with a heat map (rows x cols, any size) over it.
function overlay(target, picture, values, rows, cols, alpha, size) {
  const scale = size / Math.max(picture.width, picture.height);
  target.width = Math.round(picture.width * scale); target.height = Math.round(picture.height * scale);
  const ctx = target.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(picture, 0, 0, target.width, target.height);
  if (values) {
    ctx.imageSmoothingEnabled = true; ctx.globalAlpha = alpha;
    ctx.drawImage(heatCanvas(values, rows, cols, "jet", true), 0, 0, target.width, target.height);
    ctx.globalAlpha = 1;
  }
  return scale;
}

const state = {};
const app = $("app"), controls = $("controls");
function init() {
  document.title = D.title;
  $("title").textContent = D.title;
  const kinds = { sequence: "token attention", image: "image attention", detection: "detection (object queries)", graph: "graph attention" };
  $("subtitle").textContent = `${kinds[D.kind]} of model ${D.model}`;
  for (const note of D.notes) $("notes").append(el("li", { text: note }));
  ({ sequence: initSequence, image: initImage, detection: initDetection, graph: initGraph })[D.kind]();
}

// ---------------------------------------------------------------- sequences
function initSequence() {
  const layers = D.layers.map((s) => new Layer(s));
  Object.assign(state, { layers, layer: layers.length - 1, head: "all", focus: null });
  controls.append(
    select("layer", "Layer", layers.map((l, i) => [String(i), `${i}: ${l.name}`]), String(state.layer), (v) => { state.layer = Number(v); refreshHeads(); drawSequence(); }),
    el("span", { id: "headselect" }),
    el("span", { class: "chips", id: "chips" }));
  const left = el("div", { class: "tokens left", id: "queries" });
  const right = el("div", { class: "tokens right", id: "keys" });
  const lines = el("canvas", { id: "lines" });
  app.append(
    panel("Head view", "Lines join each query (left) to the keys (right) it attends to, one colour per head, darker = more attention (relative to the head's largest weight; on long sequences, until you hover, only each query's strongest keys above twice the uniform weight). Hover a token to see only its lines.",
      el("div", { class: "headview" }, left, lines, right)),
    el("div", { style: "display:flex;flex-direction:column;gap:16px" },
      panel("Heat map", "Rows: queries, columns: keys. Hover a cell for its weight.", el("canvas", { id: "heatmap", class: "picture" }), el("div", { id: "heatlegend" })),
      panel("Heads of this layer", "Click a head to select it.", el("div", { class: "grid", id: "heads" }))),
    panel("Model view: every layer and head", "Rows: layers, columns: heads. Click to select.", el("div", { id: "model" })));
  refreshHeads(); drawModelView(); drawSequence();
}
function refreshHeads() {
  const layer = state.layers[state.layer];
  if (state.head !== "all" && state.head !== "mean" && state.head >= layer.heads) state.head = "all";
  const holder = $("headselect"); holder.textContent = "";
  holder.append(select("head", "Head", headOptions(layer, true), String(state.head), (v) => { state.head = parseHead(v); drawSequence(); }));
  const chips = $("chips"); chips.textContent = "";
  for (let h = 0; h < layer.heads; h++) {
    chips.append(el("span", { class: "chip", style: `background:${headColour(h)}`, text: String(h), title: `head ${h}`,
      onclick: () => { state.head = state.head === h ? "all" : h; $("head").value = String(state.head); drawSequence(); } }));
  }
}
function selectedHeads(layer) {
  return state.head === "all" ? [...Array(layer.heads).keys()] : state.head === "mean" ? ["mean"] : [state.head];
}
function drawSequence() {
  const layer = state.layers[state.layer];
  const heads = selectedHeads(layer);
  [...$("chips").children].forEach((c, h) => { c.classList.toggle("off", !(state.head === "all" || state.head === "mean" || state.head === h)); c.classList.toggle("current", state.head === h); });
  // Tokens.
  const makeTokens = (holder, labels, side) => {
    holder.textContent = "";
    labels.forEach((t, i) => holder.append(el("div", { class: "token", text: shown(t), "data-index": i,
      onmouseenter: () => { state.focus = [side, i]; drawLines(); }, onmouseleave: () => { state.focus = null; drawLines(); } })));
  };
  makeTokens($("queries"), layer.queries, "query");
  makeTokens($("keys"), layer.keys, "key");
  drawLines();
  // Heat map of the selected head (mean for all heads).
  const head = state.head === "all" ? "mean" : state.head;
  const values = layer.matrix(head), top = max(values) || 1;
  const heat = $("heatmap");
  const cell = Math.max(2, Math.min(22, Math.floor(440 / Math.max(layer.rows, layer.cols))));
  const labelled = cell >= 9;
  const margin = labelled ? 70 : 4;
  heat.width = margin + layer.cols * cell + 4; heat.height = margin + layer.rows * cell + 4;
  const ctx = heat.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, heat.width, heat.height);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(heatCanvas(values, layer.rows, layer.cols, "viridis"), margin, margin, layer.cols * cell, layer.rows * cell);
  if (labelled) {
    ctx.fillStyle = "#1d2330"; ctx.font = "11px sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    layer.queries.forEach((t, i) => ctx.fillText(shown(t).slice(0, 10), margin - 4, margin + (i + 0.5) * cell));
    ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
    layer.keys.forEach((t, j) => ctx.fillText(shown(t).slice(0, 10), -margin + 4, margin + (j + 0.5) * cell));
    ctx.restore();
  }
  heat.onmousemove = (e) => {
    const r = heat.getBoundingClientRect();
    const j = Math.floor((e.clientX - r.left - margin) / cell), i = Math.floor((e.clientY - r.top - margin) / cell);
    if (i >= 0 && j >= 0 && i < layer.rows && j < layer.cols) showTip(e, `${shown(layer.queries[i])} \u2192 ${shown(layer.keys[j])}: ${values[i * layer.cols + j].toFixed(3)}`);
    else hideTip();
  };
  heat.onmouseleave = hideTip;
  const lg = $("heatlegend"); lg.textContent = "";
  lg.append(legend("viridis", "0", figure(top), head === "mean" ? "mean of heads" : `head ${head}`));
  // Small multiples of this layer's heads.
  const grid = $("heads"); grid.textContent = "";
  const columns = Math.min(layer.heads, 4);
  grid.style.gridTemplateColumns = `repeat(${columns}, auto)`;
  const size = Math.min(160, Math.max(48, Math.floor(360 / columns) - 12));
  for (let h = 0; h < layer.heads; h++) {
    const c = heatCanvas(layer.matrix(h), layer.rows, layer.cols, "viridis");
    c.style.width = size + "px"; c.style.height = Math.round(size * layer.rows / layer.cols) + "px";
    grid.append(el("div", { class: "thumb" + (state.head === h ? " current" : ""), onclick: () => { state.head = h; $("head").value = String(h); drawSequence(); } }, c, el("span", { text: `head ${h}` })));
  }
  document.querySelectorAll("#model canvas").forEach((c) => c.classList.toggle("current", Number(c.dataset.layer) === state.layer && (state.head === "all" || state.head === "mean" || Number(c.dataset.head) === state.head)));
}
const LINES = 3000;
function drawLines() {
  const layer = state.layers[state.layer], heads = selectedHeads(layer);
  const canvas = $("lines"), rowHeight = 18, width = 220;
  canvas.width = width; canvas.height = Math.max(layer.rows, layer.cols) * rowHeight;
  // Drawn off screen, then copied: many strokes on a shown canvas are slow
  // without a GPU.
  const buffer = document.createElement("canvas");
  buffer.width = canvas.width; buffer.height = canvas.height;
  const ctx = buffer.getContext("2d");
  const focus = state.focus;
  const queries = [...$("queries").children], keys = [...$("keys").children];
  queries.forEach((n) => { n.style.background = ""; n.classList.remove("active"); });
  keys.forEach((n) => { n.style.background = ""; n.classList.remove("active"); });
  ctx.lineWidth = focus ? 2 : 1.5;
  // At rest, about LINES lines in all: the strongest keys of each query.
  const perQuery = Math.max(1, Math.min(12, Math.floor(LINES / (layer.rows * heads.length))));
  for (const h of heads) {
    ctx.strokeStyle = h === "mean" ? "#2f6fde" : headColour(h);
    // Opacity relative to the head's largest weight, so long sequences
    // (weights near 1 / length) still show; at most LINES keys per query.
    // Lines are batched into 16 opacity levels: one stroke per level.
    const top = layer.top(h) || 1, levels = Array.from({ length: 16 }, () => new Path2D());
    for (let i = 0; i < layer.rows; i++) {
      if (focus && focus[0] === "query" && focus[1] !== i) continue;
      const row = layer.row(h, i);
      // The keys to draw: the strongest perQuery (ties broken by order).
      let columns = [...Array(layer.cols).keys()];
      if (focus && focus[0] === "key") columns = [focus[1]];
      else if (!focus && perQuery < layer.cols) {
        // Only keys above twice the uniform weight: a flat row draws nothing.
        columns = columns.filter((j) => row[j] * layer.cols > 2).sort((a, b) => row[b] - row[a]).slice(0, perQuery);
      }
      for (const j of columns) {
        const w = row[j] / top;
        if (w < 0.03) continue;
        const path = levels[Math.min(15, Math.floor(w * 16))];
        path.moveTo(2, (i + 0.5) * rowHeight); path.lineTo(width - 2, (j + 0.5) * rowHeight);
      }
    }
    levels.forEach((path, k) => { ctx.globalAlpha = ((k + 0.5) / 16) * (heads.length > 1 ? 0.8 : 1); ctx.stroke(path); });
  }
  canvas.getContext("2d").drawImage(buffer, 0, 0);
  if (focus) {
    const [side, index] = focus;
    const head = state.head === "all" ? "mean" : state.head;
    const values = side === "query" ? layer.row(head, index) : layer.column(head, index);
    const top = max(values) || 1;
    const others = side === "query" ? keys : queries;
    (side === "query" ? queries : keys)[index].classList.add("active");
    others.forEach((n, k) => { if (k < values.length) n.style.background = css(colour("viridis", values[k] / top), 0.2 + 0.6 * values[k] / top); });
  }
}
function drawModelView() {
  const table = el("table", { class: "modelgrid" });
  const maxHeads = Math.max(...state.layers.map((l) => l.heads));
  const size = Math.max(28, Math.min(72, Math.floor(720 / maxHeads)));
  const head = el("tr", {}, el("th"));
  for (let h = 0; h < maxHeads; h++) head.append(el("th", { text: `h${h}` }));
  table.append(head);
  state.layers.forEach((layer, l) => {
    const tr = el("tr", {}, el("th", { text: `L${l}`, title: layer.name }));
    for (let h = 0; h < maxHeads; h++) {
      const td = el("td");
      if (h < layer.heads) {
        const c = heatCanvas(layer.matrix(h), layer.rows, layer.cols, "viridis");
        c.style.width = size + "px"; c.style.height = size + "px";
        c.dataset.layer = l; c.dataset.head = h; c.title = `${layer.name}, head ${h}`;
        c.addEventListener("click", () => { state.layer = l; state.head = h; $("layer").value = String(l); refreshHeads(); $("head").value = String(h); drawSequence(); });
        td.append(c);
      }
      tr.append(td);
    }
    table.append(tr);
  });
  $("model").append(table);
}

// ------------------------------------------------------------------- images
function initImage() {
  const picture = imageCanvas(D.image);
  const layers = D.layers.map((s) => new Layer(s));
  const rollout = D.rollout ? new Layer(D.rollout) : null;
  // The query is a point of the image (or [CLS], or null: the mean of the
  // patches), so that layers on other grids (Swin's stages) show the patch
  // under the same point: `queryIndex`.
  Object.assign(state, { picture, layers, rollout, layer: layers.length - 1, head: "mean", point: null });
  if (D.predicted) $("subtitle").textContent += ` \u2014 predicted: ${D.predicted} (p = ${D.probability})`;
  if (layers.length) {
    const first = layers[0];
    state.point = first.classToken ? { cls: true } : { fy: 0.5, fx: 0.5 };
    controls.append(
      select("layer", "Layer", layers.map((l, i) => [String(i), `${i}: ${l.name}`]), String(state.layer), (v) => { state.layer = Number(v); drawImage(); }),
      select("head", "Head", headOptions(layers[state.layer], false), "mean", (v) => { state.head = parseHead(v); drawImage(); }),
      el("label", {}, el("button", { id: "cls", text: first.classToken ? "query: [CLS] token" : "query: mean of patches",
        onclick: () => { state.point = first.classToken ? { cls: true } : null; drawImage(); } })),
      el("span", { id: "querytext", class: "hint" }));
    const main = el("canvas", { id: "main", class: "picture" });
    main.addEventListener("mousemove", (e) => {
      const layer = state.layers[state.layer], r = main.getBoundingClientRect();
      const fx = (e.clientX - r.left) / r.width, fy = (e.clientY - r.top) / r.height;
      if (fx < 0 || fy < 0 || fx >= 1 || fy >= 1) return;
      const before = queryIndex(layer);
      state.point = { fy, fx };
      if (queryIndex(layer) !== before) drawImage();
    });
    app.append(
      panel("Attention of a patch", "Hover the image to choose the query patch (white square); the overlay is where it attends in the selected layer and head.",
        main, el("div", { id: "mainlegend" })),
      panel("Heads of this layer", "The same query, every head. Click a head to select it.", el("div", { class: "grid", id: "heads" })));
    if (rollout) app.append(panel("Attention rollout", "Attention flow through " + (D.rollout.through || "all layers") + " (Abnar & Zuidema, 2020), mean of heads, for the same query.", el("canvas", { id: "rollout" })));
  }
  if (!layers.length) controls.append(el("span", { class: "hint", text: "No self-attention over patches in this model: its class activation maps and spatial attention maps are below." }));
  if (D.cams.length) {
    const row = el("div", { class: "row", id: "cams" });
    app.append(panel("Class activation maps", `Which pixels raise the score of the predicted class${D.predicted ? " (" + D.predicted + ")" : ""}.`, row, legend("jet", "low", "high")));
    row.append(el("div", { class: "figure" }, overlayCanvas(null), el("span", { text: "image" })));
    for (const cam of D.cams) row.append(el("div", { class: "figure" }, overlayCanvas(bytes(cam.data), cam.rows, cam.cols), el("span", { text: cam.name })));
  }
  if (D.spatial.length) {
    const row = el("div", { class: "row", id: "spatial" });
    app.append(panel("Spatial attention maps", "The spatial maps of CBAM / SpatialAttention layers.", row));
    for (const m of D.spatial) row.append(el("div", { class: "figure" }, overlayCanvas(bytes(m.data), m.rows, m.cols), el("span", { text: m.name })));
  }
  if (layers.length) drawImage();
}
function overlayCanvas(values, rows, cols) {
  const c = el("canvas");
  overlay(c, state.picture, values && Float32Array.from(values), rows, cols, 0.5, 200);
  return c;
}
function queryIndex(layer) {
  // The row of `layer` for the query point: [CLS] (0), the patch under the
  // point on this layer's grid, or null (the mean of the rows).
  const p = state.point;
  if (p == null) return null;
  if (p.cls) return layer.classToken ? 0 : null;
  const [gh, gw] = layer.grid;
  const y = Math.min(gh - 1, Math.floor(p.fy * gh)), x = Math.min(gw - 1, Math.floor(p.fx * gw));
  return (layer.classToken ? 1 : 0) + y * gw + x;
}
function queryRow(layer, head) {
  const q = queryIndex(layer);
  if (q == null) {  // mean of all rows
    const out = new Float32Array(layer.cols);
    for (let i = 0; i < layer.rows; i++) layer.row(head, i).forEach((v, j) => { out[j] += v / layer.rows; });
    return out;
  }
  return layer.row(head, q);
}
function patches(layer, values) { return layer.classToken ? values.slice(1) : values; }
function markQuery(canvas, layer, scale) {
  const q = queryIndex(layer);
  if (q == null || (layer.classToken && q === 0)) return;
  const [gh, gw] = layer.grid, p = q - (layer.classToken ? 1 : 0);
  const cw = canvas.width / gw, ch = canvas.height / gh;
  const ctx = canvas.getContext("2d");
  ctx.strokeStyle = "#fff"; ctx.lineWidth = 2;
  ctx.strokeRect((p % gw) * cw + 1, Math.floor(p / gw) * ch + 1, cw - 2, ch - 2);
}
function drawImage() {
  const layer = state.layers[state.layer];
  const [gh, gw] = layer.grid;
  if (state.head !== "mean" && state.head >= layer.heads) state.head = "mean";
  const hs = $("head");
  hs.textContent = ""; headOptions(layer, false).forEach(([v, t]) => hs.append(el("option", { value: v, text: t })));
  hs.value = String(state.head);
  const values = patches(layer, queryRow(layer, state.head));
  const main = $("main");
  overlay(main, state.picture, values, gh, gw, 0.55, 360);
  markQuery(main, layer);
  const q = queryIndex(layer);
  $("querytext").textContent = q == null ? "query: mean of all patches" : layer.classToken && q === 0 ? "query: [CLS]" : `query: patch (${Math.floor((q - (layer.classToken ? 1 : 0)) / gw)}, ${(q - (layer.classToken ? 1 : 0)) % gw})`;
  const lg = $("mainlegend"); lg.textContent = "";
  lg.append(legend("jet", min(values).toFixed(3), max(values).toFixed(3), "attention weight (min to max)"));
  const grid = $("heads"); grid.textContent = "";
  const columns = Math.min(layer.heads + 1, 4);
  grid.style.gridTemplateColumns = `repeat(${columns}, auto)`;
  for (const h of ["mean", ...Array(layer.heads).keys()]) {
    const c = el("canvas");
    overlay(c, state.picture, patches(layer, queryRow(layer, h)), gh, gw, 0.55, 110);
    markQuery(c, layer);
    grid.append(el("div", { class: "thumb" + (state.head === h ? " current" : ""), onclick: () => { state.head = h; drawImage(); } }, c, el("span", { text: h === "mean" ? "mean" : `head ${h}` })));
  }
  if (state.rollout) {
    const r = state.rollout;
    const values = patches(r, queryRow(r, 0));
    const c = $("rollout");
    overlay(c, state.picture, values, r.grid[0], r.grid[1], 0.55, 240);
    markQuery(c, r);
  }
}

// ---------------------------------------------------------------- detection
function initDetection() {
  const picture = imageCanvas(D.image);
  const layer = new Layer(D.layers[0]);
  Object.assign(state, { picture, layer, head: "mean", active: null, threshold: D.threshold });
  const value = el("span", { id: "thresholdvalue", text: D.threshold.toFixed(2) });
  const slider = el("input", { id: "threshold", type: "range", min: "0", max: "1", step: "0.01", value: String(D.threshold) });
  slider.addEventListener("input", () => { state.threshold = Number(slider.value); value.textContent = state.threshold.toFixed(2); drawDetection(); });
  controls.append(
    select("head", "Head", headOptions(layer, false), "mean", (v) => { state.head = parseHead(v); drawDetection(); }),
    el("label", {}, "Score threshold", slider, value));
  const main = el("canvas", { id: "main", class: "picture" });
  main.addEventListener("mousemove", (e) => {
    const r = main.getBoundingClientRect(), s = main.width / state.picture.width;
    const x = (e.clientX - r.left) / s, y = (e.clientY - r.top) / s;
    // The smallest shown box under the pointer.
    let best = null, area = Infinity;
    for (const o of shownObjects()) {
      const [x0, y0, x1, y1] = o.box, a = (x1 - x0) * (y1 - y0);
      if (x >= x0 && x <= x1 && y >= y0 && y <= y1 && a < area) { best = o.query; area = a; }
    }
    if (best !== state.active) { state.active = best; drawDetection(); }
  });
  main.addEventListener("mouseleave", () => { state.active = null; drawDetection(); });
  app.append(
    panel("Detections", "Hover a box (or a row of the list) to see where its object query looks: the last decoder layer's cross-attention over the feature map.",
      el("div", { class: "row" }, el("div", {}, main, el("div", { id: "mainlegend" })), el("ul", { class: "objects", id: "objects" }))),
    panel("Each detection's attention", "One panel per box above the threshold.", el("div", { class: "row", id: "each" })));
  drawDetection();
}
function shownObjects() { return D.objects.filter((o) => o.score >= state.threshold); }
function drawBox(ctx, o, scale, colour, width, label) {
  const [x0, y0, x1, y1] = o.box.map((v) => v * scale);
  ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
  if (label) {
    ctx.font = "bold 12px sans-serif";
    const text = `${o.label} ${o.score.toFixed(2)}`, w = ctx.measureText(text).width + 6;
    ctx.fillStyle = colour; ctx.fillRect(x0, Math.max(0, y0 - 15), w, 15);
    ctx.fillStyle = "#fff"; ctx.fillText(text, x0 + 3, Math.max(0, y0 - 15) + 12);
  }
}
function drawDetection() {
  const layer = state.layer, [gh, gw] = layer.grid, shown = shownObjects();
  const main = $("main");
  const values = state.active == null ? null : layer.row(state.head, state.active);
  const scale = overlay(main, state.picture, values, gh, gw, 0.55, 420);
  const ctx = main.getContext("2d");
  shown.forEach((o, k) => drawBox(ctx, o, scale, TAB10[k % 10], o.query === state.active ? 4 : 2, true));
  const lg = $("mainlegend"); lg.textContent = "";
  if (values) lg.append(legend("jet", min(values).toFixed(3), max(values).toFixed(3), `query ${state.active}, ${state.head === "mean" ? "mean of heads" : "head " + state.head}`));
  else lg.append(el("span", { class: "hint", text: "hover a box" }));
  const list = $("objects"); list.textContent = "";
  D.objects.forEach((o) => {
    const k = shown.indexOf(o);
    list.append(el("li", { class: (o.query === state.active ? "active " : "") + (k < 0 ? "below" : ""), style: `border-color:${k < 0 ? "#ccc" : TAB10[k % 10]}`,
      text: `${o.label}  ${o.score.toFixed(2)}  (query ${o.query})`, "data-query": o.query,
      onmouseenter: () => { state.active = o.query; drawDetection(); }, onmouseleave: () => { state.active = null; drawDetection(); } }));
  });
  const each = $("each"); each.textContent = "";
  shown.forEach((o, k) => {
    const c = el("canvas");
    const s = overlay(c, state.picture, layer.row(state.head, o.query), gh, gw, 0.55, 150);
    drawBox(c.getContext("2d"), o, s, TAB10[k % 10], 2, false);
    each.append(el("div", { class: "figure" }, c, el("span", { text: `${o.label} ${o.score.toFixed(2)}` })));
  });
  if (!shown.length) each.append(el("span", { class: "hint", text: "no box above the threshold" }));
}

// -------------------------------------------------------------------- graphs
function initGraph() {
  const n = D.nodes.ids.length, src = D.edges.source, dst = D.edges.target;
  const layers = D.layers.map((s) => ({ name: s.name, heads: s.heads, codes: floats(s.data) }));
  Object.assign(state, { layers, layer: 0, head: "mean", focus: null });
  controls.append(
    select("layer", "Layer", layers.map((l, i) => [String(i), `${i}: ${l.name}`]), "0", (v) => { state.layer = Number(v); refreshGraphHeads(); drawGraph(); }),
    el("span", { id: "headselect" }));
  const size = 620, pad = 24;
  const svg = sv("svg", { id: "graph", width: size, height: size, viewBox: `0 0 ${size} ${size}` });
  const X = D.nodes.x.map((v) => pad + v * (size - 2 * pad)), Y = D.nodes.y.map((v) => pad + v * (size - 2 * pad));
  const edgeGroup = sv("g", {}), nodeGroup = sv("g", {});
  svg.append(edgeGroup, nodeGroup);
  state.paths = [];
  for (let e = 0; e < src.length; e++) {
    if (src[e] === dst[e]) { state.paths.push(null); continue; }
    // j -> i drawn as an arc bending to its right, so both directions show.
    const x0 = X[src[e]], y0 = Y[src[e]], x1 = X[dst[e]], y1 = Y[dst[e]];
    const mx = (x0 + x1) / 2 + (y1 - y0) * 0.12, my = (y0 + y1) / 2 - (x1 - x0) * 0.12;
    const p = sv("path", { d: `M${x0},${y0} Q${mx},${my} ${x1},${y1}`, fill: "none", "data-edge": e });
    edgeGroup.append(p); state.paths.push(p);
  }
  const labels = D.nodes.label || D.nodes.predicted;
  state.circles = [];
  for (let i = 0; i < n; i++) {
    const c = sv("circle", { cx: X[i], cy: Y[i], r: n > 150 ? 4 : 7, fill: labels ? TAB10[labels[i] % 10] : "#9ecae1", stroke: "#333", "stroke-width": 0.8, "data-node": i });
    c.addEventListener("mouseenter", () => { state.focus = i; drawGraph(); });
    c.addEventListener("mouseleave", () => { state.focus = null; drawGraph(); });
    nodeGroup.append(c); state.circles.push(c);
    if (n <= 60) { const t = sv("text", { x: X[i], y: Y[i] + 3, "text-anchor": "middle", fill: "#fff" }); t.textContent = D.nodes.ids[i]; nodeGroup.append(t); }
  }
  const key = el("div", { class: "legend", id: "nodelegend" });
  if (labels) {
    const classes = [...new Set(labels)].sort((a, b) => a - b);
    key.append(el("span", { text: D.nodes.label ? "node class:" : "predicted class:" }));
    for (const k of classes) key.append(el("span", { class: "chip", style: `background:${TAB10[k % 10]}`, text: String(k) }));
  }
  app.append(
    panel("Graph attention", "Edge j \u2192 i bends to its right; width and colour: the coefficient \u03b1_ij with which node i attends to its neighbour j. Hover a node to highlight what it attends to.",
      svg, el("div", { id: "edgelegend" }), key),
    el("section", { class: "panel", id: "info" }, el("h2", { text: "Node" }), el("p", { class: "hint", text: "Hover a node." })));
  refreshGraphHeads(); drawGraph();
}
function refreshGraphHeads() {
  const layer = state.layers[state.layer];
  if (state.head !== "mean" && state.head >= layer.heads) state.head = "mean";
  const holder = $("headselect"); holder.textContent = "";
  holder.append(select("head", "Head", headOptions(layer, false), String(state.head), (v) => { state.head = parseHead(v); drawGraph(); }));
}
function coefficient(layer, e) {
  if (state.head === "mean") { let s = 0; for (let h = 0; h < layer.heads; h++) s += layer.codes[e * layer.heads + h]; return s / layer.heads; }
  return layer.codes[e * layer.heads + state.head];
}
function drawGraph() {
  const layer = state.layers[state.layer], src = D.edges.source, dst = D.edges.target;
  const values = src.map((_, e) => coefficient(layer, e));
  let top = 0; values.forEach((v, e) => { if (src[e] !== dst[e] && v > top) top = v; });
  top = top || 1;
  const focus = state.focus;
  const neighbours = new Set();
  state.paths.forEach((p, e) => {
    if (!p) return;
    const t = values[e] / top, incoming = focus != null && dst[e] === focus;
    if (incoming) neighbours.add(src[e]);
    p.setAttribute("stroke", css(colour("viridis", t)));
    p.setAttribute("stroke-width", (0.4 + 4.5 * t) * (incoming ? 1.4 : 1));
    p.setAttribute("stroke-opacity", focus == null ? 0.35 + 0.65 * t : incoming ? 1 : 0.06);
    if (incoming) p.parentNode.append(p);  // on top
  });
  state.circles.forEach((c, i) => {
    const on = focus == null || i === focus || neighbours.has(i);
    c.setAttribute("opacity", on ? 1 : 0.25);
    c.setAttribute("stroke-width", i === focus ? 3 : neighbours.has(i) ? 2 : 0.8);
  });
  const lg = $("edgelegend"); lg.textContent = "";
  lg.append(legend("viridis", "0", figure(top), `attention coefficient, ${state.head === "mean" ? "mean of heads" : "head " + state.head}`));
  const info = $("info"); info.textContent = "";
  if (focus == null) { info.append(el("h2", { text: "Node" }), el("p", { class: "hint", text: "Hover a node to list the neighbours it attends to." })); return; }
  const id = D.nodes.ids[focus];
  const facts = [];
  if (D.nodes.label) facts.push(`class ${D.nodes.label[focus]}`);
  if (D.nodes.predicted) facts.push(`predicted ${D.nodes.predicted[focus]}`);
  info.append(el("h2", { text: `Node ${id}` }), el("p", { class: "hint", text: facts.join(", ") }));
  const rows = [];
  src.forEach((j, e) => { if (dst[e] === focus) rows.push([j, values[e]]); });
  rows.sort((a, b) => b[1] - a[1]);
  const table = el("table", { id: "neighbours" });
  const strongest = rows.length ? rows[0][1] || 1 : 1;
  for (const [j, v] of rows.slice(0, 25)) {
    table.append(el("tr", {}, el("td", { text: j === focus ? `${D.nodes.ids[j]} (itself)` : String(D.nodes.ids[j]) }), el("td", { text: v.toFixed(3) }),
      el("td", { style: "width:90px" }, el("div", { class: "bar", style: `width:${Math.round(90 * v / strongest)}px` }))));
  }
  info.append(table);
  if (rows.length > 25) info.append(el("p", { class: "hint", text: `and ${rows.length - 25} more` }));
}

init();
