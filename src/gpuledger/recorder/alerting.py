"""Live alerts inside a recording session: core.diagnosis.alerts' evaluator plugged into the recorder.

Wiring (recorder/session.py): the Recorder's ``on_interval`` hook is ``LiveAlerts.hook(...)``
(chained before any other consumer of the hook), every control message goes through
``LiveAlerts.on_message`` after it was handled, ``bind`` hands over the recorder, and ``close``
runs after the recorder stopped. Each alert becomes one line on
stderr, an ``alert`` run event, and a webhook POST when one is configured. Nothing here may
disturb the recording: a failure becomes a ``sampler_error`` problem of the recorder.

Config: ``$GPULEDGER_ALERTS`` (a TOML file), else ``<data dir>/alerts.toml``; no file means the
default rules without a webhook. A broken file is said once on stderr and the defaults apply.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.core.diagnosis.alerts import Alert, AlertEngine, AlertRules, rules_from_config
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.core.units import iso_utc

if TYPE_CHECKING:
    from gpuledger.recorder.recorder import Recorder
    from gpuledger.recorder.webhook import WebhookSender

ENV_VAR = "GPULEDGER_ALERTS"
FILENAME = "alerts.toml"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    from gpuledger.paths import data_dir

    env = os.environ if env is None else env
    return Path(env[ENV_VAR]).expanduser() if env.get(ENV_VAR) else data_dir(env) / FILENAME


def load_rules(env: Mapping[str, str] | None = None) -> AlertRules | None:
    """The configured rules; None when alerts are turned off. Raises ValueError for a bad file."""
    path = config_path(env)
    if not path.is_file():
        if (env or os.environ).get(ENV_VAR):
            raise ValueError(f"{path}: no such alert config file ({ENV_VAR})")
        return AlertRules()
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
    try:
        with open(path, "rb") as fh:
            return rules_from_config(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


class LiveAlerts:
    def __init__(
        self,
        run: RunRecord,
        devices: Sequence[GpuIdentity],
        rules: AlertRules | None,
        warn: Callable[[str], None],
        webhook: WebhookSender | None = None,
    ) -> None:
        self.run = run
        self.engine = AlertEngine(rules, devices) if rules is not None else None
        self._warn = warn
        self.webhook = webhook
        self._recorder: Recorder | None = None
        self.fired: list[Alert] = []

    @classmethod
    def for_session(
        cls,
        run: RunRecord,
        devices: Sequence[GpuIdentity],
        warn: Callable[[str], None],
        env: Mapping[str, str] | None = None,
    ) -> LiveAlerts:
        try:
            rules = load_rules(env)
        except ValueError as exc:
            warn(f"gpuledger: alert config ignored, default alerts apply: {exc}")
            rules = AlertRules()
        webhook = None
        if rules is not None and rules.webhook:
            from gpuledger.recorder.webhook import WebhookSender

            webhook = WebhookSender(rules.webhook, on_error=lambda message: warn(f"gpuledger: {message}"))
        return cls(run, devices, rules, warn, webhook)

    def bind(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def hook(
        self,
        then: Callable[[list[GpuInterval], HostInterval | None], None] | None = None,
    ) -> Callable[[list[GpuInterval], HostInterval | None], None]:
        """The Recorder's ``on_interval``: alerts first, then ``then`` (another consumer of the hook),
        which runs even when the alert evaluation fails."""

        def on_interval(gpu: list[GpuInterval], host: HostInterval | None) -> None:
            try:
                self.on_interval(gpu, host)
            except Exception as exc:
                if self._recorder is not None:
                    self._recorder.problem("sampler_error", f"alert evaluation failed: {exc!r}")
            if then is not None:
                then(gpu, host)

        return on_interval

    # -- hooks ------------------------------------------------------------------------------------
    def on_interval(self, gpu: list[GpuInterval], host: HostInterval | None) -> None:
        if self.engine is not None:
            self._fire(self.engine.on_interval(gpu, host))

    def on_message(self, msg: Mapping[str, Any]) -> None:
        """A control message from the command, after the recorder handled it."""
        if self.engine is None:
            return
        try:
            t = float(msg.get("t") or 0.0) or self._now()
            kind = msg.get("type")
            if kind == "event":
                payload = msg.get("payload") or {}
                self._fire(self.engine.on_event(str(msg.get("kind")), str(msg.get("message") or ""), payload, t))
            elif kind in ("epoch_end", "metrics"):
                epoch = msg.get("epoch")
                epoch = epoch if isinstance(epoch, int) else None
                self._fire(self.engine.on_metrics(msg.get("metrics") or {}, t, epoch))
        except Exception as exc:  # a malformed message must not reach the training
            if self._recorder is not None:
                self._recorder.problem("sampler_error", f"alert evaluation failed: {exc!r}")

    def on_event(self, kind: str, message: str, payload: Mapping[str, Any] | None = None) -> None:
        """Failures found after the command ended (log parsing) can still alert."""
        if self.engine is not None:
            self._fire(self.engine.on_event(kind, message, payload or {}, self._now()))

    def close(self, timeout_s: float = 3.0) -> None:
        if self.webhook is not None:
            self.webhook.close(timeout_s)

    # -- output -----------------------------------------------------------------------------------
    def _now(self) -> float:
        import time

        return time.time()

    def _fire(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self.fired.append(alert)
            name = f' "{self.run.name}"' if self.run.name else ""
            self._warn(f"gpuledger: ALERT {alert.rule}: {alert.message} (run {self.run.id[:13]}{name})")
            if self._recorder is not None:
                details = {str(k): v for k, v in alert.payload.items()}
                details.update(rule=alert.rule, gpu=alert.gpu)
                self._recorder.event("alert", alert.message, **details)
            if self.webhook is not None:
                self.webhook.send(self.payload(alert))

    def payload(self, alert: Alert) -> dict[str, Any]:
        """The webhook's JSON body (documented in docs/REPORTS.md)."""
        run = self.run
        return {
            "source": "gpuledger",
            "rule": alert.rule,
            "message": alert.message,
            "gpu": alert.gpu,
            "t": alert.t,
            "time": iso_utc(alert.t),
            "run": {
                "id": run.id,
                "name": run.name,
                "user": run.user,
                "host": run.host,
                "project": run.labels.get("project"),
                "team": run.labels.get("team"),
            },
            "details": alert.payload,
        }
