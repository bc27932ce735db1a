/* Overview: runs recording now, cost by team and project for a month, top consumers, recent alerts. */
(function () {
  "use strict";
  var GL = window.GL;
  var monthInput = document.getElementById("month");
  var state = (window.gpuledgerOverview = { loads: 0, cost: null });

  function thisMonth() {
    var d = new Date();
    return d.getUTCFullYear() + "-" + (d.getUTCMonth() < 9 ? "0" : "") + (d.getUTCMonth() + 1);
  }

  function money(v, currency) {
    if (v === null || v === undefined) return null;
    return GL.num(Number(v), 2) + " " + (currency || "");
  }

  function share(v) {
    if (v === null || v === undefined) return null;
    return GL.el("span", {}, [GL.el("span", { class: "bar", "data-w": v }), " " + GL.pct(v)]);
  }

  function sizeBars(box) {
    // Width set through the CSSOM (no inline style attribute: the page's CSP forbids those).
    Array.prototype.forEach.call(box.querySelectorAll(".bar[data-w]"), function (b) {
      b.style.width = Math.max(1, Math.round(Number(b.getAttribute("data-w")) * 80)) + "px";
    });
  }

  function costTable(key, report) {
    var cur = report.currency;
    var cols = [
      { head: key === "team" ? "Team" : "Project", cls: "text", get: function (g) { return g[key] === null ? "(none)" : g[key]; } },
      { head: "Runs", num: true, get: function (g) { return g.runs; } },
      { head: "Busy GPU-h", num: true, get: function (g) { return GL.num(g.busy_gpu_h, 2); } },
      { head: "Idle GPU-h", num: true, get: function (g) { return GL.num(g.idle_gpu_h, 2); } },
      { head: "Mean busy", num: true, get: function (g) { return GL.pct(g.mean_utilization); } },
      { head: "Energy kWh", num: true, get: function (g) { return GL.num(g.energy_kwh, 2); } },
      { head: "Cost", num: true, get: function (g) { return money(g.cost, cur); } },
      { head: "Share", get: function (g) { return share(g.share); } },
    ];
    var rows = report.groups.concat(report.total ? [report.total] : []);
    var nodes = [GL.table(cols, rows, "No GPU use this month.")];
    nodes.push(GL.note("Basis: " + report.basis + " GPU-hours; rate card: " + report.rate_card + ". " +
                       (report.warnings && report.warnings.length ? report.warnings.join(" ") : "")));
    return nodes;
  }

  function topFromCost(report) {
    var cur = report.currency;
    var users = GL.table([
      { head: "#", num: true, get: function (u) { return u.rank; } },
      { head: "User", cls: "text", get: function (u) { return u.user; } },
      { head: "Runs", num: true, get: function (u) { return u.runs; } },
      { head: "Busy GPU-h", num: true, get: function (u) { return GL.num(u.busy_gpu_h, 2); } },
      { head: "Idle GPU-h", num: true, get: function (u) { return GL.num(u.idle_gpu_h, 2); } },
      { head: "Cost", num: true, get: function (u) { return money(u.cost, cur); } },
    ], report.top_users_by_cost || [], "No GPU use this month.");
    var runs = GL.table([
      { head: "#", num: true, get: function (r) { return r.rank; } },
      { head: "Run", cls: "text", get: function (r) {
        var replayed = String(r.flags || "").split(";").indexOf("replayed") >= 0;
        return GL.runLink({ id: r.run_id, name: r.name, replayed: replayed });
      } },
      { head: "User", cls: "text", get: function (r) { return r.user; } },
      { head: "Project", cls: "text", get: function (r) { return r.project; } },
      { head: "Busy GPU-h", num: true, get: function (r) { return GL.num(r.busy_gpu_h, 2); } },
      { head: "Cost", num: true, get: function (r) { return money(r.cost, cur); } },
    ], report.top_runs_by_cost || [], "No run this month.");
    return [GL.el("h3", {}, "Users by cost"), users, GL.el("h3", {}, "Runs by cost"), runs];
  }

  function loadCost(month) {
    return Promise.all([
      GL.get("/reports/chargeback", { month: month, by: "team", format: "json" }),
      GL.get("/reports/chargeback", { month: month, by: "project", format: "json" }),
    ]).then(function (reports) {
      state.cost = "installed";
      GL.replace("cost-team", costTable("team", reports[0]));
      GL.replace("cost-project", costTable("project", reports[1]));
      [document.getElementById("cost-team"), document.getElementById("cost-project")].forEach(sizeBars);
      GL.replace("top", topFromCost(reports[0]));
    });
  }

  function loadRunning() {
    return GL.get("/runs", { status: "running", limit: 100 }).then(function (rows) {
      GL.replace("running", GL.table([
        { head: "Started", get: function (r) { return GL.time(Date.parse(r.started_at) / 1000); } },
        { head: "Run", cls: "text", get: function (r) { return GL.runLink(r); } },
        { head: "User", cls: "text", get: function (r) { return r.user; } },
        { head: "Project", cls: "text", get: function (r) { return r.project; } },
        { head: "Host", cls: "text", get: function (r) { return r.host; } },
        { head: "GPUs", num: true, get: function (r) { return r.gpus; } },
        { head: "Wall", num: true, get: function (r) { return GL.duration(r.wall_seconds); } },
      ], rows, "No run is recording now."));
    });
  }

  function loadAlerts() {
    return GL.get("/alerts/recent", { limit: 25 }).then(function (rows) {
      GL.replace("alerts", GL.table([
        { head: "When", get: function (a) { return GL.time(a.t); } },
        { head: "Kind", get: function (a) { return a.kind; } },
        { head: "Run", cls: "text", get: function (a) { return GL.runLink({ id: a.run_id, name: a.run_name }); } },
        { head: "User", cls: "text", get: function (a) { return a.user; } },
        { head: "Project", cls: "text", get: function (a) { return a.project; } },
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
