"""The agent's ``--k8s-output DIR`` (and, opted into, its in-cluster apply): the board's
verdicts as files a cluster-side process (``kubectl apply``, a DRA driver,
``otel-dra k8s render --apply``) picks up, or as DeviceTaintRules applied directly.

Writes ``devicetaintrules.yaml`` (and, opted into, the experimental
``resourceslice-attributes.yaml``: KEP-5283 is provisional) on its own thread,
after each verdict change, atomically (temp file and rename: a reader never sees half a file)
and only when the rendering changed (a file's mtime moves only when its content does). With
``apply``, the same thread reconciles the cluster's rules (:func:`otel_dra.sinks.k8s.apply.apply`)
whenever the rules change, and every ``resync_s`` besides (a rule deleted by hand comes back);
a failure is logged and retried after ``retry_s``. The sampling loop never waits on any of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from otel_dra import conventions as cv
from otel_dra.policy import Policy
from otel_dra.sinks.config import K8sOutputConfig
from otel_dra.sinks.k8s import readback
from otel_dra.sinks.k8s import validation as val
from otel_dra.sinks.k8s.apply import Action, K8sApplyError, apply, connect, discover
from otel_dra.sinks.k8s.brake import Brake, Decision
from otel_dra.sinks.k8s.events import NORMAL, WARNING, EventRecorder, Ref, rule_ref, taint_change
from otel_dra.sinks.k8s.render import (
    ATTRIBUTES_FILE,
    DEFAULT_API_VERSION,
    RULES_FILE,
    Rendering,
    api_version_of,
    effect_of,
    render,
    target_kubernetes,
    write_if_changed,
)
from otel_dra.sinks.k8s.versions import AUTO_API_VERSION
from otel_dra.state.board import VerdictBoard

log = logging.getLogger(__name__)


class K8sOutputSink:
    """Renders a :class:`VerdictBoard` into ``out_dir`` (and applies the rules, if asked)
    whenever the board changes."""

    def __init__(
        self,
        board: VerdictBoard,
        policy: Policy,
        config: K8sOutputConfig,
        *,
        warmup_s: float = 0.0,
        poll_s: float = 0.5,
        api_client: Any = None,
        leader: Callable[[], bool] | None = None,
        whole_fleet: bool = False,
        name: str = "k8s output",
        brake: Brake | None = None,
        events: EventRecorder | None = None,
        brake_ref: Ref | None = None,
    ) -> None:
        """``config``: where the files go (``output``; None: no files, the fleet's writer only applies),
        the API version (``auto``: the newest the cluster serves, found before the first apply; files
        written before then use the default, ``v1``), the DRA driver of devices whose telemetry has no
        ``dra.driver.name``, whether to apply, whether to write the experimental ResourceSlice health
        attributes (KEP-5283 is provisional), and the resync and retry periods.

        Fails before the agent starts, never after:
        :class:`~otel_dra.sinks.k8s.validation.K8sValidationError` (no kubernetes client), OSError
        (the output directory cannot be made), :class:`~otel_dra.sinks.k8s.apply.ClusterUnavailable`
        (``apply`` without a kubeconfig or a pod's service account).

        ``warmup_s``: no apply before this long after :meth:`start`, so a restarted agent that
        has not yet seen enough samples to re-find a fault does not delete (and then recreate)
        its rule; e.g. the policy's ``min_samples`` times the sampling interval.

        ``leader``: asked before each apply and before each change in it: only a leader writes
        (:class:`~otel_dra.sinks.k8s.lease.LeaderElector`). ``whole_fleet``: every managed rule not
        rendered is deleted, whatever its pool (the fleet is the cluster's one writer).

        ``brake``: the budget of new acting taints the writer may add (:mod:`otel_dra.sinks.k8s.brake`);
        the files always hold what the verdicts say, the cluster what the brake let through.

        ``events``: a Kubernetes Event for every rule created, changed or deleted, and for the brake
        (:mod:`otel_dra.sinks.k8s.events`; this sink starts and stops it); the brake's are about
        ``brake_ref`` (the leader's Lease, where its state lives), else the first rule it withheld."""
        self.board = board
        self.config = config
        self.out_dir = Path(config.output) if config.output else None
        self.policy = policy
        self.discover = config.api_version == AUTO_API_VERSION
        self.api_version = DEFAULT_API_VERSION if self.discover else api_version_of(config.api_version)
        self.kubernetes: tuple[int, int] | None = None  # the server's version, once discovered
        self.driver = config.driver
        self.poll_s, self.resync_s, self.retry_s, self.warmup_s = poll_s, config.resync_s, config.retry_s, warmup_s
        self.leader, self.whole_fleet, self.name = leader, whole_fleet, name
        self.attributes = config.attributes
        self.brake = brake
        self.events, self.brake_ref = events, brake_ref
        self._domain = str(policy.sections["kubernetes"]["domain"])
        self._withheld: dict[str, str] = {}  # rule name: the effect the brake kept back, in the last batch
        self._not_before = 0.0
        val.client_models()
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._api_client: Any = (api_client or connect()) if config.apply else None
        self._written: dict[Path, str] = {}
        self._notes: tuple[str, ...] = ()
        self._rendering: Rendering | None = None
        self._rules_text = ""
        self._attempted: str | None = None  # the rules text last applied (or tried)
        self._apply_due = 0.0  # monotonic time of the next resync or retry
        self._apply_error = ""
        self._was_leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0  # files (re)written, for tests and logs
        self.applies = 0  # successful reconciliations
        #: What the cluster said the managed rules did, by (pool, device), as of the last apply's list.
        self.readback: dict[tuple[str, str], list[readback.RuleStatus]] = {}

    def render(self) -> Rendering:
        """The board now, as this sink's API version renders it."""
        snapshot = self.board.snapshot()
        drivers = {(v.node, v.hw_id): attrs.get(cv.DRA_DRIVER_NAME) for v, attrs in snapshot}
        rendering = render(
            (v for v, _ in snapshot),
            self.policy,
            self.api_version,
            drivers=drivers,
            driver=self.driver,
            strict=False,
            kubernetes_version=self.kubernetes,
        )
        self._rendering = rendering
        self._rules_text = rendering.rules_yaml()  # once per rendering: the loop compares it every poll
        notes = tuple(rendering.skipped + rendering.dropped)
        if notes != self._notes:  # once per change, not on every pass
            for note in notes:
                log.warning("%s: %s", self.name, note)
            self._notes = notes
        return rendering

    def write(self) -> bool:
        """Render the board now; write the files whose content changed. True when any did."""
        rendering = self.render()
        if self.out_dir is None:
            return False
        changed = False
        files = [(RULES_FILE, self._rules_text)]
        if self.attributes:
            files.append((ATTRIBUTES_FILE, rendering.attributes_yaml()))
        for name, text in files:
            path = self.out_dir / name
            if self._written.get(path) == text and path.exists():
                continue
            if write_if_changed(path, text):
                changed = True
                self.writes += 1
                log.info("%s: wrote %s", self.name, path)
            self._written[path] = text
        return changed

    def _failed(self, exc: K8sApplyError) -> None:
        if str(exc) != self._apply_error:
            log.error("%s: applying DeviceTaintRules failed: %s; retrying every %gs", self.name, exc, self.retry_s)
        self._apply_error = str(exc)
        self._apply_due = time.monotonic() + self.retry_s

    def _discovered(self) -> bool:
        """With ``auto``, find the served version first (once); False while that fails."""
        if not self.discover or self.kubernetes is not None:
            return True
        try:
            found = discover(self._api_client)
        except K8sApplyError as exc:
            self._failed(exc)
            return False
        log.info("%s: %s", self.name, found)
        self.api_version = found.api_version
        self.kubernetes = found.kubernetes or target_kubernetes(found.api_version)
        self.render()
        return True

    def reconcile(self, force: bool = False) -> bool:
        """Apply the last rendering when its rules changed, a resync or retry is due, or ``force``.
        True when the cluster now matches it; failures are logged (once per distinct error)."""
        if self._api_client is None or self._rendering is None or (not force and time.monotonic() < self._not_before):
            return False
        leading = self.leader is None or self.leader()
        if not leading:
            self._was_leader = False
            return False
        if not self._was_leader:  # just became the leader: reconcile now, whatever was tried before
            self._was_leader, force = True, True
        if not (force or time.monotonic() >= self._apply_due or self._rules_text != self._attempted):
            return not self._apply_error
        if not self._discovered():
            return False
        rendering = self._rendering
        self._attempted = self._rules_text
        gate = None
        if self.brake is not None:
            brake, devices = self.brake, len(rendering.attributes)

            def gate(desired: list[dict[str, Any]], existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
                decision = brake.gate(desired, existing, devices, time.time())
                rendered = {o["metadata"]["name"]: o for o in desired}
                self._withheld = {n: effect_of(rendered[n]) for n in decision.withheld}
                self._brake_news(decision)
                return decision.rules

        audit = self._audit if self.events is not None else None
        try:
            result = apply(
                rendering,
                self._api_client,
                whole_fleet=self.whole_fleet,
                may_write=self.leader,
                gate=gate,
                done=audit,
            )
        except K8sApplyError as exc:
            self._failed(exc)
            return False
        self._read_back(result.listed)
        for action in result.actions:
            log.info("%s: %s", self.name, action)
        if self._apply_error:
            log.info("%s: applying DeviceTaintRules works again", self.name)
        self._apply_error = ""
        self._apply_due = time.monotonic() + self.resync_s
        self.applies += 1
        return True

    def _read_back(self, listed: list[dict[str, Any]]) -> None:
        """Keep what the cluster's device-taint controller says the rules did (Kubernetes 1.35+), and show it
        beside each device's verdict (``/v1/devices``: ``cluster``)."""
        self.readback = readback.by_device(listed)
        view: dict[tuple[str, str], Mapping[str, object]] = {}
        for device, statuses in self.readback.items():
            said: dict[str, object] = {"taints": [st.to_json() for st in statuses]}
            would = readback.would_evict(statuses)
            if would is not None:
                said["would_evict_pods"] = would
            view[device] = said
        self.board.set_cluster(view)

    def instrument(self, meter: Any) -> None:
        """``otel_dra.k8s.taint.pods`` on ``meter``: per device with a rule the cluster reported on, the pods
        ``NoExecute`` would evict (its ``None`` rules), those waiting to be evicted, and those evicted."""
        from opentelemetry.metrics import CallbackOptions, Observation

        spec = cv.OTEL_DRA_K8S_TAINT_PODS

        def pods(_: CallbackOptions) -> list[Observation]:
            out: list[Observation] = []
            for (pool, device), statuses in self.readback.items():
                where = {cv.DRA_POOL_NAME: pool, cv.DRA_DEVICE_NAME: device}
                evicting = [st for st in statuses if st.effect == "NoExecute"]
                counts = {
                    "would": readback.would_evict(statuses),
                    "pending": readback.pending(statuses),
                    "evicted": sum(st.evicted or 0 for st in evicting) if evicting else None,
                }
                out.extend(
                    Observation(n, {**where, cv.EVICTION_ATTR: kind}) for kind, n in counts.items() if n is not None
                )
            return out

        meter.create_observable_gauge(spec.name, callbacks=[pods], unit=spec.unit, description=spec.description)

    def _audit(self, action: Action, old: Mapping[str, Any] | None) -> None:
        """The Event for one change the cluster took."""
        obj = action.body if action.body is not None else old
        if self.events is None or obj is None:
            return
        said = taint_change(action.verb, obj, old, self._domain, self._withheld.get(action.name, ""))
        self.events.record(rule_ref(obj), said.type, said.reason, said.action, said.note)

    def _brake_news(self, decision: Decision) -> None:
        """One line (and an Event) when the brake trips or its cool-down ends; the withheld count rides on the
        metric."""
        if self.events is not None and (decision.tripped_now or decision.released_now):
            regarding = self.brake_ref
            if regarding is None and decision.withheld:
                first = next(o for o in decision.rules if o["metadata"]["name"] == decision.withheld[0])
                regarding = rule_ref(first)
            if regarding is not None and decision.tripped_now:
                note = f"{decision.state.why}; {len(decision.withheld)} new acting taints written as None"
                self.events.record(regarding, WARNING, "QuarantineBrakeTripped", "Withhold", note)
            elif regarding is not None:
                note = "its cool-down ended: new acting taints are written again"
                self.events.record(regarding, NORMAL, "QuarantineBrakeReleased", "Release", note)
        if decision.tripped_now:
            cooldown = self.brake.settings.cooldown_s if self.brake is not None else 0.0
            until = f"its cool-down of {cooldown:g}s ends" if cooldown > 0 else "it is released"
            log.error(
                "%s: the brake on mass quarantine tripped: %s; writing %d new acting taints with their old effect "
                "(None for new rules) until %s",
                self.name,
                decision.state.why,
                len(decision.withheld),
                until,
            )
        elif decision.released_now:
            log.warning(
                "%s: the brake on mass quarantine's cool-down ended: new acting taints are written again", self.name
            )

    def _run(self) -> None:
        seen: int | None = None
        failed = False
        while not self._stop.is_set():
            version = self.board.version
            if version != seen or failed:
                try:
                    self.write()
                    failed = False
                except (OSError, val.K8sValidationError) as exc:
                    if not failed:
                        log.error("%s: cannot write to %s: %s; retrying", self.name, self.out_dir, exc)
                    failed = True
                seen = version
            self.reconcile()
            self.board.wait_for_change(seen, self.poll_s)

    def start(self) -> None:
        """Write (and, after ``warmup_s``, apply) now, then after every board change, on a daemon thread."""
        self._not_before = time.monotonic() + self.warmup_s
        if self.events is not None:
            self.events.start()
        self._thread = threading.Thread(target=self._run, name="k8s-output", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (within ``poll_s`` plus a request in flight), then write the files once
        more, so a change just before shutdown is not lost. Rules are not applied on the way out."""
        self._stop.set()
        self.board.wake_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            try:
                self.write()
            except (OSError, val.K8sValidationError) as exc:
                log.error("%s: last write to %s failed: %s", self.name, self.out_dir, exc)
        if self.events is not None:
            self.events.shutdown(min(1.0, timeout_s))


def new_k8s_sink(
    board: VerdictBoard,
    out_dir: Path | None,
    policy: Policy,
    api_version: str = DEFAULT_API_VERSION,
    driver: str | None = None,
    *,
    apply_rules: bool = False,
    attributes: bool = False,
    resync_s: float = K8sOutputConfig.resync_s,
    retry_s: float = K8sOutputConfig.retry_s,
    **options: Any,
) -> K8sOutputSink:
    """A sink of these settings (tests name them one by one): made into its :class:`K8sOutputConfig`,
    checked there; ``options``: :class:`K8sOutputSink`'s own (``poll_s``, ``name``, ``events``...)."""
    output = str(out_dir) if out_dir is not None else None
    config = K8sOutputConfig(output, api_version, driver, apply_rules, attributes, resync_s, retry_s)
    return K8sOutputSink(board, policy, config, **options)
