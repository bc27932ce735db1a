/* One run: summary, details, the report's charts and events. While the run records, new
 * intervals are fetched every few seconds (GET /runs/{id}/intervals?after_t=) and the charts grow. */
(function () {
  "use strict";
  var GL = window.GL;
  var RUN = document.body.getAttribute("data-run");
  var PATH = "/runs/" + encodeURIComponent(RUN);
  var POLL_MS = 3000, SUMMARY_EVERY = 5, PAGE = 5000, OVERLAP_S = 15;
  var gpuRows = {};  // uuid -> {seq: row}
  var hostRows = {};  // seq -> row
  var devices = {};  // uuid -> index
  var metrics = [], events = [], summary = null;
  var lastT1 = null, polls = 0, timer = null;
  var board = new window.GLCharts.Board(document.getElementById("chart-list"));
  var state = (window.gpuledgerRun = { polls: 0, rows: 0, live: false, done: false, errors: GL.errors });

  function add(page) {
    page.gpu.forEach(function (r) {
      (gpuRows[r.gpu_uuid] = gpuRows[r.gpu_uuid] || {})[r.seq] = r;
      if (lastT1 === null || r.t1 > lastT1) lastT1 = r.t1;
      if (r.gpu_index !== null && r.gpu_index !== undefined) devices[r.gpu_uuid] = r.gpu_index;
    });
    page.host.forEach(function (r) {
      hostRows[r.seq] = r;
      if (lastT1 === null || r.t1 > lastT1) lastT1 = r.t1;
    });
  }

  /* All pages after ``after`` (a full page means there may be more; rows are keyed, so overlap is harmless). */
  function fetchIntervals(after) {
    return GL.get(PATH + "/intervals", { after_t: after, limit: PAGE }).then(function (page) {
      add(page);
      var full = page.gpu.length >= PAGE || page.host.length >= PAGE;
      if (!full) return null;
      var ends = [page.gpu, page.host].filter(function (rows) { return rows.length >= PAGE; })
        .map(function (rows) { return rows[rows.length - 1].t1; });
      var next = Math.min.apply(null, ends) - 1e-6;
      return next > (after === null ? -Infinity : after) ? fetchIntervals(next) : null;
    });
  }

  function sorted(obj) {
    return Object.keys(obj).map(function (k) { return obj[k]; }).sort(function (a, b) { return a.seq - b.seq; });
  }

  function draw() {
    var gpu = {};
    Object.keys(gpuRows).forEach(function (u) { gpu[u] = sorted(gpuRows[u]); });
    var host = sorted(hostRows);
    var epochT = {};
    events.forEach(function (e) {
      if (e.kind === "epoch_end" && e.payload && typeof e.payload.epoch === "number") epochT[e.payload.epoch] = e.t;
    });
    var C = window.GLCharts;
    var charts = C.gpuCharts(gpu, devices).concat(C.hostCharts(host)).concat(C.metricCharts(metrics, epochT));
    if (!charts.length) {
      if (!document.getElementById("no-charts")) {
        document.getElementById("chart-list").appendChild(
          GL.el("p", { id: "no-charts", class: "muted" }, "No interval recorded yet."));
      }
    } else {
      var none = document.getElementById("no-charts");
      if (none) none.parentNode.removeChild(none);
    }
    board.render(charts);
    state.rows = host.length + Object.keys(gpu).reduce(function (n, u) { return n + gpu[u].length; }, 0);
  }

  function card(label, value, detail) {
    return GL.el("div", { class: "card" }, [GL.el("div", { class: "label" }, label), GL.el("div", { class: "value" }, value),
                                             detail ? GL.el("div", { class: "detail" }, detail) : null]);
  }

  function renderSummary(s) {
    summary = s;
    (s.gpus || []).forEach(function (g) { devices[g.uuid] = g.index; });
    document.title = "Run " + (s.name || GL.shortId(s.id)) + " · gpuledger";
    var title = document.getElementById("run-title");
    GL.replace(title, [document.createTextNode("Run " + (s.name ? s.name + " " : "")),
                       GL.el("span", { class: "mono muted", title: s.id }, GL.shortId(s.id)), document.createTextNode(" "),
                       GL.pill(s.status),
                       s.replayed ? document.createTextNode(" ") : null,
                       s.replayed ? GL.el("span", { class: "pill replayed", title: "not real hardware, not billed" },
                                          "replayed GPU trace") : null]);
    if (s.started_at_epoch) board.span = [s.started_at_epoch, s.ended_at_epoch || Date.now() / 1000];
    var gpus = s.gpus || [];
    GL.replace("summary", [
      card("Status", s.status, s.status_reason || (s.exit_code !== null && s.exit_code !== undefined ? "exit " + s.exit_code : "")),
      card("Wall time", GL.duration(s.wall_seconds), GL.time(s.started_at_epoch) + (s.ended_at_epoch ? " → " + GL.time(s.ended_at_epoch) : "")),
      card("GPUs", String(gpus.length), gpus.length ? gpus[0].name : (s.gpu_note || "")),
      card("Busy GPU-hours", GL.num(s.busy_gpu_hours), "of " + GL.num(s.allocated_gpu_hours) + " allocated"),
      card("Mean GPU busy", GL.pct(s.mean_utilization), s.peak_utilization_pct != null ? "peak " + GL.fmt.percent(s.peak_utilization_pct) : ""),
      card("GPU memory peak", GL.bytes(s.peak_memory_bytes), "this run's processes " + GL.bytes(s.peak_process_memory_bytes)),
      card("Energy", GL.fmt.kwh(s.energy_kwh), ""),
      card("CPU", GL.fmt.seconds(s.cpu_seconds), "peak RSS " + GL.bytes(s.peak_rss_bytes)),
    ]);
    var labels = Object.keys(s.labels || {}).sort().map(function (k) { return k + "=" + s.labels[k]; }).join("  ");
    var rows = [
      ["Id", s.id], ["Command", (s.command || []).join(" ")], ["User", s.user],
      ["Project", s.project || (s.labels || {}).project], ["Team", s.team || (s.labels || {}).team],
      ["Host", s.host], ["Directory", s.cwd],
      ["Labels", labels], ["Started", GL.time(s.started_at_epoch)], ["Ended", GL.time(s.ended_at_epoch)],
      ["Attempt of", s.attempt_of],
    ];
    if (s.replayed) rows.push(["Note", "Replayed GPU trace — not real hardware; no bill counts it"]);
    var dl = [];
    rows.forEach(function (r) {
      if (r[1] === null || r[1] === undefined || r[1] === "") return;
      dl.push(GL.el("dt", {}, r[0]));
      dl.push(GL.el("dd", {}, r[1]));
    });
    GL.replace("details", dl);
    var live = recording(s);
    document.getElementById("live").hidden = !live;
    state.live = live;
  }

  // Still recording: a wrapped run while "running", a node agent's run while "discovered" without an end.
  function recording(s) { return s.status === "running" || (s.status === "discovered" && !s.ended_at); }

  function renderEvents() {
    GL.replace("events", GL.table([
      { head: "When", get: function (e) { return GL.time(e.t); } },
      { head: "Kind", get: function (e) { return e.kind; } },
      { head: "Message", cls: "text", get: function (e) { return e.message; } },
    ], events.filter(function (e) { return e.kind !== "epoch_end"; }).slice(-200), "No event."));
  }

  function loadSide() {
    return Promise.all([GL.get(PATH), GL.get(PATH + "/events"), GL.get(PATH + "/metrics")]).then(function (r) {
      renderSummary(r[0]);
      events = r[1];
      metrics = r[2];
      renderEvents();
    });
  }

  function poll() {
    polls += 1;
    var side = polls % SUMMARY_EVERY === 0 ? loadSide() : Promise.resolve();
    var after = lastT1 === null ? null : lastT1 - OVERLAP_S;
    return Promise.all([side, fetchIntervals(after)]).then(function () {
      state.polls = polls;
      draw();
      if (summary && !recording(summary)) return finish();
      schedule();
    }).catch(function (err) { GL.fail(err); schedule(); });
  }

  function finish() {
    // The run ended: one last full read so the final interval, events and metrics are all shown.
    return Promise.all([loadSide(), fetchIntervals(lastT1 === null ? null : lastT1 - OVERLAP_S)]).then(function () {
      draw();
      state.done = true;
    });
  }

  function schedule() { timer = window.setTimeout(poll, POLL_MS); }

  loadSide().then(function () { return fetchIntervals(null); }).then(function () {
    draw();
    if (recording(summary)) schedule(); else state.done = true;
  }).catch(function (err) {
    if (err instanceof GL.ApiError && err.status === 404) {
      GL.status("No such run, or not one of your projects.", true);
      state.done = true;
      return;
    }
    GL.fail(err);
  });
  window.addEventListener("resize", function () { board.resize(); });
  window.addEventListener("beforeunload", function () { if (timer) window.clearTimeout(timer); });
})();
