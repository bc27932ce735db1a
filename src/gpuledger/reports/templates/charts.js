/* gpuledger report charts: draws the charts of the embedded JSON with uPlot (bundled, offline).
 * Drag to zoom (all charts follow), double-click to reset, hover for values.
 * window.gpuledgerCharts lists every chart drawn and its series, for tests and for the curious. */
(function () {
  "use strict";
  var registry = (window.gpuledgerCharts = { ready: false, charts: [], errors: [] });
  var source = document.getElementById("gl-data");
  if (!source) { registry.ready = true; return; }
  var data = JSON.parse(source.textContent);
  var PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d",
                 "#4b5563", "#b45309", "#1d4ed8", "#be123c"];
  var SHADE = { critical: "rgba(220,38,38,0.14)", warning: "rgba(217,119,6,0.15)", info: "rgba(37,99,235,0.10)" };
  var plots = [];
  var syncing = false;

  function colour(s, i) {
    var k = typeof s.gpu === "number" ? s.gpu : i;
    return PALETTE[k % PALETTE.length];
  }

  function alpha(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  // Three significant digits, never exponent notation (as core/units.py): 0.000330, 4.68, 123.
  function sig3(v) {
    if (v === 0) return "0";
    var d = Math.min(8, Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))));
    return v.toFixed(d);
  }

  function fmtValue(unit) {
    return function (u, v) {
      if (v == null) return "–";
      return sig3(v) + (unit ? " " + unit : "");
    };
  }

  // Axis ticks: as many decimals as the tick spacing needs, so a learning-rate axis reads
  // 0.0002 0.0004 ..., not 0 0 0 0. ``seen`` (the chart's registry entry) keeps the labels drawn.
  function axisValues(seen, unit) {
    return function (u, vals) {
      var step = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : Math.abs(vals[0] || 1);
      var d = step > 0 ? Math.min(8, Math.max(0, -Math.floor(Math.log10(step) + 1e-9))) : 2;
      var labels = vals.map(function (v) { return v == null ? "" : v.toFixed(d); });
      seen.ticks[unit] = labels;
      return labels;
    };
  }

  // Evidence spans of the findings that concern this chart.
  function spansFor(chartId) {
    var out = [];
    (data.findings || []).forEach(function (f) {
      (f.evidence || []).forEach(function (e) {
        if (!e.charts || e.charts.length === 0 || e.charts.indexOf(chartId) >= 0) {
          out.push({ t0: e.t0, t1: e.t1, sev: f.severity, n: f.number });
        }
      });
    });
    return out;
  }

  function drawShades(u, spans) {
    var ctx = u.ctx, b = u.bbox;
    ctx.save();
    spans.forEach(function (s) {
      var x0 = Math.max(b.left, u.valToPos(s.t0, "x", true));
      var x1 = Math.min(b.left + b.width, u.valToPos(s.t1, "x", true));
      if (x1 <= x0) x1 = Math.min(b.left + b.width, x0 + 2);
      if (x1 <= b.left || x0 >= b.left + b.width) return;
      ctx.fillStyle = SHADE[s.sev] || SHADE.info;
      ctx.fillRect(x0, b.top, x1 - x0, b.height);
      ctx.fillStyle = "rgba(0,0,0,0.55)";
      ctx.font = 10 * devicePixelRatio + "px system-ui, sans-serif";
      ctx.fillText("#" + s.n, x0 + 2, b.top + 11 * devicePixelRatio);
    });
    ctx.restore();
  }

  function drawBands(u, chart, scaleOf) {
    var ctx = u.ctx, x = chart.x;
    ctx.save();
    chart.series.forEach(function (s, i) {
      if (!s.lo || !s.hi) return;
      ctx.fillStyle = alpha(colour(s, i), 0.16);
      var scale = scaleOf[s.unit];
      var start = -1;
      for (var j = 0; j <= x.length; j++) {
        var ok = j < x.length && s.lo[j] != null && s.hi[j] != null;
        if (ok && start < 0) start = j;
        if ((!ok || j === x.length) && start >= 0) {
          ctx.beginPath();
          for (var k = start; k < j; k++) ctx.lineTo(u.valToPos(x[k], "x", true), u.valToPos(s.hi[k], scale, true));
          for (k = j - 1; k >= start; k--) ctx.lineTo(u.valToPos(x[k], "x", true), u.valToPos(s.lo[k], scale, true));
          ctx.closePath();
          ctx.fill();
          start = -1;
        }
      }
    });
    ctx.restore();
  }

  function drawMarks(u, marks) {
    var ctx = u.ctx, b = u.bbox, lastLabel = -1e9;
    ctx.save();
    ctx.strokeStyle = "rgba(75,85,99,0.45)";
    ctx.setLineDash([4 * devicePixelRatio, 4 * devicePixelRatio]);
    ctx.fillStyle = "rgba(55,65,81,0.9)";
    ctx.font = 10 * devicePixelRatio + "px system-ui, sans-serif";
    marks.forEach(function (m) {
      var px = u.valToPos(m.t, "x", true);
      if (px < b.left || px > b.left + b.width) return;
      ctx.beginPath();
      ctx.moveTo(px, b.top);
      ctx.lineTo(px, b.top + b.height);
      ctx.stroke();
      if (px - lastLabel > 34 * devicePixelRatio) {  // labels only where they do not overlap
        ctx.fillText(m.label, px + 2, b.top + b.height - 3 * devicePixelRatio);
        lastLabel = px;
      }
    });
    ctx.restore();
  }

  function syncZoom(u) {
    if (syncing) return;
    syncing = true;
    var min = u.scales.x.min, max = u.scales.x.max;
    plots.forEach(function (p) {
      if (p !== u && p.gpuledgerTime === u.gpuledgerTime) p.setScale("x", { min: min, max: max });
    });
    syncing = false;
  }

  /* The time axis: whole seconds at least (never millisecond ticks), 24-hour clock in the browser's
   * time zone, the date under the first tick of each day; entry.ticks.x: the labels drawn. */
  var TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
                    172800, 604800];
  function pad2(n) { return (n < 10 ? "0" : "") + n; }
  function timeAxis(entry) {
    return {
      incrs: TIME_INCRS, space: 80,
      values: function (u, ticks, axisIdx, space, incr) {
        var lastDay = null;
        entry.ticks.x = ticks.map(function (t) {
          var d = new Date(t * 1000), day = d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate());
          var clock = pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + (incr < 60 ? ":" + pad2(d.getSeconds()) : "");
          var text = incr >= 86400 ? day : day !== lastDay ? clock + "\n" + day : clock;
          lastDay = day;
          return text;
        });
        return entry.ticks.x;
      },
    };
  }

  function build(chart, container, opts) {
    var entry = { id: chart.id, title: chart.title, ticks: {} };  // what was drawn, for tests (registry)
    var units = [];
    chart.series.forEach(function (s) { if (units.indexOf(s.unit) < 0) units.push(s.unit); });
    var scaleOf = {};
    units.forEach(function (unit, i) { scaleOf[unit] = i === 0 ? "y" : "y" + (i + 1); });
    var isTime = chart.time !== false;
    var series = [{ label: isTime ? "time" : (chart.xlabel || "x") }];
    chart.series.forEach(function (s, i) {
      series.push({
        label: s.label + (s.unit ? " (" + s.unit + ")" : ""),
        stroke: colour(s, i),
        width: 1.4,
        dash: s.dash ? [5, 4] : undefined,
        scale: scaleOf[s.unit],
        spanGaps: chart.group === "metrics" || chart.group === "compare",
        points: { show: chart.x.length < 60 },
        value: fmtValue(s.unit),
      });
    });
    var axes = [isTime ? timeAxis(entry) : { label: chart.xlabel }];
    units.forEach(function (unit, i) {
      axes.push({ scale: scaleOf[unit], label: unit, side: i === 0 ? 3 : 1, grid: { show: i === 0 },
                  size: 56, values: axisValues(entry, unit) });
    });
    var scales = { x: { time: isTime } };
    // Y ranges that hold the bands too (uPlot only sees the lines); percentages stay 0-100.
    units.forEach(function (unit) {
      var lo = Infinity, hi = -Infinity;
      chart.series.forEach(function (s) {
        if (s.unit !== unit) return;
        [s.values, s.lo, s.hi].forEach(function (arr) {
          (arr || []).forEach(function (v) { if (v != null) { if (v < lo) lo = v; if (v > hi) hi = v; } });
        });
      });
      if (lo === Infinity) return;
      if (unit === "%") { lo = Math.min(0, lo); hi = Math.max(100, hi); }
      var pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
      var min = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
      scales[scaleOf[unit]] = { range: [min, unit === "%" ? hi : hi + pad] };
    });
    if (opts.xmin != null && isTime) { scales.x.min = opts.xmin; scales.x.max = opts.xmax; }
    var shades = isTime ? spansFor(chart.id) : [];
    var marks = isTime ? (data.marks || []) : [];
    var arrays = [chart.x].concat(chart.series.map(function (s) { return s.values; }));
    var width = Math.max(320, (container.clientWidth || 900) - 10);  // inside the container's padding
    var u = new uPlot({
      width: width,
      height: 230,
      scales: scales,
      series: series,
      axes: axes,
      cursor: { sync: { key: isTime ? "gl-time" : "gl-x" }, drag: { x: true, y: false } },
      legend: { live: true },
      hooks: {
        drawClear: [function (u) { drawShades(u, shades); drawBands(u, chart, scaleOf); }],
        draw: [function (u) { drawMarks(u, marks); }],
        setScale: [function (u, key) { if (key === "x") syncZoom(u); }],
      },
    }, arrays, container);
    u.gpuledgerTime = isTime;
    plots.push(u);
    entry.series = chart.series.map(function (s) { return s.label; });
    entry.points = chart.x.length;
    entry.shaded = shades.length;
    entry.marks = marks.length;
    entry.drawn = u.series.length - 1;
    registry.charts.push(entry);
  }

  window.gpuledgerZoom = function (t0, t1) {
    var pad = Math.max(5, (t1 - t0) * 0.1);
    plots.forEach(function (p) { if (p.gpuledgerTime) p.setScale("x", { min: t0 - pad, max: t1 + pad }); });
  };
  window.gpuledgerReset = function () {
    plots.forEach(function (p) {
      if (p.gpuledgerTime && data.xmin != null) p.setScale("x", { min: data.xmin, max: data.xmax });
    });
  };

  (data.charts || []).forEach(function (chart) {
    var el = document.getElementById("chart-" + chart.id);
    if (!el) { registry.errors.push("no container for " + chart.id); return; }
    try {
      build(chart, el, { xmin: data.xmin, xmax: data.xmax });
    } catch (err) {
      registry.errors.push(chart.id + ": " + err);
      throw err;
    }
  });
  document.querySelectorAll("[data-zoom]").forEach(function (btn) {
    btn.addEventListener("click", function () {
      var span = btn.getAttribute("data-zoom").split(",");
      window.gpuledgerZoom(parseFloat(span[0]), parseFloat(span[1]));
      document.getElementById("charts").scrollIntoView({ behavior: "smooth" });
    });
  });
  var reset = document.getElementById("zoom-reset");
  if (reset) reset.addEventListener("click", window.gpuledgerReset);
  window.addEventListener("resize", function () {
    plots.forEach(function (p) { p.setSize({ width: Math.max(320, p.root.parentNode.clientWidth - 10), height: 230 }); });
  });
  registry.ready = true;
})();
