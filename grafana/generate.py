"""Generate the otel-dra Grafana dashboards (grafana/dashboards/*.json) from this file.

    python grafana/generate.py          # write the dashboards
    python grafana/generate.py --check  # exit 1 when a written dashboard differs from this file's

Every panel and query uses the ``datasource`` variable (a Prometheus datasource, chosen in the
dashboard), so the same JSON works imported by hand (``__inputs``) and provisioned from files.
The fleet panels read the recording rules of prometheus/rules.yaml (``otel_dra:*``); that
Prometheus must load them. tests/project/test_grafana_rules.py runs every query here against a real
Prometheus scraping simulated agents and fails on any that returns nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"

Json = dict[str, Any]

DS: Json = {"type": "prometheus", "uid": "${datasource}"}
FLEET_UID = "otel-dra-fleet"
DEVICE_UID = "otel-dra-device"
AGENT_JOB = 'job=~".*otel-dra.*"'

# hw.state and health as the recording rules code them (prometheus/rules.yaml).
STATE_CODES = [
    (1, "ok", "green"),
    (2, "needs_cleaning", "blue"),
    (3, "degraded", "orange"),
    (4, "predicted_failure", "yellow"),
    (5, "failed", "red"),
]
HEALTH_CODES = [(0, "Healthy", "green"), (1, "Unknown", "#8e8e8e"), (2, "Unhealthy", "red")]
STATE_COLORS = {name: color for _, name, color in STATE_CODES}
HEALTH_COLORS = {name: color for _, name, color in HEALTH_CODES}


# -- queries and small pieces -----------------------------------------------------------------
def target(expr: str, legend: str = "__auto", ref: str = "A", *, instant: bool = False, table: bool = False) -> Json:
    t: Json = {
        "datasource": DS,
        "refId": ref,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
    }
    if table:
        t["format"] = "table"
    return t


def mappings(codes: list[tuple[int, str, str]]) -> list[Json]:
    return [
        {
            "type": "value",
            "options": {
                str(code): {"text": text, "color": color, "index": i} for i, (code, text, color) in enumerate(codes)
            },
        }
    ]


def thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"value": value, "color": color} for value, color in steps]}


def color_by_name(colors: dict[str, str]) -> list[Json]:
    return [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}],
        }
        for name, color in colors.items()
    ]


def limit_lines(ref: str) -> Json:
    """Draw query ``ref`` (a limit or a cap) as dashed lines without fill."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.lineWidth", "value": 1},
        ],
    }


def device_link(node_field: str = "k8s_node_name", device_field: str = "hw_id") -> Json:
    return {
        "title": "Device drill-down",
        "url": f"/d/{DEVICE_UID}/otel-dra-device?${{datasource:queryparam}}"
        f"&var-node=${{__data.fields.{node_field}}}&var-device=${{__data.fields.{device_field}}}&${{__url_time_range}}",
    }


def device_series_link() -> Json:
    """A data link for series that carry k8s_node_name and hw_id labels."""
    return {
        "title": "Device drill-down",
        "url": f"/d/{DEVICE_UID}/otel-dra-device?${{datasource:queryparam}}"
        "&var-node=${__field.labels.k8s_node_name}&var-device=${__field.labels.hw_id}&${__url_time_range}",
    }


def table_fields(names: dict[str, str]) -> list[Json]:
    """Keep ``names`` (label -> column title) in this order."""
    return [
        {"id": "filterFieldsByName", "options": {"include": {"names": list(names)}}},
        {
            "id": "organize",
            "options": {
                "indexByName": {name: i for i, name in enumerate(names)},
                "renameByName": {name: title for name, title in names.items() if title != name},
            },
        },
    ]


# -- panels ---------------------------------------------------------------------------------------
def panel(kind: str, title: str, targets: list[Json], description: str, **extra: Any) -> Json:
    p: Json = {"type": kind, "title": title, "description": description, "datasource": DS, "targets": targets}
    p.update(extra)
    return p


def timeseries(
    title: str,
    targets: list[Json],
    description: str,
    *,
    unit: str = "short",
    stack: bool = False,
    overrides: list[Json] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    links: list[Json] | None = None,
) -> Json:
    defaults: Json = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 30 if stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if links:
        defaults["links"] = links
    return panel(
        "timeseries",
        title,
        targets,
        description,
        fieldConfig={"defaults": defaults, "overrides": overrides or []},
        options={
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )


def stat(
    title: str,
    targets: list[Json],
    description: str,
    *,
    unit: str = "short",
    steps: Json | None = None,
    value_mappings: list[Json] | None = None,
    no_value: str | None = None,
    color_mode: str = "background",
) -> Json:
    defaults: Json = {
        "unit": unit,
        "color": {"mode": "thresholds"},
        "thresholds": steps or thresholds((None, "blue")),
        "mappings": value_mappings or [],
    }
    if no_value is not None:
        defaults["noValue"] = no_value
    return panel(
        "stat",
        title,
        targets,
        description,
        fieldConfig={"defaults": defaults, "overrides": []},
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": color_mode,
            "graphMode": "none",
            "justifyMode": "center",
            "textMode": "value",
            "orientation": "auto",
        },
    )


def table(
    title: str,
    targets: list[Json],
    description: str,
    *,
    transformations: list[Json],
    overrides: list[Json] | None = None,
    value_mappings: list[Json] | None = None,
) -> Json:
    return panel(
        "table",
        title,
        targets,
        description,
        fieldConfig={
            "defaults": {"custom": {"align": "auto", "filterable": True}, "mappings": value_mappings or []},
            "overrides": overrides or [],
        },
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
        transformations=transformations,
    )


def bargauge(title: str, targets: list[Json], description: str, *, unit: str = "short", links: bool = True) -> Json:
    defaults: Json = {"unit": unit, "min": 0, "color": {"mode": "continuous-GrYlRd"}}
    if unit == "percentunit":
        defaults["max"] = 1
    if links:
        defaults["links"] = [device_series_link()]
    return panel(
        "bargauge",
        title,
        targets,
        description,
        fieldConfig={"defaults": defaults, "overrides": []},
        options={
            "displayMode": "gradient",
            "orientation": "horizontal",
            "showUnfilled": True,
            "valueMode": "color",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    )


def state_timeline(
    title: str,
    targets: list[Json],
    description: str,
    *,
    value_mappings: list[Json] | None = None,
    overrides: list[Json] | None = None,
    links: list[Json] | None = None,
) -> Json:
    defaults: Json = {
        "color": {"mode": "thresholds"},
        "thresholds": thresholds((None, "#8e8e8e")),
        "mappings": value_mappings or [],
        "custom": {"fillOpacity": 80, "lineWidth": 0},
    }
    if links:
        defaults["links"] = links
    return panel(
        "state-timeline",
        title,
        targets,
        description,
        fieldConfig={"defaults": defaults, "overrides": overrides or []},
        options={
            "mergeValues": True,
            "showValue": "never",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "single", "sort": "none"},
        },
    )


# -- layout -----------------------------------------------------------------------------------------
class Layout:
    """Places panels left to right in rows of 24 columns and numbers them."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self._into: list[Json] = self.panels
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.line_h = 0

    def _newline(self) -> None:
        self.y += self.line_h
        self.x = 0
        self.line_h = 0

    def row(self, title: str, *, repeat: str | None = None, collapsed: bool = False) -> None:
        self._newline()
        r: Json = {
            "type": "row",
            "title": title,
            "id": self.next_id,
            "collapsed": collapsed,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            "panels": [],
        }
        if repeat:
            r["repeat"] = repeat
        self.next_id += 1
        self.panels.append(r)
        self._into = r["panels"] if collapsed else self.panels
        self.y += 1

    def add(self, p: Json, w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        p["id"] = self.next_id
        self.next_id += 1
        p["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self._into.append(p)
        self.x += w
        self.line_h = max(self.line_h, h)


# -- dashboards -------------------------------------------------------------------------------------
def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(name: str, label: str, query: str, *, multi: bool) -> Json:
    v: Json = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {},
        "hide": 0,
        "includeAll": multi,
        "multi": multi,
        "options": [],
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
    }
    if multi:
        v["allValue"] = ".*"
    return v


def dashboard(uid: str, title: str, description: str, layout: Layout, variables: list[Json], time_from: str) -> Json:
    used = sorted({p["type"] for p in _all_panels(layout.panels)} - {"row"})
    names = {
        "bargauge": "Bar gauge",
        "stat": "Stat",
        "state-timeline": "State timeline",
        "table": "Table",
        "timeseries": "Time series",
    }
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus that scrapes otel-dra and loads prometheus/rules.yaml",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": names[kind], "version": ""} for kind in used),
        ],
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["otel-dra", "gpu", "dra"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": time_from, "to": "now"},
        "refresh": "1m",
        "timezone": "",
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "title": "otel-dra",
                "tags": ["otel-dra"],
                "asDropdown": False,
                "includeVars": False,
                "keepTime": True,
                "targetBlank": False,
            }
        ],
        "templating": {"list": variables},
        "panels": layout.panels,
    }


def _all_panels(panels: list[Json]) -> list[Json]:
    out = []
    for p in panels:
        out.append(p)
        out.extend(_all_panels(p.get("panels", [])))
    return out


def fleet() -> Json:
    n = 'k8s_node_name=~"$node"'
    lay = Layout()

    lay.row("Now")
    lay.add(
        stat(
            "Devices",
            [target(f"sum(otel_dra:devices_by_health:count{{{n}}})")],
            "Devices with a verdict on the selected nodes.",
            color_mode="value",
        ),
        4,
        4,
    )
    red_at_1 = thresholds((None, "green"), (1, "red"))
    lay.add(
        stat(
            "Unhealthy",
            [target(f'sum(otel_dra:devices_by_health:count{{{n}, dra_device_health_state="Unhealthy"}}) or vector(0)')],
            "Devices the kubelet reports Unhealthy to DRA (their hw.state is one of the policy's unhealthy_states).",
            steps=red_at_1,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Unknown",
            [target(f'sum(otel_dra:devices_by_health:count{{{n}, dra_device_health_state="Unknown"}}) or vector(0)')],
            "Devices without a verdict: their node stopped reporting (reason stale).",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Not ok (hw.state)",
            [target(f'sum(otel_dra:devices_by_state:count{{{n}, hw_state!="ok"}}) or vector(0)')],
            "Devices in any hw.state but ok: degraded and predicted_failure devices still take work.",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Stale nodes",
            [target(f"count(max by (k8s_node_name) (hw_status{{{n}}}) == 0) or vector(0)")],
            "Nodes whose every device is Unknown (hw_status all 0): the agent or its telemetry stopped.",
            steps=red_at_1,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Targets down",
            [target(f"count(up{{{AGENT_JOB}}} == 0) or vector(0)")],
            "otel-dra agents (or fleets) Prometheus fails to scrape: their nodes' devices get no verdict.",
            steps=red_at_1,
        ),
        4,
        4,
    )

    lay.row("Over time")
    lay.add(
        timeseries(
            "Devices by health",
            [
                target(
                    f"sum by (dra_device_health_state) (otel_dra:devices_by_health:count{{{n}}})",
                    "{{dra_device_health_state}}",
                )
            ],
            "dra.device.health.state: what the kubelet knows (Healthy, Unhealthy, Unknown).",
            stack=True,
            minimum=0,
            overrides=color_by_name(HEALTH_COLORS),
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Devices by hw.state",
            [target(f"sum by (hw_state) (otel_dra:devices_by_state:count{{{n}}})", "{{hw_state}}")],
            "The verdict's hw.state. Unknown devices are in no state.",
            stack=True,
            minimum=0,
            overrides=color_by_name(STATE_COLORS),
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Devices by reason",
            [target(f"sum by (reason) (otel_dra:devices_by_reason:count{{{n}}})", "{{reason}}")],
            "Devices per verdict reason (dra.device.health.reasons); a device with two reasons counts under both.",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Devices by remediation",
            [
                target(
                    f"sum by (dra_device_health_remediation) "
                    f'(otel_dra:devices_by_remediation:count{{{n}, dra_device_health_remediation!="none"}})',
                    "{{dra_device_health_remediation}}",
                )
            ],
            "What the verdicts call for, least to most disruptive: reduce_load, check_workload, reset_device, "
            "reboot_node, update_firmware, replace_device.",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Error rate by type (per minute, 5m)",
            [target(f"60 * sum by (error_type) (otel_dra:hw_errors:rate5m{{{n}}})", "{{error_type}}")],
            "hw.errors across the selected nodes, by error.type.",
            unit="cpm",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Throttled devices by reason (5m)",
            [
                target(
                    f"sum by (hw_throttle_reason) (otel_dra:hw_throttle_time:rate5m{{{n}}})",
                    "{{hw_throttle_reason}}",
                )
            ],
            "Throttled time per second summed over devices: how many devices' worth of clocks are held down.",
            stack=True,
            minimum=0,
        ),
        12,
        8,
    )

    lay.row("Devices that need attention")
    lay.add(
        table(
            "Devices not Healthy",
            [target(f'dra_device_health{{{n}, dra_device_health_state!="Healthy"}}', instant=True, table=True)],
            "Every Unhealthy or Unknown device now, with its reasons and remediation, and what the verdict is "
            "about when more than the device (scope node, workload, link or firmware; group: node/train-007). "
            "The device links to its drill-down.",
            transformations=table_fields(
                {
                    "k8s_node_name": "node",
                    "hw_id": "device",
                    "dra_pool_name": "DRA pool",
                    "dra_device_name": "DRA device",
                    "dra_device_health_state": "health",
                    "dra_device_health_reasons": "reasons",
                    "dra_device_health_remediation": "remediation",
                    "dra_device_health_scope": "scope",
                    "dra_device_health_group": "group",
                    "hw_model": "model",
                    "hw_serial_number": "serial",
                }
            ),
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "device"},
                    "properties": [{"id": "links", "value": [device_link()]}],
                }
            ],
        ),
        12,
        8,
    )
    lay.add(
        table(
            "Devices not ok (hw.state)",
            [
                target(
                    f'(hw_status{{{n}, hw_state!="ok"}} == 1) * on (job, instance, k8s_node_name, hw_id) '
                    "group_left (dra_device_health_reasons, dra_device_health_remediation) dra_device_health",
                    instant=True,
                    table=True,
                )
            ],
            "Every device whose hw.state is not ok now, Healthy or not.",
            transformations=table_fields(
                {
                    "k8s_node_name": "node",
                    "hw_id": "device",
                    "hw_state": "hw.state",
                    "dra_device_health_reasons": "reasons",
                    "dra_device_health_remediation": "remediation",
                    "hw_model": "model",
                }
            ),
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "device"},
                    "properties": [{"id": "links", "value": [device_link()]}],
                }
            ],
        ),
        12,
        8,
    )

    # Fleet-wide findings (fabric/..., firmware/...) have no node: shown whichever nodes are chosen.
    nf = 'k8s_node_name=~"$node|"'
    lay.add(
        table(
            "Findings beyond a device",
            [
                target(f"otel_dra:finding:devices{{{nf}}}", ref="A", instant=True, table=True),
                target(f"otel_dra:finding:nodes{{{nf}}}", ref="B", instant=True, table=True),
            ],
            "One row per finding about what devices share (scope workload, node, link or firmware; contract "
            "section 4), however many devices it touches: a PCIe switch (group pcie/<address>, with its node: "
            "addresses repeat across hosts), a node, a workload, or fleet-wide a fabric or a firmware version "
            "(no node; nodes says how many). devices: how many it touches; health, reasons and remediation: its "
            "worst device's. One alert each (OtelDraFinding, OtelDraFleetFinding); `otel-dra status --by group` "
            "lists the same. Needs prometheus/rules.yaml (otel_dra:finding:devices, otel_dra:finding:nodes).",
            transformations=[
                {"id": "merge", "options": {}},
                *table_fields(
                    {
                        "dra_device_health_scope": "scope",
                        "dra_device_health_group": "group",
                        "k8s_node_name": "node",
                        "Value #B": "nodes",
                        "Value #A": "devices",
                        "dra_device_health_state": "health",
                        "dra_device_health_reasons": "reasons",
                        "dra_device_health_remediation": "remediation",
                    }
                ),
            ],
        ),
        24,
        8,
    )

    lay.row("Top offenders")
    lay.add(
        bargauge(
            "Errors in the range, not corrected (top 10)",
            [
                target(
                    f"topk(10, sum by (k8s_node_name, hw_id, error_type) "
                    f'(increase(hw_errors_total{{{n}, error_type!="corrected"}}[$__range])))',
                    "{{k8s_node_name}} {{hw_id}} {{error_type}}",
                    instant=True,
                )
            ],
            "Uncorrected ECC, retired pages, link, driver, reset, power and out-of-memory errors in the time range.",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Corrected ECC errors in the range (top 10)",
            [
                target(
                    f"topk(10, sum by (k8s_node_name, hw_id) "
                    f'(increase(hw_errors_total{{{n}, error_type="corrected"}}[$__range])))',
                    "{{k8s_node_name}} {{hw_id}}",
                    instant=True,
                )
            ],
            "A storm of corrected errors predicts failure (the memory_ecc rule compares each device with the fleet).",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Share of the range Unhealthy (top 10)",
            [
                target(
                    f"topk(10, avg_over_time(otel_dra:device_unhealthy{{{n}}}[$__range]))",
                    "{{k8s_node_name}} {{hw_id}}",
                    instant=True,
                )
            ],
            "The devices that spent the most of the time range Unhealthy.",
            unit="percentunit",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "hw.state changes in the range (top 10)",
            [
                target(
                    f"topk(10, changes(otel_dra:device_state:code{{{n}}}[$__range]))",
                    "{{k8s_node_name}} {{hw_id}}",
                    instant=True,
                )
            ],
            "Verdict state changes (to and from Unknown not counted): more than 3 in an hour raises "
            "OtelDraDeviceFlapping.",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Throttled share of the range (top 10)",
            [
                target(
                    f"topk(10, sum by (k8s_node_name, hw_id) (rate(hw_throttle_time_seconds_total{{{n}}}[$__range])))",
                    "{{k8s_node_name}} {{hw_id}}",
                    instant=True,
                )
            ],
            "Share of the time range the device's clocks were held down, all reasons.",
            unit="percentunit",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Hottest devices now (top 10)",
            [
                target(
                    f"topk(10, max by (k8s_node_name, hw_parent) "
                    f'(hw_temperature_celsius{{{n}, hw_sensor_location="gpu"}}))',
                    "{{k8s_node_name}} {{hw_parent}}",
                    instant=True,
                )
            ],
            "GPU temperature sensors, hottest first.",
            unit="celsius",
            links=False,
        ),
        8,
        8,
    )

    lay.row("Per node")
    lay.add(
        table(
            "Devices per node by health",
            [
                target(
                    f"sum by (k8s_node_name, dra_device_health_state) (otel_dra:devices_by_health:count{{{n}}})",
                    instant=True,
                    table=True,
                )
            ],
            "One row per node, one column per health.",
            transformations=[
                {
                    "id": "groupingToMatrix",
                    "options": {
                        "rowField": "k8s_node_name",
                        "columnField": "dra_device_health_state",
                        "valueField": "Value",
                    },
                }
            ],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Devices not Healthy, per node",
            [
                target(
                    f"sum by (k8s_node_name) "
                    f'(otel_dra:devices_by_health:count{{{n}, dra_device_health_state!="Healthy"}})',
                    "{{k8s_node_name}}",
                )
            ],
            "Unhealthy and Unknown devices per node.",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Power draw per node",
            [target(f"sum by (k8s_node_name) (hw_power_watts{{{n}}})", "{{k8s_node_name}}")],
            "hw.power summed over each node's devices.",
            unit="watt",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Hottest GPU per node",
            [
                target(
                    f'max by (k8s_node_name) (hw_temperature_celsius{{{n}, hw_sensor_location="gpu"}})',
                    "{{k8s_node_name}}",
                )
            ],
            "The hottest GPU temperature sensor of each node.",
            unit="celsius",
        ),
        12,
        8,
    )

    lay.row("Agents")
    lay.add(
        table(
            "otel-dra targets",
            [target(f"up{{{AGENT_JOB}}}", instant=True, table=True)],
            "Every scraped otel-dra agent or fleet: 1 up, 0 down.",
            transformations=table_fields({"job": "job", "instance": "instance", "Value": "up"}),
            value_mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "down", "color": "red", "index": 0},
                        "1": {"text": "up", "color": "green", "index": 1},
                    },
                }
            ],
        ),
        6,
        8,
    )
    lay.add(
        table(
            "Agents by node and version",
            [target(f"target_info{{{AGENT_JOB}}}", instant=True, table=True)],
            "The agents' OpenTelemetry resource (target_info).",
            transformations=table_fields(
                {
                    "k8s_node_name": "node",
                    "instance": "instance",
                    "service_name": "service",
                    "service_version": "version",
                }
            ),
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Scrape duration",
            [target(f"scrape_duration_seconds{{{AGENT_JOB}}}", "{{instance}}")],
            "How long Prometheus takes to scrape each agent.",
            unit="s",
            minimum=0,
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Agent CPU and memory",
            [
                target(f"rate(process_cpu_seconds_total{{{AGENT_JOB}}}[$__rate_interval])", "{{instance}} CPU"),
                target(f"process_resident_memory_bytes{{{AGENT_JOB}}}", "{{instance}} RSS", ref="B"),
            ],
            "The agents' own CPU (cores) and resident memory.",
            overrides=[
                {"matcher": {"id": "byFrameRefID", "options": "B"}, "properties": [{"id": "unit", "value": "bytes"}]}
            ],
        ),
        6,
        8,
    )

    lay.row("Node $node", repeat="node", collapsed=True)
    lay.add(
        state_timeline(
            "hw.state of the devices on $node",
            [target('otel_dra:device_state:code{k8s_node_name=~"$node"}', "{{hw_id}}")],
            "Each device's verdict state over time (no value while Unknown).",
            value_mappings=mappings(STATE_CODES),
            links=[device_series_link()],
        ),
        12,
        8,
    )
    lay.add(
        state_timeline(
            "Health of the devices on $node",
            [target('otel_dra:device_health:code{k8s_node_name=~"$node"}', "{{hw_id}}")],
            "Each device's health as the kubelet knows it.",
            value_mappings=mappings(HEALTH_CODES),
            links=[device_series_link()],
        ),
        12,
        8,
    )

    return dashboard(
        FLEET_UID,
        "otel-dra fleet",
        "Accelerator health across the fleet: devices by health, hw.state, reason and remediation over time, "
        "the devices that need attention, top offenders, per node. Needs prometheus/rules.yaml loaded.",
        lay,
        [
            datasource_variable(),
            query_variable("node", "Node", "label_values(hw_status, k8s_node_name)", multi=True),
        ],
        "now-6h",
    )


def device() -> Json:
    d = 'k8s_node_name="$node", hw_id="$device"'
    s = 'k8s_node_name="$node", hw_parent="$device"'  # the device's sensors
    lay = Layout()

    lay.row("Verdict")
    lay.add(
        stat(
            "Health",
            [target(f"otel_dra:device_health:code{{{d}}}")],
            "dra.device.health.state: Healthy, Unhealthy or Unknown (what the kubelet knows).",
            value_mappings=mappings(HEALTH_CODES),
            steps=thresholds((None, "#8e8e8e")),
        ),
        4,
        5,
    )
    lay.add(
        stat(
            "hw.state",
            [target(f"otel_dra:device_state:code{{{d}}}")],
            "The verdict's hw.state (none while the verdict is Unknown).",
            value_mappings=mappings(STATE_CODES),
            steps=thresholds((None, "#8e8e8e")),
            no_value="none (Unknown)",
        ),
        4,
        5,
    )
    lay.add(
        table(
            "Verdict and device",
            [target(f"dra_device_health{{{d}}}", instant=True, table=True)],
            "The current verdict's reasons, remediation and scope (with its group when the verdict is about the "
            "device's node, workload, link or firmware), and the device's identity.",
            transformations=table_fields(
                {
                    "dra_device_health_state": "health",
                    "dra_device_health_reasons": "reasons",
                    "dra_device_health_remediation": "remediation",
                    "dra_device_health_scope": "scope",
                    "dra_device_health_group": "group",
                    "dra_pool_name": "DRA pool",
                    "dra_device_name": "DRA device",
                    "hw_model": "model",
                    "hw_serial_number": "serial",
                    "hw_firmware_version": "firmware",
                    "hw_driver_version": "driver",
                }
            ),
        ),
        16,
        5,
    )
    lay.add(
        state_timeline(
            "Verdict over time",
            [
                target(f"otel_dra:device_health:code{{{d}}}", "health"),
                target(f"otel_dra:device_state:code{{{d}}}", "hw.state", ref="B"),
            ],
            "Health and hw.state of the verdict over time (from hw_status and dra_device_health, as the "
            "recording rules code them).",
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "A"},
                    "properties": [{"id": "mappings", "value": mappings(HEALTH_CODES)}],
                },
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [{"id": "mappings", "value": mappings(STATE_CODES)}],
                },
            ],
        ),
        24,
        5,
    )

    lay.row("Thermal and power")
    lay.add(
        timeseries(
            "Temperature against its limits",
            [
                target(f"hw_temperature_celsius{{{s}}}", "{{hw_sensor_location}}"),
                target(f"hw_temperature_limit_celsius{{{s}}}", "{{hw_sensor_location}} {{hw_limit_type}}", ref="B"),
            ],
            "Each sensor against its own limits (dashed): high.degraded, throttled, high.critical.",
            unit="celsius",
            overrides=[limit_lines("B")],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Power against its cap",
            [
                target(f"hw_power_watts{{{d}}}", "power"),
                target(f"hw_power_limit_watts{{{d}}}", "{{hw_limit_type}} cap", ref="B"),
            ],
            "hw.power against hw.power.limit (dashed). Pinned at the cap means power throttling.",
            unit="watt",
            minimum=0,
            overrides=[limit_lines("B")],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Throttled share of time, by reason",
            [
                target(
                    f"sum by (hw_throttle_reason) (rate(hw_throttle_time_seconds_total{{{d}}}[$__rate_interval]))",
                    "{{hw_throttle_reason}}",
                )
            ],
            "Seconds throttled per second (hw.throttle.time), by hw.throttle.reason.",
            unit="percentunit",
            stack=True,
            minimum=0,
            maximum=1,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Fan speed against its limit",
            [
                target(f"hw_fan_speed_rpm{{{s}}}", "{{hw_id}}"),
                target(f"hw_fan_speed_limit_rpm{{{s}}}", "{{hw_id}} {{hw_limit_type}}", ref="B"),
            ],
            "A fan near zero while the device is warm is the cooling reason.",
            unit="rotrpm",
            minimum=0,
            overrides=[limit_lines("B")],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Voltage against its limits",
            [
                target(f"hw_voltage_volts{{{s}}}", "{{hw_id}}"),
                target(f"hw_voltage_limit_volts{{{s}}}", "{{hw_id}} {{hw_limit_type}}", ref="B"),
            ],
            "Voltage outside its critical limits is evidence of power_delivery.",
            unit="volt",
            overrides=[limit_lines("B")],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Utilization",
            [
                target(f"hw_gpu_utilization{{{d}}}", "GPU"),
                target(f"hw_gpu_memory_utilization{{{d}}}", "memory", ref="B"),
            ],
            "hw.gpu.utilization and hw.gpu.memory.utilization.",
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        12,
        8,
    )

    lay.row("Errors")
    lay.add(
        timeseries(
            "Error rate by type",
            [
                target(
                    f"60 * sum by (error_type) (rate(hw_errors_total{{{d}}}[$__rate_interval]))",
                    "{{error_type}}",
                )
            ],
            "hw.errors per minute by error.type.",
            unit="cpm",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Link errors by link",
            [
                target(
                    f'60 * sum by (hw_link_type) (rate(hw_errors_total{{{d}, error_type="link"}}[$__rate_interval]))',
                    "{{hw_link_type}}",
                )
            ],
            "PCIe replays and NVLink errors per minute (the link reason).",
            unit="cpm",
            minimum=0,
        ),
        12,
        8,
    )
    lay.add(
        bargauge(
            "Errors in the range by type",
            [
                target(
                    f"sum by (error_type) (increase(hw_errors_total{{{d}}}[$__range]))", "{{error_type}}", instant=True
                )
            ],
            "How many errors of each type in the time range.",
            links=False,
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Error counters",
            [target(f"sum by (error_type) (hw_errors_total{{{d}}})", "{{error_type}}", instant=True)],
            "Cumulative counts as the device reports them (retired pages add up over the device's life).",
            links=False,
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "Driver fault codes in the range",
            [
                target(
                    f'sum by (hw_error_code) (increase(hw_errors_total{{{d}, error_type="driver"}}[$__range]))',
                    "code {{hw_error_code}}",
                    instant=True,
                )
            ],
            "Driver and firmware fault events by vendor code (NVIDIA XID) in the time range; none is good news.",
            links=False,
        ),
        8,
        8,
    )

    lay.row("Memory and I/O")
    lay.add(
        timeseries(
            "GPU memory used against its size",
            [
                target(f"hw_gpu_memory_usage_bytes{{{d}}}", "used"),
                target(f"hw_gpu_memory_limit_bytes{{{d}}}", "size", ref="B"),
            ],
            "hw.gpu.memory.usage against hw.gpu.memory.limit (dashed).",
            unit="bytes",
            minimum=0,
            overrides=[limit_lines("B")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "PCIe link against its maximum",
            [
                target(f"hw_pcie_link_width{{{d}}}", "width"),
                target(f"hw_pcie_link_width_limit{{{d}}}", "max width", ref="B"),
                target(f"hw_pcie_link_generation{{{d}}}", "generation", ref="C"),
                target(f"hw_pcie_link_generation_limit{{{d}}}", "max generation", ref="D"),
            ],
            "A link trained below its maximum width or generation is evidence of the link reason.",
            minimum=0,
            overrides=[limit_lines("B"), limit_lines("D")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "GPU I/O",
            [
                target(
                    f"sum by (network_io_direction) (rate(hw_gpu_io_bytes_total{{{d}}}[$__rate_interval]))",
                    "{{network_io_direction}}",
                )
            ],
            "hw.gpu.io bytes per second by direction.",
            unit="Bps",
            minimum=0,
        ),
        8,
        8,
    )

    return dashboard(
        DEVICE_UID,
        "otel-dra device",
        "One accelerator: its verdict over time, temperature against its limits, power against its cap, "
        "throttling, errors by type, memory and link.",
        lay,
        [
            datasource_variable(),
            query_variable("node", "Node", "label_values(hw_status, k8s_node_name)", multi=False),
            query_variable("device", "Device", 'label_values(hw_status{k8s_node_name="$node"}, hw_id)', multi=False),
        ],
        "now-3h",
    )


DASHBOARDS = {"otel-dra-fleet.json": fleet, "otel-dra-device.json": device}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    OUT.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        path = OUT / name
        text = render(build)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python grafana/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
