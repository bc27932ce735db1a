/* gpuledger dashboard: the run report's charts (reports/charts.py: same ids, titles and units),
 * computed in the browser from the interval rows of GET /runs/{id}/intervals so they can grow
 * while the run records. Integrals become rates over each interval; gauges are drawn as recorded.
 * Long runs are merged into at most MAX_POINTS buckets per series (sums for integrals, peaks for
 * gauges), like the report's downsampling. Absent measurements are gaps (null), never 0. */
(function () {
  "use strict";
  var GIB = 1073741824, MB = 1e6, MAX_POINTS = 1500;
  var PERF_THROTTLE = ["power", "thermal", "hw_slowdown", "hw_power_brake", "board_limit", "reliability"];
  var PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d",
                 "#4b5563", "#b45309", "#1d4ed8", "#be123c"];
  var METRIC_GROUPS = [
    ["losses", "Training losses", function (k) { return k.toLowerCase().indexOf("loss") >= 0; }],
    ["quality", "Validation metrics (mAP, precision, recall)", function (k) { return k.indexOf("metrics/") === 0; }],
    ["lr", "Learning rate", function (k) { return k.indexOf("lr/") === 0 || k === "lr"; }],
    ["other_metrics", "Other metrics", function () { return true; }],
  ];

  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }
  function span(r) { return Math.max(0, r.t1 - r.t0); }
  function sum(a, b) { return a === null ? b : b === null ? a : a + b; }
  function max(a, b) { return a === null ? b : b === null ? a : Math.max(a, b); }
  function round(v, d) { if (v === null) return null; var f = Math.pow(10, d); return Math.round(v * f) / f; }

  /* Merge consecutive rows into buckets of equal time width when there are too many. */
  function bucketed(rows, fields, width) {
    if (!width) return rows;
    var out = [], cur = null, key = null;
    rows.forEach(function (r) {
      var k = Math.floor(r.t1 / width);
      if (k !== key) { if (cur) out.push(cur); cur = { t0: r.t0, t1: r.t1, _lo: {} }; key = k; }
      cur.t1 = r.t1;
      fields.sums.forEach(function (f) { cur[f] = sum(cur[f] === undefined ? null : cur[f], num(r[f])); });
      fields.peaks.forEach(function (f) { cur[f] = max(cur[f] === undefined ? null : cur[f], num(r[f])); });
      if (fields.throttle) {
        var t = throttleOf(r);
        if (t !== null) {
          cur.throttle_perf = (cur.throttle_perf || 0) + t;
        }
      }
      if (fields.weighted) {
        fields.weighted.forEach(function (f) {
          var v = num(r[f]);
          if (v !== null) {
            cur["_w_" + f] = (cur["_w_" + f] || 0) + v * span(r);
            cur["_s_" + f] = (cur["_s_" + f] || 0) + span(r);
          }
        });
      }
    });
    if (cur) out.push(cur);
    out.forEach(function (b) {
      (fields.weighted || []).forEach(function (f) { b[f] = b["_s_" + f] ? b["_w_" + f] / b["_s_" + f] : null; });
    });
    return out;
  }

  function throttleOf(r) {
    var t = r.throttle_s;
    if (typeof t === "string") { try { t = JSON.parse(t); } catch (e) { t = null; } }
    if (!t || typeof t !== "object") return null;
    var s = 0;
    PERF_THROTTLE.forEach(function (k) { if (num(t[k]) !== null) s += t[k]; });
    return s;
  }

  function width(rows, first, last) {
    if (rows.length <= MAX_POINTS) return 0;
    return Math.max(1, (last - first) / MAX_POINTS);
  }

  var GPU_FIELDS = { sums: ["busy_s"], peaks: ["mem_used_max_b", "proc_mem_max_b", "power_max_w", "temp_max_c"],
                     weighted: ["sm_clock_avg_mhz"], throttle: true };
  var HOST_FIELDS = { sums: ["cpu_s", "iowait_s", "read_b", "write_b", "disk_read_b", "disk_write_b", "net_rx_b",
                             "net_tx_b"],
                      peaks: ["rss_max_b", "sys_mem_used_max_b"], weighted: ["sys_cpu_util_avg_pct"] };

  function series(label, unit, values, gpu, dash) {
    return { label: label, unit: unit, values: values, gpu: gpu, dash: !!dash };
  }
  function hasData(chart) {
    return chart.series.some(function (s) { return s.values.some(function (v) { return v !== null; }); });
  }

  /* gpu: {uuid: [rows sorted by seq]}, devices: {uuid: index} */
  function gpuCharts(gpu, devices) {
    var uuids = Object.keys(gpu).sort(function (a, b) {
      var ia = devices[a] === undefined ? 1e9 : devices[a], ib = devices[b] === undefined ? 1e9 : devices[b];
      return ia - ib || (a < b ? -1 : 1);
    });
    if (!uuids.length) return [];
    var all = [].concat.apply([], uuids.map(function (u) { return gpu[u]; }));
    var first = Math.min.apply(null, all.map(function (r) { return r.t0; }));
    var last = Math.max.apply(null, all.map(function (r) { return r.t1; }));
    var longest = Math.max.apply(null, uuids.map(function (u) { return gpu[u].length; }));
    var w = longest > MAX_POINTS ? Math.max(1, (last - first) / MAX_POINTS) : 0;
    var per = {}, xs = {};
    uuids.forEach(function (u) {
      per[u] = {};
      bucketed(gpu[u], GPU_FIELDS, w).forEach(function (b) {
        var x = round(b.t1, 3);
        xs[x] = true;
        per[u][x] = b;
      });
    });
    var x = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    function col(u, get, d) {
      return x.map(function (t) { var b = per[u][t]; return b ? round(num(get(b)), d) : null; });
    }
    function label(u) { return devices[u] === undefined ? "GPU " + u.slice(0, 12) : "GPU " + devices[u]; }
    function idx(u) { return devices[u] === undefined ? null : devices[u]; }
    function chart(id, title, make) {
      var c = { id: id, title: title, group: "gpu", x: x, series: [] };
      uuids.forEach(function (u) { c.series = c.series.concat(make(u, label(u), idx(u))); });
      return c;
    }
    function rate(get, scale) {
      return function (b) { var v = num(get(b)); return v === null || span(b) <= 0 ? null : (v / span(b)) * (scale || 1); };
    }
    function gib(f) { return function (b) { var v = num(b[f]); return v === null ? null : v / GIB; }; }
    var charts = [
      chart("gpu_util", "GPU utilisation (busy share)", function (u, l, i) {
        return [series(l, "%", col(u, rate(function (b) { return b.busy_s; }, 100), 1), i)];
      }),
      chart("vram", "GPU memory: device (solid) and this run's processes (dashed)", function (u, l, i) {
        return [series(l, "GiB", col(u, gib("mem_used_max_b"), 3), i),
                series(l + " run", "GiB", col(u, gib("proc_mem_max_b"), 3), i, true)];
      }),
      chart("power", "GPU power (peak per interval)", function (u, l, i) {
        return [series(l, "W", col(u, function (b) { return b.power_max_w; }, 1), i)];
      }),
      chart("temp", "GPU temperature (peak)", function (u, l, i) {
        return [series(l, "°C", col(u, function (b) { return b.temp_max_c; }, 1), i)];
      }),
      chart("clocks", "SM clock (mean)", function (u, l, i) {
        return [series(l, "MHz", col(u, function (b) { return b.sm_clock_avg_mhz; }, 0), i)];
      }),
      chart("throttle", "Throttled by power or thermal limits (share of time)", function (u, l, i) {
        return [series(l, "%", col(u, function (b) {
          var t = b.throttle_perf === undefined ? throttleOf(b) : b.throttle_perf;
          return t === null || t === undefined || span(b) <= 0 ? null : Math.min(100, (100 * t) / span(b));
        }, 1), i)];
      }),
    ];
    return charts.filter(hasData);
  }

  function hostCharts(host) {
    if (!host.length) return [];
    var w = width(host, host[0].t0, host[host.length - 1].t1);
    var rows = bucketed(host, HOST_FIELDS, w);
    var x = rows.map(function (b) { return round(b.t1, 3); });
    function col(get, d) { return rows.map(function (b) { return round(num(get(b)), d); }); }
    function rate(f, scale) {
      return function (b) { var v = num(b[f]); return v === null || span(b) <= 0 ? null : v / span(b) / (scale || 1); };
    }
    function gib(f) { return function (b) { var v = num(b[f]); return v === null ? null : v / GIB; }; }
    var charts = [
      { id: "cpu", title: "CPU", group: "host", x: x, series: [
        series("training processes", "cores", col(rate("cpu_s"), 2)),
        series("host iowait", "cores", col(rate("iowait_s"), 2), null, true),
        series("whole host", "%", col(function (b) { return b.sys_cpu_util_avg_pct; }, 1), null, true)] },
      { id: "ram", title: "Memory: training processes (RSS) and whole host", group: "host", x: x, series: [
        series("training processes", "GiB", col(gib("rss_max_b"), 3)),
        series("whole host", "GiB", col(gib("sys_mem_used_max_b"), 3), null, true)] },
      { id: "disk", title: "Storage I/O", group: "host", x: x, series: [
        series("processes read", "MB/s", col(rate("read_b", MB), 3)),
        series("processes write", "MB/s", col(rate("write_b", MB), 3)),
        series("host disk read", "MB/s", col(rate("disk_read_b", MB), 3), null, true),
        series("host disk write", "MB/s", col(rate("disk_write_b", MB), 3), null, true)] },
      { id: "net", title: "Network (host)", group: "host", x: x, series: [
        series("received", "MB/s", col(rate("net_rx_b", MB), 3)),
        series("sent", "MB/s", col(rate("net_tx_b", MB), 3))] },
    ];
    return charts.filter(hasData);
  }

  /* metrics: [{t, key, value, epoch}], epochT: {epoch: t of its epoch_end event} */
  function metricCharts(metrics, epochT) {
    var byKey = {};
    metrics.forEach(function (m) {
      var v = num(m.value);
      var t = m.epoch !== null && m.epoch !== undefined && epochT[m.epoch] !== undefined ? epochT[m.epoch] : m.t;
      (byKey[m.key] = byKey[m.key] || {})[round(t, 3)] = v;
    });
    var groups = {};
    Object.keys(byKey).sort().forEach(function (k) {
      var g = METRIC_GROUPS.filter(function (mg) { return mg[2](k); })[0];
      (groups[g[0]] = groups[g[0]] || []).push(k);
    });
    var out = [];
    METRIC_GROUPS.forEach(function (mg) {
      var keys = groups[mg[0]];
      if (!keys) return;
      var xs = {};
      keys.forEach(function (k) { Object.keys(byKey[k]).forEach(function (t) { xs[t] = true; }); });
      var x = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
      out.push({ id: mg[0], title: mg[1], group: "metrics", x: x, series: keys.map(function (k) {
        return series(k, "", x.map(function (t) { var v = byKey[k][t]; return v === undefined ? null : v; }));
      }) });
    });
    return out;
  }

  /* -- drawing ----------------------------------------------------------------------------- */
  function colour(s, i) { return PALETTE[(typeof s.gpu === "number" ? s.gpu : i) % PALETTE.length]; }
  function fmtValue(unit) {
    return function (u, v) {
      if (v === null || v === undefined) return "–";
      return GLFmt.number(v) + (unit ? " " + unit : "");
    };
  }

  /* The time axis: whole seconds at least (never millisecond ticks), 24-hour clock, the date under
   * the first tick and wherever the day changes. */
  var TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
                    172800, 604800];
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function timeAxis(shown) {  // shown(texts): told the labels drawn (the tests read them)
    return {
      incrs: TIME_INCRS, space: 80,
      values: function (u, ticks, axisIdx, space, incr) {
        var lastDay = null;
        var texts = ticks.map(function (t) {
          var d = new Date(t * 1000), day = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
          var clock = pad(d.getHours()) + ":" + pad(d.getMinutes()) + (incr < 60 ? ":" + pad(d.getSeconds()) : "");
          var text = incr >= 86400 ? day : day !== lastDay ? clock + "\n" + day : clock;
          lastDay = day;
          return text;
        });
        shown(texts);
        return texts;
      },
    };
  }
  function chartWidth(box) { return Math.max(300, (box.clientWidth || 560) - 10); }  // inside the padding

  function Board(container) {
    this.container = container;
    this.plots = {};  // chart id -> {u, signature, box}
    this.syncing = false;
    this.span = null;  // [start, end] of the run, epoch seconds
    this.registry = (window.gpuledgerCharts = { ready: false, charts: [], errors: [], updates: 0, xticks: {} });
    var self = this;
    if (window.ResizeObserver) new ResizeObserver(function () { self.resize(); }).observe(container);
  }

  Board.prototype.options = function (chart, widthPx) {
    var units = [];
    chart.series.forEach(function (s) { if (units.indexOf(s.unit) < 0) units.push(s.unit); });
    var scaleOf = {};
    units.forEach(function (unit, i) { scaleOf[unit] = i === 0 ? "y" : "y" + (i + 1); });
    var self = this;
    var series = [{ label: "time" }].concat(chart.series.map(function (s, i) {
      return { label: s.label + (s.unit ? " (" + s.unit + ")" : ""), stroke: colour(s, i), width: 1.4,
               dash: s.dash ? [5, 4] : undefined, scale: scaleOf[s.unit], spanGaps: chart.group === "metrics",
               points: { show: chart.x.length < 60 }, value: fmtValue(s.unit) };
    }));
    var registry = this.registry;
    var axes = [timeAxis(function (texts) { registry.xticks[chart.id] = texts; })].concat(units.map(function (unit, i) {
      return { scale: scaleOf[unit], label: unit, side: i === 0 ? 3 : 1, grid: { show: i === 0 }, size: 56,
               values: function (u, vals) { return vals.map(function (v) { return v === null ? "" : GLFmt.tick(v); }); } };
    }));
    return {
      width: widthPx, height: 230, series: series, axes: axes, scales: { x: { time: true } },
      cursor: { sync: { key: "gl-dash-time" }, drag: { x: true, y: false } },
      legend: { live: true },
      hooks: { setScale: [function (u, key) { if (key === "x") self.syncZoom(u); }] },
    };
  };

  Board.prototype.syncZoom = function (u) {
    if (this.syncing || !u.gpuledgerZoomed) return;
    this.syncing = true;
    var plots = this.plots;
    Object.keys(plots).forEach(function (id) {
      var p = plots[id].u;
      if (p !== u) { p.gpuledgerZoomed = true; p.setScale("x", { min: u.scales.x.min, max: u.scales.x.max }); }
    });
    this.syncing = false;
  };

  Board.prototype.section = function (group) {
    var id = "group-" + group;
    var box = document.getElementById(id);
    if (!box) {
      var titles = { gpu: "GPUs", host: "Host", metrics: "Training metrics" };
      this.container.appendChild(GL.el("h3", { class: "group" }, titles[group] || group));
      box = GL.el("div", { id: id, class: "grid" });
      this.container.appendChild(box);
    }
    return box;
  };

  /* The chart's data with the run's start and end (or now) as empty points at its edges, so the
   * time axis spans the whole run: a run of one interval still gets a readable axis. */
  Board.prototype.spanned = function (chart) {
    var x = chart.x.slice(), cols = chart.series.map(function (s) { return s.values.slice(); });
    var s = chart.group === "metrics" ? null : this.span;
    if (s && x.length && s[0] < x[0]) { x.unshift(s[0]); cols.forEach(function (c) { c.unshift(null); }); }
    if (s && x.length && s[1] > x[x.length - 1]) { x.push(s[1]); cols.forEach(function (c) { c.push(null); }); }
    return [x].concat(cols);
  };

  /* Draw new charts, update the data of existing ones (same series), rebuild those whose series changed. */
  Board.prototype.render = function (charts) {
    var self = this;
    charts.forEach(function (chart) {
      try {
        var signature = chart.series.map(function (s) { return s.label + "|" + s.unit; }).join(";");
        var data = self.spanned(chart);
        var have = self.plots[chart.id];
        if (have && have.signature === signature) {
          have.u.setData(data, !have.u.gpuledgerZoomed);
          return;
        }
        var box;
        if (have) { have.u.destroy(); box = have.box; GL.replace(box, []); }
        else {
          box = GL.el("div", { class: "chart", id: "chart-" + chart.id });
          self.section(chart.group).appendChild(GL.el("div", {}, [GL.el("h4", {}, chart.title), box]));
        }
        var u = new uPlot(self.options(chart, chartWidth(box)), data, box);
        u.over.addEventListener("mousedown", function () { u.gpuledgerZoomed = true; });
        u.over.addEventListener("dblclick", function () {
          Object.keys(self.plots).forEach(function (id) { self.plots[id].u.gpuledgerZoomed = false; });
        });
        self.plots[chart.id] = { u: u, signature: signature, box: box };
      } catch (err) {
        self.registry.errors.push(chart.id + ": " + err);
        throw err;
      }
    });
    this.registry.charts = charts.map(function (c) {
      return { id: c.id, title: c.title, series: c.series.map(function (s) { return s.label; }), points: c.x.length };
    });
    var latest = (this.registry.latest = {});
    charts.forEach(function (c) {
      latest[c.id] = c.series.map(function (s) {
        for (var i = s.values.length - 1; i >= 0; i--) if (s.values[i] !== null) return s.values[i];
        return null;
      });
    });
    this.registry.updates += 1;
    this.registry.ready = true;
  };

  /* Each chart follows its box: a grid that gains a column after the first charts were drawn
   * must not leave them wider than their cell, over their neighbours. */
  Board.prototype.resize = function () {
    var plots = this.plots;
    Object.keys(plots).forEach(function (id) {
      var p = plots[id], w = chartWidth(p.box);
      if (Math.abs(p.u.width - w) > 1) p.u.setSize({ width: w, height: 230 });
    });
  };

  window.GLCharts = { gpuCharts: gpuCharts, hostCharts: hostCharts, metricCharts: metricCharts, Board: Board,
                      MAX_POINTS: MAX_POINTS };
})();
