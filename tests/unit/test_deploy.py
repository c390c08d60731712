"""deploy/: Kubernetes manifests (schema + probe timing), compose example, alert rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"

if not DEPLOY.is_dir():
    pytest.skip("deploy/ is not next to the tests", allow_module_level=True)

WORKER_NAMES = {"mineru-api", "mineru-api-pool"}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) for doc in load_all(path)]


def by_kind_name(kind: str, name: str) -> dict[str, Any]:
    for _, doc in manifests():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind}/{name} in deploy/k8s")


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def worker_workloads() -> list[dict[str, Any]]:
    return [
        doc
        for _, doc in manifests()
        if doc["kind"] in {"Deployment", "StatefulSet"} and doc["metadata"]["name"] in WORKER_NAMES
    ]


def window(probe: dict[str, Any]) -> int:
    """Seconds of consecutive failures before the probe acts (defaults as Kubernetes')."""
    return int(probe.get("periodSeconds", 10)) * int(probe.get("failureThreshold", 3))


# --- schema -------------------------------------------------------------------


def test_there_are_manifests() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in manifests()}
    assert ("Deployment", "mineru-api") in kinds
    assert ("StatefulSet", "mineru-api-pool") in kinds
    assert ("Deployment", "mineru-router") in kinds
    assert ("ConfigMap", "mineru-health-env") in kinds


@pytest.mark.parametrize(
    "path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name if isinstance(p, Path) else str(p)
)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in load_all(path):
        # Bundled schemas, strict: unknown fields (typos) are errors. Offline.
        kv.validate(doc, kv.latest_version(), strict=True)


# --- probes -------------------------------------------------------------------


@pytest.mark.parametrize("workload", worker_workloads(), ids=lambda d: d["metadata"]["name"])
def test_worker_probes_follow_the_documented_semantics(workload: dict[str, Any]) -> None:
    (container,) = containers(workload)
    startup = container["startupProbe"]
    readiness = container["readinessProbe"]
    liveness = container["livenessProbe"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    env = {item["name"]: item.get("value") for item in container["env"]}
    # Every probe asks the native endpoint, never MinerU's (busy) event loop.
    assert ports["health"] == int(env["MINERU_HEALTH_PORT"])
    assert env["MINERU_HEALTH_BIND"] == "0.0.0.0"  # the kubelet probes the pod IP
    assert startup["httpGet"]["path"] == "/readyz"
    assert readiness["httpGet"]["path"] == "/readyz"
    assert liveness["httpGet"]["path"] == "/livez"
    for probe in (startup, readiness, liveness):
        assert probe["httpGet"]["port"] == "health"
        # A probe that may outlast its period overlaps the next one.
        assert probe["timeoutSeconds"] < probe["periodSeconds"]
    # Out of the Service on the first 503, before any restart.
    assert readiness["periodSeconds"] == 5 and readiness["failureThreshold"] == 1
    assert readiness.get("successThreshold", 1) == 1
    assert window(readiness) < window(liveness)
    # Restarted within ~30 s of engine death or a hang (docs/operations.md).
    assert liveness["periodSeconds"] == 10 and liveness["failureThreshold"] == 3
    assert window(liveness) <= 30
    # Model loading gets minutes, far more than the liveness window.
    assert window(startup) >= 300
    assert window(startup) > 10 * window(liveness)


def test_both_worker_layouts_share_one_pod_spec() -> None:
    api, pool = (containers(doc)[0] for doc in worker_workloads())
    for key in ("image", "command", "args", "ports", "env", "startupProbe", "readinessProbe",
                "livenessProbe"):
        assert api[key] == pool[key], key


def test_router_is_not_restarted_for_unhealthy_workers() -> None:
    (router,) = containers(by_kind_name("Deployment", "mineru-router"))
    # The router's /health is 503 whenever no worker is healthy; restarting or
    # unlisting the router for that would not help.
    for key in ("livenessProbe", "readinessProbe"):
        probe = router[key]
        assert probe["httpGet"]["path"] != "/health"
        assert probe["timeoutSeconds"] < probe["periodSeconds"]


def test_router_lists_one_upstream_per_pool_pod() -> None:
    pool = by_kind_name("StatefulSet", "mineru-api-pool")
    service = by_kind_name("Service", pool["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    port = service["spec"]["ports"][0]["port"]
    (router,) = containers(by_kind_name("Deployment", "mineru-router"))
    args = router["args"]
    upstreams = [args[i + 1] for i, arg in enumerate(args) if arg == "--upstream-url"]
    expected = [
        f"http://{pool['metadata']['name']}-{i}.{service['metadata']['name']}:{port}"
        for i in range(pool["spec"]["replicas"])
    ]
    assert upstreams == expected
    assert args[args.index("--local-gpus") + 1] == "none"


# --- configuration ------------------------------------------------------------

KNOWN_ROUTER_VARIABLES = {
    f"MINERU_ROUTER_HEALTH_{suffix}"
    for suffix in (
        "INTERVAL_S",
        "TIMEOUT_S",
        "CONNECT_TIMEOUT_S",
        "FAILURE_THRESHOLD",
        "HEALTHY_THRESHOLD",
        "BACKOFF_BASE_S",
        "BACKOFF_MAX_S",
        "MAX_ATTEMPTS",
        "BOOT_TIMEOUT_S",
        "CONCURRENCY",
        "JITTER",
        "EXPECTED_STATUS",
        "MAX_BODY_BYTES",
        "PRESET",
        "AUDIT_PATH",
    )
}


def env_config() -> dict[str, str]:
    return dict(by_kind_name("ConfigMap", "mineru-health-env")["data"])


def test_config_map_names_only_known_router_variables() -> None:
    data = env_config()
    router_keys = {key for key in data if key.startswith("MINERU_ROUTER_HEALTH_")}
    assert router_keys <= KNOWN_ROUTER_VARIABLES, router_keys - KNOWN_ROUTER_VARIABLES
    assert float(data["MINERU_ROUTER_HEALTH_TIMEOUT_S"]) < float(
        data["MINERU_ROUTER_HEALTH_INTERVAL_S"]
    )
    assert all(isinstance(value, str) for value in data.values())


def test_config_map_is_accepted_by_the_native_config() -> None:
    monitor = pytest.importorskip(
        "mineru_health.settings", reason="native extension not built", exc_type=ImportError
    )
    data = {k: v for k, v in env_config().items() if k.startswith("MINERU_ROUTER_HEALTH_")}
    settings = monitor.HealthSettings.from_env(data)
    assert settings.interval_s == float(data["MINERU_ROUTER_HEALTH_INTERVAL_S"])


def test_rules_file_is_mounted_where_the_variable_points() -> None:
    rules_path = Path(env_config()["MINERU_HEALTH_RULES"])
    rules = by_kind_name("ConfigMap", "mineru-health-rules")["data"]
    assert rules_path.name in rules
    router = by_kind_name("Deployment", "mineru-router")
    for workload in [*worker_workloads(), router]:
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        (volume_name,) = [
            name
            for name, v in volumes.items()
            if v.get("configMap", {}).get("name") == "mineru-health-rules"
        ]
        assert Path(mounts[volume_name]) == rules_path.parent


def test_rules_lines_have_the_documented_shape() -> None:
    text = by_kind_name("ConfigMap", "mineru-health-rules")["data"]["rules.txt"]
    rules = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert rules
    for line in rules:
        rule_id, kind, category, pattern = line.split(None, 3)
        assert kind in {"fatal", "task_local"}
        assert re.compile(pattern)  # RE2 syntax is a subset of this for our examples
        assert rule_id and category


# --- compose ------------------------------------------------------------------


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_workers_exit_on_fatal_and_restart_on_exit() -> None:
    services = compose()["services"]
    workers = {name: svc for name, svc in services.items() if svc.get("entrypoint") == "mineru-api"}
    assert len(workers) >= 2
    for name, svc in workers.items():
        assert svc["image"], name
        assert svc["restart"] in {"unless-stopped", "always", "on-failure"}, name
        assert svc["restart"] == "unless-stopped"
        assert str(svc["environment"]["MINERU_HEALTH_EXIT_ON_FATAL"]) == "1"
        check = svc["healthcheck"]
        port = str(svc["environment"]["MINERU_HEALTH_PORT"])
        assert f"127.0.0.1:{port}/livez" in " ".join(check["test"])  # the native endpoint
        seconds = {k: int(str(check[k]).rstrip("s")) for k in ("interval", "timeout")}
        assert seconds["timeout"] < seconds["interval"]
        for volume in svc.get("volumes", []):
            host_path = volume.split(":", 1)[0]
            assert (DEPLOY / "compose" / host_path).exists(), host_path


def test_compose_rules_file_reaches_every_process_that_names_it() -> None:
    for name, svc in compose()["services"].items():
        rules = svc.get("environment", {}).get("MINERU_HEALTH_RULES")
        if rules is None:
            continue
        mounted = {v.split(":")[1] for v in svc.get("volumes", [])}
        assert rules in mounted, name


def test_compose_router_points_at_every_worker() -> None:
    services = compose()["services"]
    workers = sorted(n for n, s in services.items() if s.get("entrypoint") == "mineru-api")
    router = services["mineru-router"]
    assert router["entrypoint"] == "mineru-router"
    command = router["command"]
    upstreams = [command[i + 1] for i, arg in enumerate(command) if arg == "--upstream-url"]
    assert upstreams == [f"http://{name}:8000" for name in workers]
    assert command[command.index("--local-gpus") + 1] == "none"
    assert set(router["depends_on"]) == set(workers)


# --- alert rules ----------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_have_the_required_fields() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["expr"].strip()
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
    # The three reference alerts.
    assert {"MineruRestartRateHigh", "MineruWorkersFailed", "MineruWorkerFailedForAnHour"} <= set(
        names
    )


def test_alert_rules_use_only_documented_metrics() -> None:
    from mineru_health import metrics

    documented = {name for names in metrics.METRIC_NAMES.values() for name in names}
    for rule in alert_rules():
        for used in re.findall(r"\bmineru_[a-z_]+", rule["expr"]):
            base = re.sub(r"_(bucket|count|sum)$", "", used)
            assert base in documented, f"{rule['alert']} uses undocumented {used}"


def test_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (Debian package 'prometheus')")
    folder = DEPLOY / "prometheus"
    for args in (["check", "rules", "alerts.yaml"], ["test", "rules", "alerts_test.yaml"]):
        done = subprocess.run(
            [promtool, *args], check=False, cwd=folder, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
