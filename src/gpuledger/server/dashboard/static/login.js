/* Log in: check the token against /me, keep it in sessionStorage, go where the user was going. */
(function () {
  "use strict";
  var GL = window.GL;
  var form = document.getElementById("login-form");
  var input = document.getElementById("token");
  var error = document.getElementById("login-error");

  function nextPage() {
    var next = new URLSearchParams(window.location.search).get("next") || "";
    // Only a path of this dashboard: never an open redirect to another site.
    if (next.indexOf(GL.base + "/") === 0 && next.indexOf("//") < 0 && next.indexOf(GL.base + "/login") !== 0) {
      return next;
    }
    return GL.base + "/";
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var token = input.value.trim();
    error.hidden = true;
    if (!token) return;
    GL.get("/me", {}, { token: token }).then(function () {
      GL.setToken(token);
      window.location.assign(nextPage());
    }, function (err) {
      error.hidden = false;
      error.textContent = err && err.status === 401 ? "This token is not valid (mistyped, expired or revoked)."
        : "The server did not answer: " + String(err);
    });
  });
  input.focus();
})();
