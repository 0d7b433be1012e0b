"""The Grafana dashboards (grafana/) and the Prometheus rules (prometheus/).

Static checks: the dashboards are what grafana/generate.py writes, parse, have unique uids and
use the ``datasource`` variable everywhere; every PromQL expression (panels and rules) parses;
``promtool check rules`` and ``promtool test rules`` pass; the PrometheusRule wraps the same groups.

The live check (the point of it all): three simulated agents (node-a with faults, among them a link
fault on the two GPUs behind one PCIe switch; node-b that goes stale; node-c whose every GPU has link
errors, a fault of their fabric, a fleet-wide finding) scraped every second by a real Prometheus
that loads prometheus/rules.yaml; then every query of every panel, every template variable, every
recording rule and every alert returns data from that Prometheus. A panel whose query returns
nothing fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import yaml

from otel_dra import conventions as cv
from otel_dra.vocabulary import HW_STATES, REASONS
from tests.conftest import REPO, ensure_binary, free_port, http_get, wait_for

GRAFANA = REPO / "grafana"
PROMETHEUS = REPO / "prometheus"
RULES = PROMETHEUS / "rules.yaml"
DS = {"type": "prometheus", "uid": "${datasource}"}
AGENT_JOB = "otel-dra-agents"  # what the rules' up{job=~".*otel-dra.*"} must match

# Grafana's built-in variables, made concrete and small: the fleet has run for seconds, not hours.
# Scrapes are every second, so 30s holds ~30 samples: enough for rate, increase and changes.
BUILTINS = {"__rate_interval": "30s", "__range": "30s", "__interval": "5s"}
# The simulated fleet: the fleet dashboard's multi-value node as Grafana renders a regex of two
# values; the device dashboard's single node and device (gpu-3 has the faults, so every panel of
# the drill-down, driver fault codes included, has something to show).
FLEET_VARS = {"node": "node-a|node-b"}
DEVICE_VARS = {"node": "node-a", "device": "gpu-3"}


def promql() -> ModuleType:
    try:
        import promql_parser
    except ImportError:
        pytest.fail("promql-parser is needed by this test: pip install -e '.[test]' (or pip install promql-parser)")
    return promql_parser


# -- what the files hold -------------------------------------------------------------------------
def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otel_dra_grafana_generate", GRAFANA / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}


def all_panels(panels: list[dict]) -> Iterator[dict]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def panel_queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title and refId, expression) of every target of every panel, collapsed rows included."""
    return [
        (f"{p['title']} [{t['refId']}]", t["expr"])
        for p in all_panels(dash["panels"])
        if p["type"] != "row"
        for t in p["targets"]
    ]


def variable_queries(dash: dict) -> list[tuple[str, str]]:
    return [(v["name"], v["definition"]) for v in dash["templating"]["list"] if v["type"] == "query"]


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's variable interpolation, for the forms the dashboards use ($name, ${name})."""
    values = {**BUILTINS, **variables}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"a variable is left in {expr!r}"
    return expr


def dashboard_vars(dash: dict) -> dict[str, str]:
    return DEVICE_VARS if dash["uid"] == "otel-dra-device" else FLEET_VARS


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def recordings() -> dict[str, dict]:
    return {r["record"]: r for r in rules() if "record" in r}


_COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}


def data_parts(expr: Any) -> list[Any]:
    """The parts of an alert expression that must return data while nothing is wrong.

    An alert's expression is empty while all is well (no device Unhealthy, no agent down), so
    "returns data" is asked of its parts instead: a comparison with a number is a threshold,
    and what it compares is the part; ``unless``/``and``/``or`` and joins need both sides;
    ``absent(x)`` needs ``x``. E.g. ``up{job=~".*otel-dra.*"} == 0`` -> ``up{job=~".*otel-dra.*"}``."""
    p = promql()
    if isinstance(expr, p.ParenExpr):
        return data_parts(expr.expr)
    if isinstance(expr, p.Call) and expr.func.name in ("absent", "absent_over_time"):
        return data_parts(expr.args[0])
    if isinstance(expr, p.BinaryExpr):
        filtering = str(expr.op) in _COMPARISONS and not (expr.modifier and expr.modifier.return_bool)
        if filtering and isinstance(expr.rhs, p.NumberLiteral):
            return data_parts(expr.lhs)
        if filtering and isinstance(expr.lhs, p.NumberLiteral):
            return data_parts(expr.rhs)
        if isinstance(expr.lhs, p.NumberLiteral) or isinstance(expr.rhs, p.NumberLiteral):
            return [expr]
        return data_parts(expr.lhs) + data_parts(expr.rhs)
    return [expr]


def selector_names(expr: Any) -> set[str]:
    """Every metric name an expression selects."""
    p = promql()
    if isinstance(expr, p.VectorSelector):
        return {expr.name} if expr.name else set()
    if isinstance(expr, p.MatrixSelector):
        return selector_names(expr.vector_selector)
    if isinstance(expr, p.BinaryExpr):
        return selector_names(expr.lhs) | selector_names(expr.rhs)
    if isinstance(expr, p.Call):
        return set().union(*(selector_names(a) for a in expr.args))
    if isinstance(expr, p.AggregateExpr):
        return selector_names(expr.expr) | (selector_names(expr.param) if expr.param is not None else set())
    if isinstance(expr, p.ParenExpr | p.SubqueryExpr | p.UnaryExpr):
        return selector_names(expr.expr)
    return set()


def prom_name(spec: cv.MetricSpec) -> str:
    """The Prometheus name of a metric, as the OpenTelemetry exporter maps it."""
    from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_full_name

    name = sanitize_full_name(spec.name)
    unit = map_unit(spec.unit)
    if unit and not name.endswith(unit):
        name += "_" + unit
    return name + ("_total" if spec.instrument == cv.COUNTER else "")


# -- static checks ----------------------------------------------------------------------------
def test_dashboards_are_what_the_generator_writes():
    gen = load_generator()
    written = {p.name for p in (GRAFANA / "dashboards").glob("*.json")}
    assert written == set(gen.DASHBOARDS)
    for name, build in gen.DASHBOARDS.items():
        assert (GRAFANA / "dashboards" / name).read_text() == gen.render(build), (
            f"grafana/dashboards/{name} is out of date: run python grafana/generate.py"
        )


def test_dashboards_parse_have_unique_uids_and_use_the_datasource_variable():
    dashes = dashboards()
    assert len(dashes) == 2
    uids = [d["uid"] for d in dashes.values()]
    assert len(set(uids)) == len(uids) and all(uids)
    for name, dash in dashes.items():
        ids = [p["id"] for p in all_panels(dash["panels"])]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        # Importable: an __inputs datasource; provisionable: nothing but __inputs names it (a
        # provisioned dashboard gets no input substitution, so ${DS_PROMETHEUS} would stay literal).
        assert [(i["name"], i["type"], i["pluginId"]) for i in dash["__inputs"]] == [
            ("DS_PROMETHEUS", "datasource", "prometheus")
        ]
        body = {k: v for k, v in dash.items() if k != "__inputs"}
        assert "DS_PROMETHEUS" not in json.dumps(body), name
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"] == DS, (name, v["name"])
        assert variables["node"]["definition"] == "label_values(hw_status, k8s_node_name)"
        for p in all_panels(dash["panels"]):
            if p["type"] == "row":
                continue
            assert p["datasource"] == DS, (name, p["title"])
            assert p["targets"], (name, p["title"])
            for t in p["targets"]:
                assert t["datasource"] == DS, (name, p["title"], t["refId"])
            refs = [t["refId"] for t in p["targets"]]
            assert len(set(refs)) == len(refs), (name, p["title"])
    linked = {uid for d in dashes.values() for uid in re.findall(r"/d/([\w-]+)/", json.dumps(d))}
    assert linked and linked <= set(uids), "a data link names a dashboard uid that is not here"
    by_uid = {d["uid"]: {v["name"] for v in d["templating"]["list"]} for d in dashes.values()}
    assert by_uid == {"otel-dra-fleet": {"datasource", "node"}, "otel-dra-device": {"datasource", "node", "device"}}


def test_panel_kinds_the_issue_asks_for():
    dashes = {d["uid"]: d for d in dashboards().values()}
    device = dashes["otel-dra-device"]
    kinds = {p["title"]: p["type"] for p in all_panels(device["panels"])}
    assert kinds["Verdict over time"] == "state-timeline"
    exprs = " ".join(e for _, e in panel_queries(device))
    for needed in (
        "hw_temperature_limit_celsius",
        "hw_power_limit_watts",
        "hw_throttle_time_seconds_total",
        "hw_errors_total",
    ):
        assert needed in exprs
    fleet_exprs = " ".join(e for _, e in panel_queries(dashes["otel-dra-fleet"]))
    for needed in ("devices_by_health", "devices_by_state", "devices_by_reason", "topk("):
        assert needed in fleet_exprs


def test_every_panel_query_and_rule_parses():
    p = promql()
    for name, dash in dashboards().items():
        for title, expr in panel_queries(dash):
            try:
                p.parse(substitute(expr, dashboard_vars(dash)))
            except ValueError as err:
                pytest.fail(f"{name}: {title}: {expr!r} does not parse: {err}")
    for rule in rules():
        try:
            p.parse(rule["expr"])
        except ValueError as err:
            pytest.fail(f"{rule.get('alert') or rule.get('record')}: does not parse: {err}")


def test_queries_name_only_metrics_that_exist():
    p = promql()
    specs = (*cv.METRICS.values(), *cv.PUSH_METRICS.values(), *cv.FLEET_METRICS.values())
    known = {prom_name(spec) for spec in specs} | set(recordings())
    known |= {
        "up",
        "target_info",
        "scrape_duration_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }
    exprs = [r["expr"] for r in rules()]
    exprs += [substitute(e, dashboard_vars(d)) for d in dashboards().values() for _, e in panel_queries(d)]
    for expr in exprs:
        unknown = selector_names(p.parse(expr)) - known
        assert not unknown, f"{expr!r} selects {unknown}"


def test_rules_cover_every_reason_and_state_and_every_alert_says_what_to_do():
    by_reason = recordings()["otel_dra:devices_by_reason:count"]["expr"]
    assert sorted(re.findall(r'"reason", "(\w+)"', by_reason)) == sorted(REASONS)
    state_code = recordings()["otel_dra:device_state:code"]["expr"]
    assert sorted(re.findall(r'hw_state="(\w+)"', state_code)) == sorted(HW_STATES)
    # A finding's alert is critical or a warning by its worst device's health (rules_test.yaml fires both).
    by_health = '{{ if eq $labels.dra_device_health_state "Unhealthy" }}critical{{ else }}warning{{ end }}'
    for name, alert in alerts().items():
        assert alert["labels"]["severity"] in ("critical", "warning", by_health), name
        assert alert["annotations"]["runbook"].startswith("Remediation"), name
        assert {"summary", "description"} <= set(alert["annotations"]), name
    # Where the alert's series carry the verdict's remediation, the runbook names it.
    for name in ("OtelDraDeviceUnhealthy", "OtelDraDeviceDegraded", "OtelDraDeviceUnknown"):
        assert "{{ $labels.dra_device_health_remediation }}" in alerts()[name]["annotations"]["runbook"]


def test_promtool_checks_the_rules():
    promtool = ensure_binary("promtool", "prometheus")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fire_and_do_not_fire_every_alert():
    promtool = ensure_binary("promtool", "prometheus")
    tests = yaml.safe_load((PROMETHEUS / "rules_test.yaml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", [])}
    fired = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", []) if case["exp_alerts"]}
    quiet = {
        case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", []) if not case["exp_alerts"]
    }
    assert tested == fired == quiet == set(alerts())
    recorded = {case["expr"] for t in tests["tests"] for case in t.get("promql_expr_test", [])}
    assert recorded == set(recordings())
    result = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"], capture_output=True, text=True, cwd=PROMETHEUS
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_wraps_the_same_groups():
    spec = importlib.util.spec_from_file_location("otel_dra_make_prometheusrule", PROMETHEUS / "make_prometheusrule.py")
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    text = (PROMETHEUS / "prometheusrule.yaml").read_text()
    assert text == maker.render(RULES.read_text()), "run python prometheus/make_prometheusrule.py"
    wrapped = yaml.safe_load(text)
    assert (wrapped["apiVersion"], wrapped["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert wrapped["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_provisioning_files():
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/otel-dra.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


# -- the live check: a simulated fleet, a real Prometheus with the rules -----------------------------
@dataclass
class Fleet:
    url: str

    def query(self, expr: str) -> tuple[str, list[dict]]:
        """("success", result) or (errorType: error, [])."""
        _, body = http_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        data = json.loads(body)
        if data["status"] != "success":
            return f"{data['errorType']}: {data['error']}", []
        return "success", data["data"]["result"]

    def label_values(self, definition: str) -> list[str]:
        """A Grafana ``label_values(selector, label)`` variable query, as Grafana asks Prometheus."""
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition)
        assert match, definition
        selector, label = match.groups()
        q = urllib.parse.urlencode({"match[]": selector})
        status, body = http_get(f"{self.url}/api/v1/label/{label}/values?{q}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return data["data"]

    def rules(self) -> list[dict]:
        status, body = http_get(f"{self.url}/api/v1/rules")
        assert status == 200
        return [r | {"group": g["name"]} for g in json.loads(body)["data"]["groups"] for r in g["rules"]]


def live_queries() -> list[tuple[str, str]]:
    """(where, expression) of everything that must return data from the simulated fleet."""
    p = promql()
    out = []
    for name, dash in dashboards().items():
        out += [(f"{name}: {title}", substitute(e, dashboard_vars(dash))) for title, e in panel_queries(dash)]
    for record, rule in recordings().items():
        out += [(f"recording rule {record}", rule["expr"]), (f"recorded series {record}", record)]
    for alert, rule in alerts().items():
        out += [(f"alert {alert}, part", str(part)) for part in data_parts(p.parse(rule["expr"]))]
    return out


def empty_queries(fleet: Fleet, queries: list[tuple[str, str]]) -> list[str]:
    empty = []
    for where, expr in queries:
        status, result = fleet.query(expr)
        if status != "success" or not result:
            empty.append(f"{where}: {expr} -> {status if status != 'success' else 'no data'}")
    return empty


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    binary = ensure_binary("prometheus", "prometheus")
    # node-b's devices go Unknown (stale) 2 s after its telemetry stops, not the default 60 s.
    (work / "fast-stale.yaml").write_text("stale_timeout: 2s\n")
    # node-a pushes OTLP to a collector that is not there, through a queue of one push: it drops.
    no_collector = f"http://127.0.0.1:{free_port()}"
    agent_args = {
        "node-a": [
            "--fault", "gpu-3:memory_ecc@1", "--fault", "gpu-3:driver_errors@1",
            "--fault", "gpu-5:thermal@1", "--fault", "gpu-6:power_throttling@1",
            "--otlp-endpoint", no_collector, "--otlp-interval", "1", "--otlp-queue-max-points", "1",
            # gpu-0 and gpu-1 share the PCIe switch 0000:10:00.0: a link finding of that switch's.
            "--fault", "gpu-0:link@1", "--fault", "gpu-1:link@1",
        ],
        "node-b": ["--policy", str(work / "fast-stale.yaml"), "--fault", "*:stale@5"],
        "node-c": ["--fault", "*:link@1"],
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    agents, ports, procs = [], [], []
    try:
        for node, args in agent_args.items():
            port = free_port()
            argv = [sys.executable, "-m", "otel_dra", "run", "--source", "simulated", "--host", "127.0.0.1"]
            argv += ["--prometheus-port", str(port), "--interval", "1", "--node-name", node, *args]
            with (work / f"agent-{node}.log").open("wb") as log:
                agents.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
            ports.append(port)
        for port, proc in zip(ports, agents, strict=True):
            wait_for(
                lambda p=port, a=proc: http_get(f"http://127.0.0.1:{p}/healthz", 1)[0] == 200 or a.poll() is not None,
                30,
                "an agent",
            )
            assert proc.poll() is None, "an agent exited early: see " + str(work)
        # A fleet (nobody pushes to it): its receiver's counters, which the fleet's alerts read.
        fleet_port = free_port()
        argv = [sys.executable, "-m", "otel_dra", "fleet", "--host", "127.0.0.1", "--prometheus-port", str(fleet_port)]
        argv += ["--otlp-grpc-port", str(free_port()), "--otlp-http-port", str(free_port()), "--evaluate-every", "1"]
        with (work / "fleet.log").open("wb") as log:
            agents.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
        wait_for(lambda: http_get(f"http://127.0.0.1:{fleet_port}/healthz", 1)[0] == 200, 30, "the fleet")
        port = free_port()
        targets = json.dumps([f"127.0.0.1:{p}" for p in ports])
        config = work / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(RULES))}]\n"
            "scrape_configs:\n"
            f"  - job_name: {AGENT_JOB}\n    static_configs: [{{targets: {targets}}}]\n"
            f"  - job_name: otel-dra-fleet\n    static_configs: [{{targets: ['127.0.0.1:{fleet_port}']}}]\n"
        )
        argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}"]
        argv += [f"--web.listen-address=127.0.0.1:{port}"]
        with (work / "prometheus.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        fleet = Fleet(f"http://127.0.0.1:{port}")
        wait_for(lambda: http_get(fleet.url + "/-/ready", 1)[0] == 200, 60, "Prometheus to be ready")
        # Ready when the faults show in the recorded counts (gpu-3 Unhealthy, all of node-b Unknown),
        # their alerts are pending, and every query has data; the tests say what is missing after 60 s.
        count = "otel_dra:devices_by_health:count"
        faults = (
            f'{count}{{k8s_node_name="node-a", dra_device_health_state="Unhealthy"}} >= 1'
            f' and on () {count}{{k8s_node_name="node-b", dra_device_health_state="Unknown"}} == 8'
            ' and on () count(ALERTS{alertname=~"OtelDraDeviceUnhealthy|OtelDraNodeStale|OtelDraPushDropping",'
            ' alertstate="pending"}) == 3'
        )
        queries = live_queries()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if fleet.query(faults)[1] and not empty_queries(fleet, queries):
                break
            time.sleep(1)
        yield fleet
    finally:
        for proc in agents + procs:
            proc.terminate()
        for proc in agents + procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.e2e
def test_every_dashboard_query_returns_data_from_the_simulated_fleet(fleet):
    queries = []
    for name, dash in dashboards().items():
        queries += [(f"{name}: {title}", substitute(e, dashboard_vars(dash))) for title, e in panel_queries(dash)]
    assert len(queries) > 40
    empty = empty_queries(fleet, queries)
    assert not empty, "panels without data:\n" + "\n".join(empty)


@pytest.mark.e2e
def test_every_template_variable_has_values(fleet):
    for name, dash in dashboards().items():
        for variable, definition in variable_queries(dash):
            values = fleet.label_values(substitute(definition, dashboard_vars(dash)))
            assert values, f"{name}: variable {variable} ({definition}) has no values"
            if variable == "node":
                assert set(values) == {"node-a", "node-b", "node-c"}
            if variable == "device":
                assert "gpu-3" in values


@pytest.mark.e2e
def test_every_recording_rule_returns_data_and_is_recorded(fleet):
    queries = []
    for record, rule in recordings().items():
        queries += [(f"{record} (its expression)", rule["expr"]), (f"{record} (recorded)", record)]
    empty = empty_queries(fleet, queries)
    assert not empty, "recording rules without data:\n" + "\n".join(empty)
    # The simulated faults, counted: node-a's gpu-3 failed (memory_ecc); node-b's 8 devices Unknown.
    health = {
        (r["metric"]["k8s_node_name"], r["metric"]["dra_device_health_state"]): float(r["value"][1])
        for r in fleet.query("otel_dra:devices_by_health:count")[1]
    }
    assert health[("node-a", "Unhealthy")] >= 1 and health[("node-b", "Unknown")] == 8
    reasons = {
        (r["metric"]["k8s_node_name"], r["metric"]["reason"])
        for r in fleet.query("otel_dra:devices_by_reason:count")[1]
    }
    assert {("node-a", "memory_ecc"), ("node-b", "stale")} <= reasons


@pytest.mark.e2e
def test_every_alert_expression_evaluates_and_its_parts_return_data(fleet):
    """Each alert's whole expression must evaluate (no error: a many-to-many join would show here);
    its data parts (``data_parts``: the expression without its thresholds) must return data. The
    simulated faults make three alerts' whole expressions non-empty, and the others stay empty."""
    p = promql()
    failures = []
    for name, rule in alerts().items():
        status, _ = fleet.query(rule["expr"])
        if status != "success":
            failures.append(f"{name}: {status}")
        failures += empty_queries(fleet, [(f"{name}, part", str(part)) for part in data_parts(p.parse(rule["expr"]))])
    assert not failures, "\n".join(failures)

    def series(alert: str) -> set[tuple[str, str]]:
        return {
            (r["metric"].get("k8s_node_name", ""), r["metric"].get("hw_id", ""))
            for r in fleet.query(alerts()[alert]["expr"])[1]
        }

    assert ("node-a", "gpu-3") in series("OtelDraDeviceUnhealthy")
    assert series("OtelDraNodeStale") == {("node-b", "")}
    assert series("OtelDraPushDropping") == {("node-a", "")}  # node-b does not push: no series, no alert
    assert series("OtelDraAgentDown") == series("OtelDraAgentAbsent") == set()
    assert series("OtelDraFleetOverloaded") == series("OtelDraFleetRefusingPoints") == set()
    assert series("OtelDraDeviceUnknown") == set()  # node-b's devices are the stale node's alert
    # One series a finding, whatever its device count: node-a's switch (2 GPUs), node-c's fabric (8 GPUs, fleet-wide);
    # none of their GPUs is a device alert's.
    findings = {
        (r["metric"].get("k8s_node_name", ""), r["metric"]["dra_device_health_group"], r["value"][1])
        for name in ("OtelDraFinding", "OtelDraFleetFinding")
        for r in fleet.query(alerts()[name]["expr"])[1]
    }
    assert {(node, group.split("/")[0], n) for node, group, n in findings} == {
        ("node-a", "pcie", "2"),
        ("", "fabric", "8"),
    }, findings
    assert not {("node-a", "gpu-0"), ("node-a", "gpu-1")} & (
        series("OtelDraDeviceDegraded") | series("OtelDraDeviceUnhealthy")
    )


@pytest.mark.e2e
def test_prometheus_evaluates_every_rule_without_errors(fleet):
    loaded = fleet.rules()
    assert {r["name"] for r in loaded} == set(recordings()) | set(alerts())
    for rule in loaded:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
    state = {r["name"]: r["state"] for r in loaded if r["type"] == "alerting"}
    # Their `for` has not passed yet: pending; the agents are up: inactive.
    assert state["OtelDraDeviceUnhealthy"] == state["OtelDraNodeStale"] == state["OtelDraPushDropping"] == "pending"
    assert state["OtelDraAgentDown"] == state["OtelDraAgentAbsent"] == "inactive"


def test_the_readme_prometheus_config_is_valid():
    """prometheus/prometheus.yml (the README's try-it-locally config) loads the rules and scrapes the fleet."""
    from tests.conftest import ensure_binary

    promtool = ensure_binary("promtool", "prometheus")
    result = subprocess.run(
        [promtool, "check", "config", str(REPO / "prometheus" / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "16 rules found" in result.stdout or "rules found" in result.stdout
