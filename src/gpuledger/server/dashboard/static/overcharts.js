/* Overview charts (uPlot, served by this server): cost per month as stacked bars per group, and a
 * weekly trend as lines. Months and weeks are categories (x = their index, labelled by name), so a
 * chart of three months is three bars across the plot, not three dots at its right edge. The
 * legend is uPlot's, below the plot. Charts follow their box's width (ResizeObserver). */
(function () {
  "use strict";
  var F = window.GLFmt;
  var PALETTE = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5",
                 "#9c6b4e", "#9498a0"];
  var HEIGHT = 240;
  var registry = (window.gpuledgerOverviewCharts = { charts: {}, errors: [] });
  var plots = {};  // id -> {u, box}

  function colour(i) { return PALETTE[i % PALETTE.length]; }
  function width(box) { return Math.max(280, box.clientWidth - 10); }

  function categoryAxis(labels, info) {  // info.xticks: the labels drawn (the tests read them)
    return {
      splits: function () { return labels.map(function (_, i) { return i; }); },
      values: function (u, ticks) {
        info.xticks = ticks.map(function (t) { return labels[t] === undefined ? "" : labels[t]; });
        return info.xticks;
      },
      grid: { show: false },
    };
  }

  function valueAxis(unit) {
    return { label: unit, size: 70, values: function (u, ticks) { return ticks.map(function (v) { return F.tick(v); }); } };
  }

  function draw(id, box, opts, data, info) {
    try {
      if (plots[id]) plots[id].u.destroy();
      while (box.firstChild) box.removeChild(box.firstChild);
      opts.width = width(box);
      opts.height = HEIGHT;
      var u = new uPlot(opts, data, box);
      plots[id] = { u: u, box: box };
      registry.charts[id] = info;
    } catch (err) {
      registry.errors.push(id + ": " + err);
      throw err;
    }
  }

  /* groups: [{name, values: [amount|null per label]}], largest first. Each bar is the stack of the
   * groups: drawn as cumulative tops, tallest first, so each group shows as its own band. */
  function stackedBars(id, box, labels, groups, currency) {
    var x = labels.map(function (_, i) { return i; });
    var acc = labels.map(function () { return 0; }), tops = [];
    groups.forEach(function (g) {
      acc = acc.map(function (a, i) { return a + (g.values[i] || 0); });
      tops.push(acc.slice());
    });
    var order = tops.map(function (_, i) { return i; }).reverse();
    var bars = uPlot.paths.bars({ size: [0.6, 90], align: 0 });
    var series = [{ label: "month" }].concat(order.map(function (i) {
      return {
        label: groups[i].name, fill: colour(i), stroke: colour(i), width: 0, paths: bars, points: { show: false },
        value: function (u, v, si, idx) {
          return idx === null || idx === undefined ? "" : F.money(groups[i].values[idx] || 0, currency);
        },
      };
    }));
    var info = { kind: "bars", labels: labels, series: groups.map(function (g) { return g.name; }) };
    var opts = {
      series: series, legend: { live: true },
      scales: { x: { time: false, range: [-0.5, labels.length - 0.5] }, y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.08 : 1]; } } },
      axes: [categoryAxis(labels, info), valueAxis(currency)],
      cursor: { drag: { x: false, y: false }, points: { show: false } },
    };
    draw(id, box, opts, [x].concat(order.map(function (i) { return tops[i]; })), info);
  }

  /* series: [{name, values: [number|null per label]}] */
  function lines(id, box, labels, series, unit, money) {
    var x = labels.map(function (_, i) { return i; });
    var info = { kind: "lines", labels: labels, series: series.map(function (s) { return s.name; }) };
    var opts = {
      series: [{ label: "week" }].concat(series.map(function (s, i) {
        return {
          label: s.name, stroke: colour(i), width: 2, spanGaps: false, points: { show: true, size: 6 },
          value: function (u, v) { return v === null || v === undefined ? "n/a" : money ? F.money(v, unit) : F.number(v); },
        };
      })),
      legend: { live: true },
      scales: { x: { time: false, range: [-0.3, Math.max(0.3, labels.length - 0.7)] }, y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.08 : 1]; } } },
      axes: [categoryAxis(labels, info), valueAxis(unit)],
      cursor: { drag: { x: false, y: false } },
    };
    draw(id, box, opts, [x].concat(series.map(function (s) { return s.values; })), info);
  }

  if (window.ResizeObserver) {
    var observer = new ResizeObserver(function () {
      Object.keys(plots).forEach(function (id) {
        var p = plots[id], w = width(p.box);
        if (Math.abs(p.u.width - w) > 2) p.u.setSize({ width: w, height: HEIGHT });
      });
    });
    observer.observe(document.querySelector("main"));
  }

  window.GLOverCharts = { stackedBars: stackedBars, lines: lines };
})();
