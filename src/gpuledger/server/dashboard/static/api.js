/* gpuledger dashboard: the token, the JSON API and safe DOM helpers shared by every page.
 * The token lives in sessionStorage (this tab only) and goes out as "Authorization: Bearer".
 * User text is only ever inserted with textContent / createTextNode, never as HTML. */
(function () {
  "use strict";
  var body = document.body;
  var API = body.getAttribute("data-api");
  var BASE = body.getAttribute("data-base");
  var KEY = "gpuledger.token";
  var GL = (window.GL = { api: API, base: BASE, errors: [] });

  GL.token = function () {
    try { return window.sessionStorage.getItem(KEY); } catch (e) { return null; }
  };
  GL.setToken = function (t) { window.sessionStorage.setItem(KEY, t); };
  GL.clearToken = function () { try { window.sessionStorage.removeItem(KEY); } catch (e) { /* private mode */ } };

  GL.toLogin = function () {
    var here = window.location.pathname + window.location.search;
    window.location.assign(BASE + "/login?next=" + encodeURIComponent(here));
  };

  function ApiError(status, message) {
    this.status = status;
    this.message = message;
  }
  ApiError.prototype.toString = function () { return "HTTP " + this.status + ": " + this.message; };
  GL.ApiError = ApiError;

  function query(params) {
    var parts = [];
    Object.keys(params || {}).forEach(function (k) {
      var v = params[k];
      if (v !== undefined && v !== null && v !== "") parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(v));
    });
    return parts.length ? "?" + parts.join("&") : "";
  }
  GL.query = query;

  /* GET a JSON API path. 401: back to the login page. Other errors reject with an ApiError. */
  GL.get = function (path, params, opts) {
    var token = GL.token();
    if (!token && !(opts && opts.token)) { GL.toLogin(); return new Promise(function () {}); }
    var headers = { Accept: "application/json", Authorization: "Bearer " + ((opts && opts.token) || token) };
    return window.fetch(API + path + query(params), { headers: headers, cache: "no-store", credentials: "omit" })
      .then(function (resp) {
        if (resp.status === 401 && !(opts && opts.token)) {
          GL.clearToken();
          GL.toLogin();
          return new Promise(function () {});
        }
        if (!resp.ok) {
          return resp.text().then(function (text) {
            var detail = text;
            try { detail = JSON.parse(text).detail || text; } catch (e) { /* not JSON */ }
            if (typeof detail !== "string") detail = JSON.stringify(detail);
            throw new ApiError(resp.status, detail.slice(0, 300));
          });
        }
        return resp.json();
      });
  };

  /* el("td", {class: "num"}, "text" | Node | [..]) — text is always text. */
  GL.el = function (tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      var v = attrs[k];
      if (v === undefined || v === null || v === false) return;
      if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, String(v));
    });
    [].concat(children === undefined ? [] : children).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    });
    return node;
  };

  GL.replace = function (target, node) {
    var box = typeof target === "string" ? document.getElementById(target) : target;
    while (box.firstChild) box.removeChild(box.firstChild);
    [].concat(node).forEach(function (n) { if (n) box.appendChild(n); });
  };

  GL.note = function (text, cls) { return GL.el("p", { class: cls || "muted" }, text); };

  /* A table from column specs: {head, get(row) -> text|Node, num: bool, cls}. */
  GL.table = function (columns, rows, empty) {
    if (!rows.length) return GL.note(empty || "Nothing yet.");
    var head = GL.el("tr", {}, columns.map(function (c) { return GL.el("th", { class: c.num ? "num" : null }, c.head); }));
    var trs = rows.map(function (r) {
      return GL.el("tr", {}, columns.map(function (c) {
        var v = c.get(r);
        return GL.el("td", { class: c.num ? "num" : c.cls || null }, v === null || v === undefined ? "n/a" : v);
      }));
    });
    return GL.el("table", {}, [GL.el("thead", {}, head), GL.el("tbody", {}, trs)]);
  };

  GL.status = function (text, bad) {
    var box = document.getElementById("status");
    if (!box) return;
    box.hidden = !text;
    box.textContent = text || "";
    box.className = "status" + (bad ? " bad" : "");
  };
  GL.fail = function (err) {
    GL.errors.push(String(err));
    GL.status("Could not load: " + String(err), true);
  };

  /* -- formatting ------------------------------------------------------------------------ */
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  GL.time = function (t) {
    if (t === null || t === undefined) return "–";
    var d = new Date(t * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + pad(d.getHours()) + ":" +
      pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  };
  /* Numbers follow the CLI's policy (static/fmt.js = core/units.py): three significant digits,
   * money in cents ("<0.01 USD" below a cent), "n/a" for what was not measured, never a fake 0. */
  var F = (GL.fmt = window.GLFmt);
  GL.duration = F.duration;
  GL.num = F.number;
  GL.pct = F.pct;
  GL.bytes = F.bytes;
  GL.money = function (v, currency) { return v === null || v === undefined ? null : F.money(v, currency); };
  GL.shortId = F.shortId;
  GL.pill = function (status) { return GL.el("span", { class: "pill " + String(status).replace(/[^a-z]/g, "") }, status); };
  GL.runLink = function (run) {
    var label = run.name ? run.name : GL.shortId(run.id);  // the id `gpuledger runs` prints
    var link = GL.el("a", { href: BASE + "/runs/" + encodeURIComponent(run.id), title: run.id }, label);
    if (!run.replayed) return link;
    /* metered from a replayed GPU trace (--replay-gpus): a demo, not real hardware, not billed */
    var mark = GL.el("span", { class: "pill replayed", title: "Replayed GPU trace — not real hardware, not billed" },
                     "replayed");
    return GL.el("span", {}, [link, " ", mark]);
  };

  /* -- header: who is logged in, log out ------------------------------------------------- */
  if (body.getAttribute("data-page") !== "login") {
    if (!GL.token()) { GL.toLogin(); return; }
    var logout = document.getElementById("logout");
    if (logout) logout.addEventListener("click", function () { GL.clearToken(); window.location.assign(BASE + "/login"); });
    GL.me = GL.get("/me").then(function (me) {
      var who = document.getElementById("who");
      if (who) who.textContent = (me.user || "?") + " (" + (me.role || "?") + ")";
      return me;
    }, function (err) { GL.fail(err); return null; });
  }
})();
