/* Runs list: filters kept in the URL (shareable), refreshed every 10 s so new runs appear. */
(function () {
  "use strict";
  var GL = window.GL;
  var form = document.getElementById("filters");
  var FIELDS = ["project", "team", "user", "status", "since", "limit"];
  var REFRESH_MS = 10000;
  var state = (window.gpuledgerRuns = { loads: 0, rows: [] });

  function fromUrl() {
    var params = new URLSearchParams(window.location.search);
    FIELDS.forEach(function (f) { if (params.has(f)) form.elements[f].value = params.get(f); });
  }

  function current() {
    var out = {};
    FIELDS.forEach(function (f) { var v = form.elements[f].value.trim(); if (v) out[f] = v; });
    return out;
  }

  var columns = [
    { head: "Started", cls: "nowrap", get: function (r) { return GL.time(Date.parse(r.started_at) / 1000); } },
    { head: "ID", cls: "mono nowrap", get: function (r) { return GL.shortId(r.id); } },
    { head: "Run", cls: "text", get: function (r) { return GL.runLink(r); } },
    { head: "Status", cls: "nowrap", get: function (r) { return GL.pill(r.status); } },
    { head: "User", cls: "text", get: function (r) { return r.user; } },
    { head: "Project", cls: "text", get: function (r) { return r.project; } },
    { head: "Team", cls: "text", get: function (r) { return r.team; } },
    { head: "Host", cls: "text", get: function (r) { return r.host; } },
    { head: "GPUs", num: true, get: function (r) { return r.gpus; } },
    { head: "Wall", num: true, get: function (r) { return GL.duration(r.wall_seconds); } },
    { head: "Busy GPU-h", num: true, get: function (r) {
      return GL.num(r.busy_gpu_hours);
    } },
    { head: "Mean busy", num: true, get: function (r) {
      if (r.busy_gpu_hours === null || !r.gpus || !r.wall_seconds) return "n/a";
      return GL.pct(Math.min(1, (r.busy_gpu_hours * 3600) / (r.gpus * r.wall_seconds)));
    } },
  ];

  function load() {
    var params = current();
    return GL.get("/runs", params).then(function (rows) {
      state.rows = rows;
      state.loads += 1;
      GL.status("");
      document.getElementById("count").textContent = GL.fmt.count(rows.length, "run") +
        (rows.length >= Number(params.limit || 50) ? " (the newest; raise “Show” for more)" : "");
      GL.replace("runs", GL.table(columns, rows, "No run matches these filters."));
    }).catch(GL.fail);
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var q = GL.query(current());
    window.history.replaceState(null, "", window.location.pathname + q);
    load();
  });
  document.getElementById("clear").addEventListener("click", function () {
    form.reset();
    window.history.replaceState(null, "", window.location.pathname);
    load();
  });

  fromUrl();
  load();
  window.setInterval(function () { if (!document.hidden) load(); }, REFRESH_MS);
})();
