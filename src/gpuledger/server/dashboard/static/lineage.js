/* A model's line (GET /lineage/{ref}): one row per version (its training run), then its
 * evaluation runs. Everything is text nodes (GL.el), numbers formatted as the CLI formats them. */
(function () {
  "use strict";
  var GL = window.GL;
  var REF = document.body.getAttribute("data-ref");
  var state = (window.gpuledgerLineage = { done: false, versions: 0, errors: GL.errors });

  function signed(v, unit) {
    if (v === null || v === undefined) return null;
    return (v >= 0 ? "+" : "\u2212") + Math.abs(v).toFixed(1) + unit;
  }

  function render(model) {
    var names = {};
    model.versions.forEach(function (v) { names[v.run_id] = v.model_version || GL.shortId(v.run_id); });
    if (model.model_line) {
      GL.replace("lineage-title", GL.el("span", {}, ["Lineage of ", GL.el("span", { class: "mono" }, model.model_line)]));
    }
    var versions = GL.table([
      { head: "version", get: function (v) { return names[v.run_id] + (v.run_id === model.selected ? " *" : ""); } },
      { head: "training run", get: function (v) { return GL.runLink({ id: v.run_id, name: v.name }); } },
      { head: "from", get: function (v) { return v.parent_run ? names[v.parent_run] || GL.shortId(v.parent_run) : "–"; } },
      { head: "best mAP50-95", num: true, get: function (v) { return GL.num(v.best_map); } },
      { head: "Δ mAP", num: true, get: function (v) { return v.change ? signed(v.change.best_map_points, " pt") : "–"; } },
      { head: "GPU-h", num: true, get: function (v) { return GL.num(v.gpu_hours); } },
      { head: "energy", num: true, get: function (v) { return GL.fmt.kwh(v.energy_kwh); } },
      { head: "cost", num: true, get: function (v) { return v.cost; } },
      { head: "host", get: function (v) { return v.host; } },
      { head: "GPU", get: function (v) { return v.gpu_model; } },
      { head: "dataset", get: function (v) {
        var d = v.dataset || {};
        return d.fingerprint ? (d.name ? d.name + " " : "") + d.fingerprint.slice(0, 12) : d.name;
      } },
    ], model.versions, "No version is visible to you.");
    GL.replace("versions", versions);
    var evals = [];
    model.versions.forEach(function (v) {
      v.evaluations.forEach(function (e) { evals.push({ version: names[v.run_id], e: e }); });
    });
    GL.replace("evaluations", GL.table([
      { head: "version", get: function (r) { return r.version; } },
      { head: "evaluation run", get: function (r) { return GL.runLink({ id: r.e.run_id, name: r.e.name }); } },
      { head: "mode", get: function (r) { return r.e.mode; } },
      { head: "FPS (inference)", num: true, get: function (r) { return GL.num(r.e.fps_inference); } },
      { head: "J / image", num: true, get: function (r) { return GL.num(r.e.j_per_image); } },
      { head: "mAP50-95", num: true, get: function (r) { return GL.num(r.e.map50_95); } },
      { head: "imgsz", num: true, get: function (r) { return r.e.imgsz; } },
      { head: "split", get: function (r) { return r.e.split_fingerprint ? r.e.split_fingerprint.slice(0, 12) : null; } },
    ], evals, "No evaluation run of these versions."));
    state.versions = model.versions.length;
    state.done = true;
  }

  GL.get("/lineage/" + encodeURIComponent(REF)).then(render).catch(function (err) {
    GL.fail(err);
    state.done = true;
  });
})();
