"""The dashboard served by the team server under ``/dashboard`` (docs/SERVER.md, Dashboard).

Pages are static shells rendered by Jinja2; all data comes from the JSON API (``/api/v1``) in the
browser, with the token the user typed at login kept in sessionStorage. Everything it loads is
served by this server (uPlot is the copy bundled for the HTML report): it works offline.
"""

from gpuledger.server.dashboard.routes import router

__all__ = ["router"]
