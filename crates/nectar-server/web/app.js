// Nectar's observability page: the live expert map, timelines, requests, pressure events and
// the Atlas. Plain JavaScript, no dependencies. Data: /experts/map (binary frame, see
// docs/observability.md), /experts/events (server-sent events, read through fetch so the API
// key travels in a header), /experts.json (the Atlas), /v1/models.
'use strict';

const TIER_COLORS = {
  disk: [64, 72, 88], loading: [245, 150, 60], lru: [70, 140, 255], pinned: [185, 110, 255],
  working: [40, 200, 190], prefetched: [240, 210, 70], mapped: [80, 190, 110],
  vram: [255, 90, 150],
};
const FLASH_MS = 700;
const TIMELINE_POINTS = 180;
const CHARTS = [
  { key: 'decode_tok_s', title: 'decode tok/s', fmt: (v) => v.toFixed(1) },
  { key: 'ttft_ms', title: 'TTFT ms', fmt: (v) => v.toFixed(0) },
  { key: 'hit_rate', title: 'expert hit rate', fmt: (v) => (100 * v).toFixed(1) + ' %', max: 1 },
  { key: 'disk_gb_s', title: 'disk GB/s', fmt: (v) => v.toFixed(2) },
  { key: 'wait_fraction', title: 'I/O wait (share of time)', fmt: (v) => (100 * v).toFixed(0) + ' %', max: 1 },
  { key: 'mtp_acceptance', title: 'MTP acceptance', fmt: (v) => (100 * v).toFixed(0) + ' %', max: 1 },
];

const S = {
  key: localStorage.getItem('nectar-key') || '',
  layers: [], cols: 0, tiers: [],
  cells: null, hits: null, seq: -1, turn: 0,
  flash: null, flashing: false,
  samples: [], pressure: [], requests: [],
  atlas: null, atlasByCell: new Map(),
  cellW: 8, cellH: 8, left: 34, top: 14,
  refreshSoon: false, stopped: false,
};

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- HTTP with the key ----------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (S.key) headers.Authorization = 'Bearer ' + S.key;
  const resp = await fetch(path, Object.assign({}, opts, { headers, cache: 'no-store' }));
  if (resp.status === 401) {
    askKey();
    throw new Unauthorized('unauthorized');
  }
  return resp;
}

function askKey() {
  if (S.stopped) return;
  S.stopped = true;
  $('key-form').hidden = false;
  $('key').focus();
}

$('key-form').addEventListener('submit', (e) => {
  e.preventDefault();
  S.key = $('key').value.trim();
  localStorage.setItem('nectar-key', S.key);
  $('key-form').hidden = true;
  S.stopped = false;
  start();
});

// ---- The expert map ---------------------------------------------------------------------------

function parseFrame(buf) {
  const v = new DataView(buf);
  const magic = String.fromCharCode(v.getUint8(0), v.getUint8(1), v.getUint8(2), v.getUint8(3));
  if (magic !== 'NXM1') throw new Error('not an expert map frame: ' + magic);
  const rows = v.getUint16(4, true), cols = v.getUint16(6, true);
  const seq = Number(v.getBigUint64(8, true)), turn = Number(v.getBigUint64(16, true));
  const layers = [];
  for (let r = 0; r < rows; r++) layers.push(v.getUint16(24 + 2 * r, true));
  const at = 24 + 2 * rows, n = rows * cols;
  const cells = new Uint8Array(buf, at, n);
  const hits = new Uint8Array(buf, at + n, Math.ceil(n / 8));
  return { rows, cols, seq, turn, layers, cells, hits };
}

const isHit = (hits, i) => (hits[i >> 3] & (1 << (i & 7))) !== 0;

async function fetchMap() {
  const resp = await api(S.seq >= 0 ? '/experts/map?since=' + S.seq : '/experts/map');
  if (resp.status === 304 || !resp.ok) return;
  const f = parseFrame(await resp.arrayBuffer());
  const resized = f.layers.length !== S.layers.length || f.cols !== S.cols;
  Object.assign(S, { layers: f.layers, cols: f.cols, cells: f.cells, hits: f.hits, seq: f.seq, turn: f.turn });
  if (resized || !S.flash) {
    S.flash = new Float64Array(f.rows * f.cols);
    layoutGrid();
  }
  $('grid').dataset.seq = String(S.seq);
  drawGrid();
  drawTotals();
  if (S.atlas) drawAtlas();
}

async function pollMap() {
  for (;;) {
    if (S.stopped) return;
    try { await fetchMap(); } catch (e) { if (e instanceof Unauthorized) return; }
    // Soon after hits arrive (the turn plane changed), else once a second.
    for (let i = 0; i < 10 && !S.refreshSoon; i++) await sleep(100);
    if (S.refreshSoon) { S.refreshSoon = false; await sleep(150); }
  }
}

function layoutGrid() {
  const c = $('grid');
  const width = Math.max(320, c.parentElement.clientWidth - 4);
  S.cellW = Math.max(3, Math.min(28, Math.floor((width - S.left) / Math.max(1, S.cols))));
  S.cellH = Math.max(6, Math.min(22, S.cellW));
  c.width = S.left + S.cellW * S.cols;
  c.height = S.top + S.cellH * S.layers.length;
  $('geometry').textContent = `${S.layers.length} layers × ${S.cols} experts`;
}

function tierName(b) { return S.tiers[b >> 5] || 'disk'; }

function cellColor(b, maxHeat) {
  const base = TIER_COLORS[tierName(b)] || TIER_COLORS.disk;
  const heat = b & 31;
  const k = 0.28 + 0.72 * (maxHeat > 0 ? heat / maxHeat : 0);
  return `rgb(${Math.round(base[0] * k)},${Math.round(base[1] * k)},${Math.round(base[2] * k)})`;
}

function drawGrid() {
  if (!S.cells) return;
  const c = $('grid'), g = c.getContext('2d');
  const { cellW: w, cellH: h, left, top, cols } = S;
  g.fillStyle = '#0f1218';
  g.fillRect(0, 0, c.width, c.height);
  g.fillStyle = '#8a94a3';
  g.font = `${Math.min(11, h + 2)}px system-ui, sans-serif`;
  g.textBaseline = 'middle';
  const labelEvery = h >= 10 ? 1 : Math.ceil(10 / h);
  S.layers.forEach((l, r) => {
    if (r % labelEvery === 0 || r === S.layers.length - 1) g.fillText(String(l), 2, top + r * h + h / 2);
  });
  const tickEvery = w >= 16 ? 4 : 32;
  for (let e = 0; e < cols; e += tickEvery) g.fillText(String(e), left + e * w, 6);
  let maxHeat = 0;
  for (const b of S.cells) maxHeat = Math.max(maxHeat, b & 31);
  const now = performance.now();
  const gap = w >= 6 ? 1 : 0;
  const hitRows = new Set();
  let flashing = false;
  for (let r = 0; r < S.layers.length; r++) {
    for (let e = 0; e < cols; e++) {
      const i = r * cols + e, x = left + e * w, y = top + r * h;
      g.fillStyle = cellColor(S.cells[i], maxHeat);
      g.fillRect(x, y, w - gap, h - gap);
      if (isHit(S.hits, i)) {
        hitRows.add(S.layers[r]);
        g.fillStyle = '#ffffff';
        const s = Math.max(2, Math.floor(Math.min(w, h) / 3));
        g.fillRect(x, y, s, s);
      }
      const age = now - S.flash[i];
      if (age < FLASH_MS) {
        flashing = true;
        g.fillStyle = `rgba(255,255,255,${(0.85 * (1 - age / FLASH_MS)).toFixed(3)})`;
        g.fillRect(x, y, w - gap, h - gap);
      }
    }
  }
  c.dataset.hitRows = [...hitRows].sort((a, b) => a - b).join(',');
  if (flashing && !S.flashing) {
    S.flashing = true;
    requestAnimationFrame(() => { S.flashing = false; drawGrid(); });
  }
}

function drawTotals() {
  const counts = {};
  for (const b of S.cells) counts[tierName(b)] = (counts[tierName(b)] || 0) + 1;
  const order = ['vram', 'pinned', 'lru', 'working', 'loading', 'prefetched', 'disk', 'mapped'];
  $('totals').innerHTML = order.filter((t) => counts[t])
    .map((t) => `${t === 'lru' ? 'LRU' : t} <b>${counts[t]}</b>`).join(' · ') +
    ` · turn ${S.turn} · seq ${S.seq}`;
}

function drawLegend() {
  const notes = {
    disk: 'on disk only', loading: 'read in flight', lru: 'LRU cache', pinned: 'pinned',
    working: 'working slot (this wave\'s miss)', prefetched: 'prefetched, unused yet',
    mapped: 'memory-mapped (no budget)', vram: 'in VRAM (computed on the GPU)',
  };
  $('legend').innerHTML = S.tiers.map((t) => {
    const [r, g, b] = TIER_COLORS[t] || TIER_COLORS.disk;
    return `<span style="--c: rgb(${r},${g},${b})">${notes[t] || t}</span>`;
  }).join('');
}

$('grid').addEventListener('mousemove', (ev) => {
  const tip = $('tip');
  const rect = ev.target.getBoundingClientRect();
  const e = Math.floor((ev.clientX - rect.left - S.left) / S.cellW);
  const r = Math.floor((ev.clientY - rect.top - S.top) / S.cellH);
  if (!S.cells || e < 0 || e >= S.cols || r < 0 || r >= S.layers.length) { tip.hidden = true; return; }
  const i = r * S.cols + e, b = S.cells[i], heat = b & 31, layer = S.layers[r];
  const uses = heat === 0 ? 'never selected' : heat === 1 ? 'selected once' : `selected ${2 ** (heat - 1)}–${2 ** heat - 1} times`;
  const a = S.atlasByCell.get(layer + ':' + e);
  tip.innerHTML = `layer ${layer} · expert ${e}<br>${tierName(b)} · ${uses}` +
    (isHit(S.hits, i) ? '<br>selected this turn' : '') +
    (a ? `<br>Atlas: ${esc(a.label)} (spec ${fmtNum(a.spec)})` : '');
  tip.hidden = false;
  tip.style.left = (ev.clientX - rect.left + 14) + 'px';
  tip.style.top = (ev.clientY - rect.top + 10) + 'px';
});
$('grid').addEventListener('mouseleave', () => { $('tip').hidden = true; });
window.addEventListener('resize', () => { if (S.cells) { layoutGrid(); drawGrid(); if (S.atlas) drawAtlas(); } });

// ---- Events -----------------------------------------------------------------------------------

function onEvent(name, data) {
  switch (name) {
    case 'hello':
      S.tiers = data.tiers;
      drawLegend();
      S.samples = data.samples.slice(-TIMELINE_POINTS);
      S.pressure = data.pressure;
      S.requests = data.requests || [];
      drawTimelines(); drawPressure(); drawRequests();
      break;
    case 'turn':
      if (S.hits) S.hits = new Uint8Array(S.hits.length);
      S.turn = data.turn;
      drawGrid();
      break;
    case 'hits': {
      if (!S.flash) break;
      const now = performance.now();
      for (const i of data.cells) {
        if (i < S.flash.length) {
          S.flash[i] = now;
          if (S.hits) S.hits[i >> 3] |= 1 << (i & 7);
        }
      }
      S.refreshSoon = true;
      drawGrid();
      break;
    }
    case 'evictions':
    case 'lagged':
      S.refreshSoon = true;
      break;
    case 'sample':
      S.samples.push(data);
      if (S.samples.length > TIMELINE_POINTS) S.samples.shift();
      drawTimelines();
      break;
    case 'status':
      drawMemory(data.rss, data.budget);
      S.requests = data.requests;
      drawRequests();
      break;
    case 'pressure':
      S.pressure.push(data);
      drawPressure();
      break;
  }
}

async function streamEvents() {
  for (;;) {
    if (S.stopped) return;
    try {
      const resp = await api('/experts/events');
      if (resp.ok && resp.body) {
        setConn(true);
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
          let k;
          while ((k = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, k);
            buf = buf.slice(k + 2);
            let name = 'message', data = [];
            for (const line of block.split('\n')) {
              if (line.startsWith('event:')) name = line.slice(6).trim();
              else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
            }
            if (data.length) {
              try { onEvent(name, JSON.parse(data.join('\n'))); } catch (e) { console.error(e); }
            }
          }
        }
      }
    } catch (e) {
      if (e instanceof Unauthorized) return;
    }
    setConn(false);
    await sleep(2000);
  }
}

function setConn(on) {
  const p = $('conn');
  p.textContent = on ? 'live' : 'offline';
  p.classList.toggle('on', on);
}

// ---- Panels -----------------------------------------------------------------------------------

function drawMemory(rss, budget) {
  const gb = (b) => (b / 1e9).toFixed(2) + ' GB';
  const fill = $('rss-fill');
  if (rss == null) { $('rss-text').textContent = 'not measurable here'; return; }
  if (budget) {
    const f = rss / budget;
    fill.style.width = Math.min(100, 100 * f).toFixed(1) + '%';
    fill.classList.toggle('over', f > 1);
    $('rss-text').textContent = `${gb(rss)} of ${gb(budget)} budget`;
  } else {
    fill.style.width = '0';
    $('rss-text').textContent = `${gb(rss)} (no budget: experts memory-mapped)`;
  }
}

function drawTimelines() {
  const box = $('timelines');
  if (!box.children.length) {
    box.innerHTML = CHARTS.map((c) =>
      `<div class="chart"><div class="title"><span>${c.title}</span><b id="v-${c.key}">–</b></div>` +
      `<canvas id="c-${c.key}" width="280" height="64"></canvas></div>`).join('');
  }
  box.dataset.points = String(S.samples.length);
  for (const c of CHARTS) {
    const pts = S.samples.map((s, i) => [i, s[c.key]]).filter(([, v]) => v != null && isFinite(v));
    const last = pts.length ? pts[pts.length - 1][1] : null;
    $('v-' + c.key).textContent = last == null ? '–' : c.fmt(last);
    const cv = $('c-' + c.key), g = cv.getContext('2d');
    g.clearRect(0, 0, cv.width, cv.height);
    g.strokeStyle = '#262c38';
    g.strokeRect(0.5, 0.5, cv.width - 1, cv.height - 1);
    if (!pts.length) continue;
    const max = c.max || Math.max(...pts.map(([, v]) => v)) * 1.15 || 1;
    const n = Math.max(2, S.samples.length);
    const x = (i) => 2 + (cv.width - 4) * (i / (n - 1));
    const y = (v) => cv.height - 3 - (cv.height - 6) * Math.min(1, v / max);
    g.strokeStyle = '#f5b942';
    g.fillStyle = '#f5b942';
    g.lineWidth = 1.5;
    g.beginPath();
    pts.forEach(([i, v], k) => (k ? g.lineTo(x(i), y(v)) : g.moveTo(x(i), y(v))));
    g.stroke();
    for (const [i, v] of pts) g.fillRect(x(i) - 1, y(v) - 1, 2, 2);
  }
}

function drawRequests() {
  const body = $('requests').querySelector('tbody');
  body.innerHTML = S.requests.map((r) =>
    `<tr><td>${r.id}</td><td>${esc(r.route)}</td><td>${r.prompt_tokens}</td><td>${r.generated_tokens}</td>` +
    `<td>${r.ttft_ms == null ? '–' : r.ttft_ms.toFixed(0)}</td><td>${r.elapsed_ms.toFixed(0)}</td></tr>`).join('');
  $('no-requests').hidden = S.requests.length > 0;
}

function drawPressure() {
  const list = $('pressure');
  list.innerHTML = S.pressure.slice(-50).reverse().map((p) =>
    `<li class="${esc(p.kind)}">${new Date(p.t * 1000).toLocaleTimeString()} · ${esc(p.message)}</li>`).join('');
  $('no-pressure').hidden = S.pressure.length > 0;
}

// ---- The Atlas --------------------------------------------------------------------------------

// Both of Colibri's shapes: analyze.py's {categories, experts: [{layer, expert, total, spec,
// top_topic, top_lift, reliability, p}]} and the web variant {categories, experts: {"L:E":
// {affinity, entropy, top, label}}}.
function normaliseAtlas(j) {
  const cats = j.categories || [];
  let list = [];
  if (Array.isArray(j.experts)) {
    list = j.experts.map((x) => ({
      layer: x.layer, expert: x.expert, topic: x.top_topic, spec: x.spec, lift: x.top_lift,
      reliability: x.reliability, total: x.total,
      label: x.spec >= 0.5 ? 'specialist: ' + x.top_topic : 'generalist',
    }));
  } else if (j.experts && typeof j.experts === 'object') {
    list = Object.entries(j.experts).map(([k, x]) => {
      const [layer, expert] = k.split(':').map(Number);
      const spec = cats.length > 1 && x.entropy != null ? 1 - x.entropy / Math.log2(cats.length) : null;
      return { layer, expert, topic: x.top, spec, lift: null, reliability: null, total: null,
        label: x.label || (x.top ? 'specialist: ' + x.top : 'generalist') };
    });
  }
  return { cats, list: list.filter((x) => Number.isInteger(x.layer) && Number.isInteger(x.expert)) };
}

const fmtNum = (v, d = 2) => (v == null || !isFinite(v) ? '–' : Number(v).toFixed(d));
const esc = (s) => String(s == null ? '' : s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const catColor = (k, n, a = 1) => `hsla(${Math.round((360 * k) / Math.max(1, n))}, 70%, 58%, ${a})`;

async function loadAtlas() {
  const box = $('atlas');
  try {
    const resp = await api('/experts.json');
    if (!resp.ok) {
      let msg = 'The server has no Atlas.';
      try { msg = (await resp.json()).error.message; } catch (_) { /* keep the default */ }
      S.atlas = null;
      S.atlasByCell.clear();
      box.dataset.experts = '0';
      $('atlas-summary').textContent = '';
      box.innerHTML = `<p class="muted" id="atlas-missing">${esc(msg)}</p>` +
        '<pre class="muted small">nectar atlas probe --model DIR --prompts FILE --out OUT\n' +
        'nectar atlas analyze …            (writes experts.json; see the README)\n' +
        'nectar serve --model DIR --atlas OUT/experts.json</pre>';
      return;
    }
    S.atlas = normaliseAtlas(await resp.json());
    S.atlasByCell = new Map(S.atlas.list.map((x) => [x.layer + ':' + x.expert, x]));
    drawAtlas();
  } catch (e) {
    if (!(e instanceof Unauthorized)) box.innerHTML = `<p class="muted">Cannot read the Atlas: ${esc(e.message)}</p>`;
  }
}

function drawAtlas() {
  const { cats, list } = S.atlas;
  const strong = list.filter((x) => x.spec != null && x.spec >= 0.5);
  $('atlas-summary').textContent =
    `${list.length} experts characterised · ${strong.length} specialists (spec ≥ 0.5) · ${cats.length} categories`;
  const box = $('atlas');
  box.dataset.experts = String(list.length);
  const top = [...list].sort((a, b) => (b.spec ?? -1) - (a.spec ?? -1)).slice(0, 40);
  box.innerHTML =
    '<div class="cats">' + cats.map((c, k) => `<span style="--c: ${catColor(k, cats.length)}">${esc(c)}</span>`).join('') + '</div>' +
    '<div class="atlas-cols"><div><canvas id="atlas-grid"></canvas>' +
    '<p class="muted small">Colour: the expert\'s top category; opacity: its specialisation (1 − normalised entropy). Grey: not characterised.</p></div>' +
    '<div><table id="atlas-table"><thead><tr><th>layer</th><th>expert</th><th>label</th><th>confidence</th><th>lift</th><th>fired</th></tr></thead><tbody>' +
    top.map((x) => `<tr><td>${x.layer}</td><td>${x.expert}</td><td>${esc(x.label)}</td>` +
      `<td><span class="conf" style="width:${Math.round(60 * Math.max(0, Math.min(1, x.spec || 0)))}px"></span> ${fmtNum(x.spec)}</td>` +
      `<td>${fmtNum(x.lift, 1)}</td><td>${esc(x.reliability ?? '–')}</td></tr>`).join('') +
    '</tbody></table></div></div>';
  const layers = S.layers.length ? S.layers : [...new Set(list.map((x) => x.layer))].sort((a, b) => a - b);
  const cols = S.cols || 1 + Math.max(0, ...list.map((x) => x.expert));
  const cv = $('atlas-grid'), g = cv.getContext('2d');
  const w = Math.max(2, Math.min(16, Math.floor((box.clientWidth / 2 - 40) / cols)));
  const h = Math.max(5, Math.min(16, w));
  cv.width = 34 + w * cols;
  cv.height = h * layers.length;
  g.fillStyle = '#8a94a3';
  g.font = `${Math.min(11, h + 2)}px system-ui, sans-serif`;
  g.textBaseline = 'middle';
  const every = h >= 10 ? 1 : Math.ceil(10 / h);
  layers.forEach((l, r) => {
    g.fillStyle = '#8a94a3';
    if (r % every === 0) g.fillText(String(l), 2, r * h + h / 2);
    for (let e = 0; e < cols; e++) {
      const x = S.atlasByCell.get(l + ':' + e);
      const k = x ? cats.indexOf(x.topic) : -1;
      g.fillStyle = k >= 0 ? catColor(k, cats.length, 0.15 + 0.85 * Math.max(0, Math.min(1, x.spec || 0))) : '#262c38';
      g.fillRect(34 + e * w, r * h, w - (w > 4 ? 1 : 0), h - 1);
    }
  });
}

$('atlas-reload').addEventListener('click', loadAtlas);

// ---- Start ------------------------------------------------------------------------------------

async function start() {
  try {
    const resp = await api('/v1/models');
    if (resp.ok) {
      const m = (await resp.json()).data[0];
      $('model').textContent = `${m.id} · context ${m.context_length} · parallel ${m.capabilities.parallel}`;
    } else {
      $('model').textContent = 'model loading…';
    }
  } catch (e) {
    if (e instanceof Unauthorized) return;
  }
  streamEvents();
  pollMap();
  loadAtlas();
}

// What the browser test (and a curious user) can read back.
window.nectar = {
  state: S,
  hitRows: () => $('grid').dataset.hitRows,
  timelinePoints: () => S.samples.length,
};

start();
