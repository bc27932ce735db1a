/* Overview: a month at a glance. Cost per month (stacked by team) and per week (by model
 * version), anomalies with their likely causes, cost by team and by project, the TOP runs and
 * users by cost and by idle cost, runs recording now and recent alerts. Numbers as the CLI
 * prints them (static/fmt.js). */
(function () {
  "use strict";
  var GL = window.GL, F = window.GLFmt, C = window.GLOverCharts;
  var monthInput = document.getElementById("month");
  var state = (window.gpuledgerOverview = { loads: 0, cost: null, value: null, reports: {} });
  var TREND_GROUPS = 8;

  function thisMonth() {
    var d = new Date();
    return d.getUTCFullYear() + "-" + (d.getUTCMonth() < 9 ? "0" : "") + (d.getUTCMonth() + 1);
  }

  function share(v) {
    if (v === null || v === undefined) return null;
    return GL.el("span", { class: "share" }, [GL.el("span", { class: "bar", "data-w": v }), " " + GL.pct(v)]);
  }

  function sizeBars(box) {
    // Width set through the CSSOM (no inline style attribute: the page's CSP forbids those).
    Array.prototype.forEach.call(box.querySelectorAll(".bar[data-w]"), function (b) {
      b.style.width = Math.max(1, Math.round(Math.min(1, Number(b.getAttribute("data-w"))) * 60)) + "px";
    });
  }

  function name(v) { return v === null || v === undefined ? "(none)" : v; }

  function costTable(key, report) {
    var cur = report.currency;
    var cols = [
      { head: key === "team" ? "Team" : "Project", cls: "name", get: function (g) { return g === report.total ? "TOTAL" : name(g[key]); } },
      { head: "Runs", num: true, get: function (g) { return g.runs; } },
      { head: "Busy GPU-h", num: true, get: function (g) { return GL.num(g.busy_gpu_h); } },
      { head: "Idle GPU-h", num: true, get: function (g) { return GL.num(g.idle_gpu_h); } },
      { head: "Mean busy", num: true, get: function (g) { return GL.pct(g.mean_utilization); } },
      { head: "Energy", num: true, get: function (g) { return F.kwh(g.energy_kwh); } },
      { head: "Cost", num: true, get: function (g) { return GL.money(g.cost, cur); } },
      { head: "Idle cost", num: true, get: function (g) { return GL.money(g.idle_cost, cur); } },
      { head: "Share", cls: "nowrap", get: function (g) { return share(g.share); } },
    ];
    var rows = report.groups.concat(report.total ? [report.total] : []);
    var table = GL.table(cols, rows, "No GPU use this month.");
    if (report.total && table.tagName === "TABLE") table.querySelector("tbody tr:last-child").className = "total";
    var nodes = [table];
    nodes.push(GL.note("Basis: " + report.basis + " GPU-hours; rate card: " + report.rate_card + ". " +
                       (report.warnings && report.warnings.length ? report.warnings.join(". ") + "." : "")));
    return nodes;
  }

  function runCell(r) {
    var replayed = String(r.flags || "").split(";").indexOf("replayed") >= 0;
    return GL.runLink({ id: r.run_id, name: r.name, replayed: replayed });
  }

  function tops(report) {
    var cur = report.currency;
    function users(rows, idle) {
      return GL.table([
        { head: "#", num: true, get: function (u) { return u.rank; } },
        { head: "User", cls: "name", get: function (u) { return u.user; } },
        { head: "Runs", num: true, get: function (u) { return u.runs; } },
        { head: idle ? "Idle GPU-h" : "Busy GPU-h", num: true, get: function (u) { return GL.num(idle ? u.idle_gpu_h : u.busy_gpu_h); } },
        { head: idle ? "Idle cost" : "Cost", num: true, get: function (u) { return GL.money(idle ? u.idle_cost : u.cost, cur); } },
      ], rows || [], "No GPU use this month.");
    }
    function runs(rows, idle) {
      return GL.table([
        { head: "#", num: true, get: function (r) { return r.rank; } },
        { head: "Run", cls: "text", get: runCell },
        { head: "User", cls: "name", get: function (r) { return r.user; } },
        { head: idle ? "Idle GPU-h" : "Busy GPU-h", num: true, get: function (r) { return GL.num(idle ? r.idle_gpu_h : r.busy_gpu_h); } },
        { head: idle ? "Idle cost" : "Cost", num: true, get: function (r) { return GL.money(idle ? r.idle_cost : r.cost, cur); } },
      ], rows || [], "No run this month.");
    }
    function box(id, title, table) { return GL.el("div", { id: id }, [GL.el("h3", {}, title), table]); }
    return [
      box("top-runs-cost", "Runs by cost", runs(report.top_runs_by_cost)),
      box("top-runs-idle", "Runs by idle cost", runs(report.top_runs_by_idle_cost, true)),
      box("top-users-cost", "Users by cost", users(report.top_users_by_cost)),
      box("top-users-idle", "Users by idle cost", users(report.top_users_by_idle_cost, true)),
    ];
  }

  /* The chargeback's trend rows (group x month) as stacked bars, the biggest groups first. */
  function monthChart(report) {
    var months = report.trend_months || [];
    var key = (report.by || ["team"])[0], per = {}, totals = {};
    (report.trend || []).forEach(function (row) {
      var g = name(row[key]), i = months.indexOf(row.month);
      if (i < 0 || row[key] === "TOTAL") return;  // the per-month TOTAL rows: the stack's height
      (per[g] = per[g] || months.map(function () { return null; }))[i] = Number(row.cost);
      totals[g] = (totals[g] || 0) + Number(row.cost);
    });
    var names = Object.keys(per).sort(function (a, b) { return totals[b] - totals[a] || (a < b ? -1 : 1); });
    var groups = names.slice(0, TREND_GROUPS).map(function (g) { return { name: g, values: per[g] }; });
    if (names.length > TREND_GROUPS) {
      groups.push({ name: "others", values: months.map(function (_, i) {
        return names.slice(TREND_GROUPS).reduce(function (s, g) { return s + (per[g][i] || 0); }, 0);
      }) });
    }
    var box = document.getElementById("chart-month");
    if (!groups.length) { GL.replace(box, GL.note("No cost in these months.")); return; }
    C.stackedBars("month", box, months, groups, report.currency);
  }

  function weekLabel(label, i, vt) {
    var w = label.slice(5);  // "2026-W49" -> "W49"
    return i === vt.weeks.length - 1 && vt.last_week_to ? w + " (to date)" : w;
  }

  function weekChart(vt) {
    var box = document.getElementById("chart-week");
    var groups = (vt.top_by_cost || []).slice(0, TREND_GROUPS).map(function (r) { return r[vt.by]; });
    if (!groups.length) {
      GL.replace(box, GL.note("No finished run labelled with a model or model_version in these weeks."));
      return;
    }
    var series = groups.map(function (g) {
      return { name: g, values: vt.weeks.map(function (w) {
        var row = vt.series.filter(function (r) { return r[vt.by] === g && r.week === w; })[0];
        return row ? Number(row.cost) : null;
      }) };
    });
    var labels = vt.weeks.map(function (w, i) { return weekLabel(w, i, vt); });
    C.lines("week", box, labels, series, vt.currency, true);
  }

  var CB_METRICS = {
    idle_share: ["share of allocated GPU time left idle", "GPUs held but not computing: idle jobs, notebooks or an input pipeline that starves the GPU"],
    cost_per_a100eq_h: ["cost per A100-equivalent hour", "dearer GPUs or prices: a different GPU model, instance type or rate"],
  };

  function anomalies(cb, vt) {
    var items = [];
    (vt && vt.anomalies || []).forEach(function (a) {
      items.push(GL.el("li", { class: "anomaly" }, [GL.el("strong", {}, a[vt.by] + ": "), a.message]));
    });
    var key = (cb.by || ["team"])[0];
    (cb.anomalies || []).forEach(function (a) {
      var m = CB_METRICS[a.metric] || [a.metric, ""];
      var from = a.metric === "idle_share" ? GL.pct(a.baseline) : F.money(a.baseline, cb.currency);
      var to = a.metric === "idle_share" ? GL.pct(a.current) : F.money(a.current, cb.currency);
      items.push(GL.el("li", { class: "anomaly" }, [
        GL.el("strong", {}, name(a[key]) + ": "),
        m[0] + " rose " + F.percent(a.change * 100) + " (" + from + " → " + to + ") this month against the months before",
        m[1] ? "; likely cause: " + m[1] : "",
      ]));
    });
    if (!items.length) return GL.note("No anomaly: costs per unit and idle shares are in line with the weeks and months before.");
    return GL.el("ul", { class: "anomalies" }, items);
  }

  function loadCost(month) {
    return Promise.all([
      GL.get("/reports/chargeback", { month: month, by: "team", format: "json" }),
      GL.get("/reports/chargeback", { month: month, by: "project", format: "json" }),
      GL.get("/reports/value-trends", { month: month }).catch(function (err) { GL.errors.push(String(err)); return null; }),
    ]).then(function (r) {
      state.cost = "installed";
      state.reports = { team: r[0], project: r[1], value: r[2] };
      state.value = r[2] ? "loaded" : "failed";
      GL.replace("cost-team", costTable("team", r[0]));
      GL.replace("cost-project", costTable("project", r[1]));
      [document.getElementById("cost-team"), document.getElementById("cost-project")].forEach(sizeBars);
      GL.replace("top", tops(r[0]));
      GL.replace("anomalies", anomalies(r[0], r[2]));
      monthChart(r[0]);
      if (r[2]) weekChart(r[2]);
      else GL.replace("chart-week", GL.note("The weekly trend could not be loaded."));
    });
  }

  function loadRunning() {
    return GL.get("/runs", { status: "running", limit: 100 }).then(function (rows) {
      GL.replace("running", GL.table([
        { head: "Started", cls: "nowrap", get: function (r) { return GL.time(Date.parse(r.started_at) / 1000); } },
        { head: "Run", cls: "text", get: function (r) { return GL.runLink(r); } },
        { head: "User", cls: "name", get: function (r) { return r.user; } },
        { head: "Project", cls: "name", get: function (r) { return r.project; } },
        { head: "Host", cls: "name", get: function (r) { return r.host; } },
        { head: "GPUs", num: true, get: function (r) { return r.gpus; } },
        { head: "Wall", num: true, get: function (r) { return GL.duration(r.wall_seconds); } },
      ], rows, "No run is recording now."));
    });
  }

  function loadAlerts() {
    return GL.get("/alerts/recent", { limit: 25 }).then(function (rows) {
      GL.replace("alerts", GL.table([
        { head: "When", cls: "nowrap", get: function (a) { return GL.time(a.t); } },
        { head: "Kind", get: function (a) { return a.kind; } },
        { head: "Run", cls: "text", get: function (a) { return GL.runLink({ id: a.run_id, name: a.run_name }); } },
        { head: "User", cls: "name", get: function (a) { return a.user; } },
        { head: "Project", cls: "name", get: function (a) { return a.project; } },
        { head: "Message", cls: "text", get: function (a) { return a.message; } },
      ], rows, "No alert, out-of-memory or NaN-loss event."));
    });
  }

  function load() {
    var month = monthInput.value || thisMonth();
    return Promise.all([loadRunning(), loadCost(month), loadAlerts()]).then(function () {
      state.loads += 1;
      GL.status("");
    }).catch(GL.fail);
  }

  monthInput.value = new URLSearchParams(window.location.search).get("month") || thisMonth();
  monthInput.addEventListener("change", function () {
    window.history.replaceState(null, "", window.location.pathname + GL.query({ month: monthInput.value }));
    load();
  });
  load();
  window.setInterval(function () { if (!document.hidden) loadRunning().catch(GL.fail); }, 15000);
})();
