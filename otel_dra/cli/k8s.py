"""``otel-dra k8s``: verdicts as DeviceTaintRules and ResourceSlice attributes.

Imports nothing heavy at import time (the ``kubernetes`` client is optional and loaded only
when a command runs), so registering the group costs ``otel-dra`` nothing. Every user error
is a :class:`click.ClickException`: one line, exit code 2 through ``otel_dra.cli.main``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from otel_dra.cli.client import read_devices
from otel_dra.cli.common import load_policy
from otel_dra.cli.options import Seconds, driver_name, policy_option
from otel_dra.sinks.k8s.versions import API_VERSIONS, DEFAULT_API_VERSION

API_VERSION_CHOICES = tuple(API_VERSIONS)


@click.group()
def k8s() -> None:
    """Kubernetes DRA output: device taints (DeviceTaintRule) and ResourceSlice attributes.

    Facts first: every taint is informational (effect None) unless the policy's
    `kubernetes.taints.effect` chooses NoSchedule or NoExecute.
    """


def _read_agent(url: str, timeout: float) -> list[Any]:
    from otel_dra.sinks.k8s.render import read_devices_json

    endpoint, doc = read_devices(url, timeout)
    return read_devices_json(doc, endpoint)


def _read_file(file: str) -> list[Any]:
    from otel_dra.sinks.k8s.render import read_verdict_lines

    if file == "-":
        return read_verdict_lines(sys.stdin, "<stdin>")
    try:
        with open(file, encoding="utf-8") as f:
            return read_verdict_lines(f, file)
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise click.ClickException(f"{file}: not a text file of verdict lines") from None


def _connect_and_discover(api_version: str, timeout: float) -> tuple[Any, Any]:
    """For --apply: the cluster's client and, unless --api-version was given, what it serves."""
    from otel_dra.sinks.k8s.apply import K8sApplyError, connect, discover

    explicit = click.get_current_context().get_parameter_source("api_version") != ParameterSource.DEFAULT
    try:
        api_client = connect()
        return api_client, (None if explicit else discover(api_client, timeout))
    except K8sApplyError as exc:
        raise click.ClickException(f"--apply: {exc}") from None


def _api_version_for(api_version: str, kubernetes: tuple[int, int], do_apply: bool) -> str:
    """``--kubernetes-version`` without ``--api-version`` (nor --apply, which asks the cluster): the newest
    API version that server serves, said on stderr, rather than the default (v1, 1.37+) refused for it."""
    from otel_dra.sinks.k8s.versions import newest_served

    explicit = click.get_current_context().get_parameter_source("api_version") != ParameterSource.DEFAULT
    newest = newest_served(kubernetes)
    if explicit or do_apply or newest is None or newest == api_version:
        return api_version
    server = ".".join(map(str, kubernetes))
    gate = " (alpha: the DRADeviceTaints feature gate and the alpha API must be on)" if newest == "v1alpha3" else ""
    # Effect None before 1.35 is left to the renderer: one error naming the policy setting, only when a rule has it.
    click.echo(
        f"note: Kubernetes {server} serves DeviceTaintRules up to {API_VERSIONS[newest]}: rendering that{gate}",
        err=True,
    )
    return newest


@k8s.command("render")
@click.argument("file", required=False)
@click.option(
    "--from",
    "from_url",
    metavar="URL",
    default=None,
    help="Read the current verdicts from a running agent or fleet (URL/v1/devices), e.g. http://localhost:9464.",
)
@policy_option("Policy YAML merged over the default; its `kubernetes` section shapes the output.")
@click.option(
    "--api-version",
    type=click.Choice(API_VERSION_CHOICES),
    default=DEFAULT_API_VERSION,
    show_default=True,
    help="DeviceTaintRule API version: v1 (Kubernetes 1.37+), v1beta2 (1.36+, feature gate DRADeviceTaintRules and "
    "the API enabled) or v1alpha3 (1.33+, alpha, feature gate DRADeviceTaints; the only one before 1.36). "
    "With --apply and no --api-version: the newest one the cluster serves, asked of its API discovery; with "
    "--kubernetes-version and no --api-version: the newest that version serves.",
)
@click.option(
    "--kubernetes-version",
    metavar="1.N",
    default=None,
    help="The server the rules are for, e.g. 1.34: it must serve --api-version, and effect None needs 1.35+ "
    "(1.33 and 1.34 take only NoSchedule and NoExecute). Default: the API version's first server, but at least "
    "1.35 (v1alpha3: 1.35; say 1.33 or 1.34 to be held to them); with --apply and no --api-version, the cluster's.",
)
@click.option(
    "--driver",
    default=None,
    callback=driver_name,
    help="DRA driver name for devices whose verdicts carry no dra.driver.name, e.g. gpu.nvidia.com.",
)
@click.option(
    "-o",
    "--output",
    default=None,
    help="'-': YAML documents on stdout (the default, except with --apply): only Kubernetes objects, what "
    "'kubectl apply -f -' takes, unless --attributes. A directory: devicetaintrules.yaml (and, with "
    "--attributes, resourceslice-attributes.yaml) in it, written atomically and only when changed.",
)
@click.option(
    "--attributes",
    is_flag=True,
    help="EXPERIMENTAL: also render ResourceSlice health attributes (<domain>/health, <domain>/state) for "
    "every device: not Kubernetes objects, but what a DRA driver would publish in its slices. KEP-5283, which "
    "would define them, is provisional: the names may change.",
)
@click.option(
    "--only",
    type=click.Choice(("taints", "attributes")),
    default=None,
    help="Render only the DeviceTaintRules (the default) or only the (experimental) attributes.",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Also create, update and delete this agent's DeviceTaintRules in the cluster (kubeconfig or in-cluster), "
    "idempotently; rules for devices healthy again are deleted. Attributes are never applied: slices belong "
    "to the DRA driver.",
)
@click.option("--timeout", type=Seconds(), default=10.0, show_default=True, help="Seconds per agent or API request.")
def render_command(
    file: str | None,
    from_url: str | None,
    policy_file: str | None,
    api_version: str,
    kubernetes_version: str | None,
    driver: str | None,
    output: str | None,
    attributes: bool,
    only: str | None,
    do_apply: bool,
    timeout: float,
) -> None:
    """Render the current verdicts as Kubernetes objects.

    FILE is verdict JSON lines ('otel-dra replay' output; the last line per device counts;
    '-' reads stdin); or give --from URL for a running agent. One DeviceTaintRule per
    (device, reason) for Unhealthy and Unknown devices, labelled
    app.kubernetes.io/managed-by=otel-dra; Healthy devices get none. With --attributes
    (experimental), ResourceSlice attributes (<domain>/health, <domain>/state) for every device.
    """
    from otel_dra.classifier.verdict import VerdictInputError
    from otel_dra.policy import PolicyError
    from otel_dra.sinks.k8s.apply import K8sApplyError, apply
    from otel_dra.sinks.k8s.render import render, write_rendering
    from otel_dra.sinks.k8s.validation import K8sValidationError
    from otel_dra.sinks.policy_sections import load_policy as load

    if (file is None) == (from_url is None):
        raise click.UsageError("give a verdict FILE or --from URL (one of them)")
    if only is None and not attributes:
        only = "taints"  # only Kubernetes objects unless the experimental attributes are asked for
    if kubernetes_version is not None:
        from otel_dra.sinks.k8s.render import kubernetes_version_of

        try:
            server = kubernetes_version_of(kubernetes_version)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--kubernetes-version") from None
        api_version = _api_version_for(api_version, server, do_apply)
    try:
        policy = load(policy_file)
        verdicts = _read_agent(from_url, timeout) if from_url else _read_file(str(file))
    except (PolicyError, VerdictInputError, K8sValidationError) as exc:
        raise click.ClickException(str(exc)) from None
    api_client = None
    k8s_target: str | tuple[int, int] | None = kubernetes_version
    if do_apply:
        api_client, found = _connect_and_discover(api_version, timeout)
        if found is not None:
            click.echo(str(found), err=True)
            api_version = found.api_version
            if kubernetes_version is None and found.kubernetes is not None:
                from otel_dra.sinks.k8s.render import SERVED_FROM

                k8s_target = max(found.kubernetes, SERVED_FROM[found.api_version])
    try:
        rendering = render(verdicts, policy, api_version, driver=driver, kubernetes_version=k8s_target)
    except (PolicyError, VerdictInputError, K8sValidationError) as exc:
        raise click.ClickException(str(exc)) from None
    for note in rendering.skipped + rendering.dropped:
        click.echo(f"warning: {note}", err=True)

    target = output if output is not None else (None if do_apply else "-")
    if target == "-":
        click.echo(rendering.to_yaml(only), nl=False)
    elif target is not None:
        try:
            changed = write_rendering(rendering, Path(target), only)
        except OSError as exc:
            raise click.ClickException(f"cannot write to {target}: {exc.strerror or exc}") from None
        click.echo(
            f"{len(rendering.rules)} DeviceTaintRules"
            + (f", {len(rendering.attributes)} devices' attributes" if only != "taints" else "")
            + f" in {target} ({len(changed)} files changed)",
            err=True,
        )
    if do_apply:
        try:
            result = apply(rendering, api_client, timeout_s=timeout)
        except K8sApplyError as exc:
            raise click.ClickException(f"--apply: {exc}") from None
        for action in result.actions:
            click.echo(f"{action.verb}d {action.name}", err=True)
        counts = {verb: sum(a.verb == verb for a in result.actions) for verb in ("create", "update", "delete")}
        click.echo(
            f"applied: {counts['create']} created, {counts['update']} updated, {counts['delete']} deleted, "
            f"{result.unchanged} unchanged",
            err=True,
        )


# -- the brake on mass quarantine ------------------------------------------------------------------------------
@k8s.group("brake")
def brake() -> None:
    """The fleet's brake on mass quarantine (the policy's kubernetes.budget): see it, release it.

    Its state rides on the fleet's leader Lease (annotation <domain>/quarantine-brake); a release is
    a new value under <domain>/quarantine-brake-release there, which the leader honours at its next
    renewal (within the retry period, 2 s by default). Needs get and update on that Lease.
    """


def _lease_options(fn: Any) -> Any:
    from otel_dra.sinks.k8s.lease import LeaseConfig

    fn = click.option("--timeout", type=Seconds(), default=10.0, show_default=True, help="Seconds per API request.")(fn)
    fn = policy_option("Policy YAML merged over the default: its kubernetes.domain names the annotations.")(fn)
    fn = click.option(
        "--namespace",
        "-n",
        default="",
        help="The Lease's namespace (the fleet's --leader-elect-resource-namespace). Default: $POD_NAMESPACE, "
        "else otel-dra.",
    )(fn)
    return click.option(
        "--lease",
        "lease_name",
        default=LeaseConfig.name,
        show_default=True,
        help="The fleet's Lease (its --leader-elect-resource-name).",
    )(fn)


def _lease_client(lease_name: str, namespace: str) -> tuple[Any, str]:
    from otel_dra.sinks.k8s.apply import K8sApplyError, connect
    from otel_dra.sinks.k8s.lease import default_namespace

    try:
        return connect(flag="k8s brake"), namespace or default_namespace()
    except K8sApplyError as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def _lease_errors(api_client: Any, lease_name: str, namespace: str) -> Iterator[None]:
    """Each way a call on the Lease fails, as one line that says what to do."""
    from kubernetes import client
    from urllib3.exceptions import HTTPError

    try:
        yield
    except client.ApiException as exc:
        raise _lease_problem(exc, lease_name, namespace) from None
    except (HTTPError, OSError) as exc:
        where = api_client.configuration.host
        raise click.ClickException(f"cannot reach the Kubernetes API at {where}: {str(exc).splitlines()[0]}") from None
    except ValueError as exc:
        raise click.ClickException(
            f"Lease {namespace}/{lease_name}: the brake's annotation is unreadable ({exc}): release it to reset it"
        ) from None


def _lease_problem(exc: Any, lease_name: str, namespace: str) -> click.ClickException:
    """One line for an API error on the Lease: what failed and what to do."""
    if exc.status == 404:
        return click.ClickException(
            f"no Lease {namespace}/{lease_name}: is the fleet running with --k8s-apply and leader election? "
            "(Without leader election the brake lives in the process: restarting it releases the brake.) "
            "Give the Lease with --lease and --namespace"
        )
    if exc.status in (401, 403):
        return click.ClickException(
            f"Lease {namespace}/{lease_name}: {'unauthorized' if exc.status == 401 else 'forbidden'}: "
            "releasing the brake needs get and update on leases.coordination.k8s.io in that namespace"
        )
    return click.ClickException(f"Lease {namespace}/{lease_name}: HTTP {exc.status} {exc.reason}")


def _describe(state: Any, pending: str, holder: str) -> list[str]:
    import datetime as dt

    if state is None:
        lines = ["no brake state on the Lease yet (no leader has written one: it is released)"]
    elif state.tripped:
        at = dt.datetime.fromtimestamp(state.tripped_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines = [f"tripped at {at}: {state.why}"]
    else:
        lines = ["released: new acting taints are written, within the budget"]
    if state is not None:
        lines.append(f"{len(state.added)} devices gained an acting taint in the current window")
    if pending:
        lines.append(f"a release ({pending}) waits for the leader's next renewal")
    lines.append(f"leader: {holder or '(none)'}")
    return lines


@brake.command("status")
@_lease_options
def brake_status(lease_name: str, namespace: str, policy_file: str | None, timeout: float) -> None:
    """Say whether the brake holds, why, and since when."""
    from otel_dra.sinks.k8s.brake import annotation_key, read_lease_brake

    policy = load_policy(policy_file)
    api_client, namespace = _lease_client(lease_name, namespace)
    from kubernetes import client

    with _lease_errors(api_client, lease_name, namespace):
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
            lease_name, namespace, _request_timeout=timeout
        )
        found = read_lease_brake(lease, annotation_key(policy))
    for line in _describe(found.state, found.pending_release, found.holder):
        click.echo(line)


@brake.command("release")
@_lease_options
def brake_release(lease_name: str, namespace: str, policy_file: str | None, timeout: float) -> None:
    """Release the brake: new acting taints are written again, with a fresh budget.

    Release it once you know the mass event is real (or fixed what caused a false one). If more
    devices than the budget are still waiting, the brake trips again at the next batch: to let a
    real mass event through at once, raise kubernetes.budget in the policy first.
    """
    import datetime as dt

    from otel_dra.sinks.k8s.brake import annotation_key, release_key, request_release

    policy = load_policy(policy_file)
    key = annotation_key(policy)
    api_client, namespace = _lease_client(lease_name, namespace)
    token = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with _lease_errors(api_client, lease_name, namespace):
        before = request_release(api_client, lease_name, namespace, key, token, timeout_s=timeout)
    was = "tripped" if before.state is not None and before.state.tripped else "not tripped"
    click.echo(
        f"asked the leader ({before.holder or 'none yet'}) to release the brake ({was}): "
        f"{release_key(key)}={token} on Lease {namespace}/{lease_name}"
    )


@k8s.command("report")
@click.option(
    "--since",
    type=Seconds(),
    default=86400.0,
    show_default="24h",
    help="The period the changes are counted over (e.g. 1h, 7d); the rules' state is now's.",
)
@click.option(
    "--api-version",
    type=click.Choice(("auto", *API_VERSION_CHOICES)),
    default="auto",
    show_default=True,
    help="The DeviceTaintRule API version to read; auto: the newest the cluster serves.",
)
@click.option(
    "--events-namespace",
    default="default",
    show_default=True,
    help="Where the writer's Events about DeviceTaintRules are (client-go puts a cluster-scoped object's in default).",
)
@click.option("--output", "-o", type=click.Choice(("table", "json")), default="table", show_default=True)
@policy_option("Policy YAML merged over the default: its kubernetes.domain names the labels and Events.")
@click.option("--timeout", type=Seconds(), default=10.0, show_default=True, help="Seconds per API request.")
def report_command(
    since: float, api_version: str, events_namespace: str, output: str, policy_file: str | None, timeout: float
) -> None:
    """What the fleet's DeviceTaintRules did, or with effect None would have done, per failure reason.

    Reads the managed rules now, with what the cluster's device-taint controller (Kubernetes 1.35+) says of
    each: how many pods NoExecute would evict from the devices of a None rule, how many a NoExecute rule
    evicted; and the writer's Events over --since: devices tainted, changed and cleared. A reason whose rules
    would evict nothing it should not is one to move from None to NoSchedule or NoExecute
    (kubernetes.taints.effect.by_reason in the policy). Needs list on devicetaintrules and on events.
    """
    import time

    from otel_dra.sinks.k8s.apply import K8sApplyError, connect, discover, list_managed
    from otel_dra.sinks.k8s.report import summarise

    policy = load_policy(policy_file)
    domain = str(policy.sections["kubernetes"]["domain"])
    try:
        api_client = connect(flag="k8s report")
        version = discover(api_client, timeout).api_version if api_version == "auto" else api_version
        if not version.startswith("resource.k8s.io/"):
            version = f"resource.k8s.io/{version}"
        rules = list_managed(api_client, version, timeout)
        events = _list_events(api_client, events_namespace, timeout)
    except K8sApplyError as exc:
        raise click.ClickException(str(exc)) from None
    now = time.time()
    reports = summarise(rules, events, domain, now - since)
    if output == "json":
        doc = {"since_seconds": since, "reasons": [r.to_json() for r in reports]}
        click.echo(json.dumps(doc, indent=2))
        return
    _report_table(reports, since, len(events))


def _list_events(api_client: Any, namespace: str, timeout: float) -> list[dict[str, Any]]:
    """The Events about DeviceTaintRules in ``namespace`` (events.k8s.io/v1), as plain dicts."""
    from kubernetes import client
    from urllib3.exceptions import HTTPError

    from otel_dra.sinks.k8s.apply import K8sApplyError

    api = client.EventsV1Api(api_client)
    try:
        page = api.list_namespaced_event(
            namespace, field_selector="regarding.kind=DeviceTaintRule", _request_timeout=timeout
        )
    except client.ApiException as exc:
        if exc.status in (401, 403):
            raise K8sApplyError(
                f"listing events in {namespace}: forbidden: needs list on events.events.k8s.io"
            ) from None
        raise K8sApplyError(f"listing events in {namespace}: HTTP {exc.status} {exc.reason}") from None
    except (HTTPError, OSError) as exc:
        where = api_client.configuration.host
        raise K8sApplyError(f"cannot reach the Kubernetes API at {where}: {str(exc).splitlines()[0]}") from None
    items = api_client.sanitize_for_serialization(page).get("items") or []
    return [e for e in items if isinstance(e, dict)]


def _report_table(reports: list[Any], since: float, events: int) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from otel_dra.words import human_duration

    console = Console()
    piped = not console.is_terminal
    if piped:  # plain columns a script can cut, as kubectl prints them, never cut short
        console = Console(width=240)
    period = human_duration(since)
    table = Table(
        title=f"DeviceTaintRules by reason: now, and changes over the last {period}",
        title_justify="left",
        box=None if piped else box.SIMPLE_HEAD,
    )
    for col in ("reason", "rules now", "devices", "would evict", "evicted", "tainted", "changed", "cleared"):
        table.add_column(col, justify="left" if col in ("reason", "rules now") else "right", no_wrap=True)
    for r in reports:
        rules = ", ".join(f"{n} {effect}" for effect, n in sorted(r.rules.items())) or "-"
        reported = f"{r.would_evict} pods" + (f" ({r.reported}/{len(r.devices)} said)" if r.devices else "")
        table.add_row(
            r.reason,
            rules,
            str(len(r.devices)),
            reported if r.reported else "-",
            str(r.evicted) if r.evicted else "-",
            str(r.changes["tainted"]),
            str(r.changes["changed"]),
            str(r.changes["removed"]),
        )
    console.print(table)
    if not reports:
        console.print("no managed DeviceTaintRules now, and no Events of the writer in that period")
    console.print(
        f"{events} Events read. 'would evict': pods NoExecute would evict from the devices of effect-None rules, as "
        "the cluster's device-taint controller counted them when each rule was last written (Kubernetes 1.35+; "
        "'said': devices it reported on). Events last as long as the API server keeps them (--event-ttl, 1h by "
        "default)."
    )
