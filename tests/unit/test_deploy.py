"""deploy/: Kubernetes manifests (schema + probe timing), compose examples, alert rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    return find([doc for _, doc in manifests()], kind, name)


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind}/{name} in deploy/k8s")


def several_routers() -> list[dict[str, Any]]:
    """What README's "Several routers" applies: the shared config, the worker pool, the
    routers, the plain PostgreSQL and the pool's HPA."""
    paths = [K8S / "00-config.yaml", K8S / "20-mineru-api-pool.yaml"]
    for folder in ("several-routers", "postgres", "autoscaling"):
        paths += sorted((K8S / folder).glob("*.yaml"))
    return [doc for path in paths for doc in load_all(path)]


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


#: Operators' kinds, whose schemas kubernetes-validate does not have: checked by
#: test_cloudnative_pg_cluster_makes_what_the_routers_read instead.
CUSTOM_API_VERSIONS = {"postgresql.cnpg.io/v1"}


@pytest.mark.parametrize(
    "path",
    sorted(K8S.rglob("*.yaml")),
    ids=lambda p: str(p.relative_to(K8S)) if isinstance(p, Path) else str(p),
)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in load_all(path):
        if doc["apiVersion"] in CUSTOM_API_VERSIONS:
            continue
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
    for key in (
        "image",
        "command",
        "args",
        "ports",
        "env",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
    ):
        assert api[key] == pool[key], key


@pytest.mark.parametrize("layout", ["one router", "several routers"])
def test_router_is_not_restarted_for_unhealthy_workers(layout: str) -> None:
    docs = [doc for _, doc in manifests()] if layout == "one router" else several_routers()
    (router,) = containers(find(docs, "Deployment", "mineru-router"))
    # The router's /health is 503 whenever no worker is healthy; restarting or
    # unlisting the router for that would not help.
    for key in ("livenessProbe", "readinessProbe"):
        probe = router[key]
        assert probe["httpGet"]["path"] != "/health"
        assert probe["timeoutSeconds"] < probe["periodSeconds"]


def test_router_finds_the_pool_pods_by_dns_on_its_headless_service() -> None:
    pool = by_kind_name("StatefulSet", "mineru-api-pool")
    service = by_kind_name("Service", pool["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # one A record per pod
    assert service["spec"]["publishNotReadyAddresses"] is True  # the router probes them
    port = service["spec"]["ports"][0]["port"]
    (router,) = containers(by_kind_name("Deployment", "mineru-router"))
    args = router["args"]
    assert "--upstream-url" not in args  # no list to keep in step with the replicas
    env = {e["name"]: e.get("value") for e in router.get("env", [])}
    assert env["MINERU_ROUTER_HEALTH_UPSTREAM_DNS"] == f"{service['metadata']['name']}:{port}"
    assert args[args.index("--local-gpus") + 1] == "none"


# --- several routers -------------------------------------------------------------

#: The database's Secret and its key: made by hand for the plain StatefulSet (README),
#: by CloudNativePG for a Cluster of that name (<cluster>-app, key `uri`).
STORE_SECRET = ("mineru-postgres-app", "uri")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def test_several_routers_are_three_replicas_one_disruption_at_a_time() -> None:
    docs = several_routers()
    router = find(docs, "Deployment", "mineru-router")
    labels = router["spec"]["template"]["metadata"]["labels"]
    assert router["spec"]["replicas"] == 3
    # A new router is ready before an old one goes (no state directory to hand over).
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = find(docs, "PodDisruptionBudget", "mineru-router")
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = find(docs, "Service", "mineru-router")
    assert service["spec"]["selector"].items() <= labels.items()
    # A task is answered by the router that accepted it: a client keeps to one.
    assert service["spec"]["sessionAffinity"] == "ClientIP"


def test_several_routers_share_the_store_and_find_the_pool_by_dns() -> None:
    docs = several_routers()
    router = find(docs, "Deployment", "mineru-router")
    (container,) = containers(router)
    env = env_of(container)
    secret = env["MINERU_ROUTER_HEALTH_STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert (secret["name"], secret["key"]) == STORE_SECRET
    # Each router owns its rows under its pod's name.
    owner = env["MINERU_ROUTER_HEALTH_ROUTER_ID"]["valueFrom"]["fieldRef"]
    assert owner["fieldPath"] == "metadata.name"
    pool = find(docs, "StatefulSet", "mineru-api-pool")
    service = find(docs, "Service", pool["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    port = service["spec"]["ports"][0]["port"]
    upstream = env["MINERU_ROUTER_HEALTH_UPSTREAM_DNS"]["value"]
    assert upstream == f"{service['metadata']['name']}:{port}"
    assert "--upstream-url" not in container["args"]
    assert container["args"][container["args"].index("--local-gpus") + 1] == "none"
    # The state directory (kept uploads) is the pod's own, mounted where the variable says.
    pod = router["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume_name = mounts[env["MINERU_HEALTH_STATE_DIR"]["value"]]
    (volume,) = [v for v in pod["volumes"] if v["name"] == volume_name]
    assert "emptyDir" in volume
    # The HPA example scales that pool, on a metric the workers export.
    from mineru_health import metrics

    hpa = find(docs, "HorizontalPodAutoscaler", "mineru-api-pool")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert hpa["spec"]["scaleTargetRef"]["name"] == pool["metadata"]["name"]
    for metric in hpa["spec"]["metrics"]:
        assert metric["pods"]["metric"]["name"] in metrics.METRIC_NAMES["worker"]
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]


def test_plain_postgres_serves_the_url_in_the_secret() -> None:
    docs = several_routers()
    postgres = find(docs, "StatefulSet", "mineru-postgres")
    (container,) = containers(postgres)
    env = env_of(container)
    for variable, key in (("POSTGRES_USER", "username"), ("POSTGRES_PASSWORD", "password")):
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (STORE_SECRET[0], key)
    (claim,) = postgres["spec"]["volumeClaimTemplates"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    # PGDATA below the mount point: a fresh volume's lost+found would stop initdb.
    assert Path(env["PGDATA"]["value"]).parent == Path(mount["mountPath"])
    assert find(docs, "Service", postgres["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    url = readme_store_url()
    served = find(docs, "Service", url.hostname or "")
    assert served["spec"]["selector"].items() <= postgres["spec"]["selector"]["matchLabels"].items()
    assert served["spec"]["ports"][0]["port"] == url.port
    assert url.path.lstrip("/") == env["POSTGRES_DB"]["value"]


def test_cloudnative_pg_cluster_makes_what_the_routers_read() -> None:
    (cluster,) = load_all(K8S / "cloudnative-pg" / "40-postgres-cluster.yaml")
    assert cluster["apiVersion"] in CUSTOM_API_VERSIONS and cluster["kind"] == "Cluster"
    name = cluster["metadata"]["name"]
    # CloudNativePG names the application's Secret <cluster>-app (its `uri` key) and the
    # primary's Service <cluster>-rw: the same as the plain StatefulSet's.
    assert f"{name}-app" == STORE_SECRET[0]
    url = readme_store_url()
    assert url.hostname == f"{name}-rw"
    spec = cluster["spec"]
    assert spec["bootstrap"]["initdb"]["database"] == url.path.lstrip("/")
    assert spec["bootstrap"]["initdb"]["owner"] == url.username
    # An accepted task is committed on a standby too: a failover loses none.
    assert spec["instances"] >= 2
    assert spec["postgresql"]["synchronous"]["number"] >= 1
    assert spec["postgresql"]["synchronous"]["dataDurability"] == "required"


def readme_store_url() -> Any:
    """The routers' URL that README's `kubectl create secret` writes, parsed."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    command = re.search(r"kubectl create secret generic (\S+) (.*?)\n(?!\s)", text, re.DOTALL)
    assert command, "README.md has lost its `kubectl create secret` command"
    assert command.group(1) == STORE_SECRET[0]
    literals = dict(re.findall(r'--from-literal=(\w+)="?([^"\s]+)"?', command.group(2)))
    assert set(literals) == {"username", "password", STORE_SECRET[1]}
    url = urlsplit(re.sub(r"\$\w+", "secret", literals[STORE_SECRET[1]]))  # the password
    assert url.scheme == "postgresql" and url.username == literals["username"]
    return url


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
        "mineru_health.runtime.settings", reason="native extension not built", exc_type=ImportError
    )
    data = {k: v for k, v in env_config().items() if k.startswith("MINERU_ROUTER_HEALTH_")}
    settings = monitor.HealthSettings.from_env(data)
    assert settings.interval_s == float(data["MINERU_ROUTER_HEALTH_INTERVAL_S"])


def test_rules_file_is_mounted_where_the_variable_points() -> None:
    rules_path = Path(env_config()["MINERU_HEALTH_RULES"])
    rules = by_kind_name("ConfigMap", "mineru-health-rules")["data"]
    assert rules_path.name in rules
    routers = [
        find(docs, "Deployment", "mineru-router")
        for docs in ([d for _, d in manifests()], several_routers())
    ]
    for workload in [*worker_workloads(), *routers]:
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


#: compose.yaml: one router, its SQLite store on a volume; several-routers.yaml: two
#: routers on one PostgreSQL.
COMPOSE_FILES = ["compose.yaml", "several-routers.yaml"]


def compose(name: str = "compose.yaml") -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose" / name).read_text())
    assert isinstance(doc, dict)
    return doc


def interpolated(value: str) -> str:
    """``value`` with Compose's ``${NAME:?message}`` and ``${NAME}`` replaced, as an
    operator's .env would."""
    return re.sub(r"\$\{(\w+)(:?[?-][^}]*)?\}", lambda m: f"<{m.group(1)}>", value)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_validates_against_the_compose_spec(name: str) -> None:
    pytest.importorskip("check_jsonschema")
    import importlib.resources
    import json

    import jsonschema

    # The Compose specification's schema as check-jsonschema vendors it: offline.
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendored / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose(name))]
    assert not errors, errors


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_workers_exit_on_fatal_and_restart_on_exit(file: str) -> None:
    services = compose(file)["services"]
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


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_rules_file_reaches_every_process_that_names_it(file: str) -> None:
    for name, svc in compose(file)["services"].items():
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


def test_compose_several_routers_share_postgres_and_find_the_workers_by_dns() -> None:
    services = compose("several-routers.yaml")["services"]
    workers = {n: s for n, s in services.items() if s.get("entrypoint") == "mineru-api"}
    routers = {n: s for n, s in services.items() if s.get("entrypoint") == "mineru-router"}
    assert len(routers) == 2
    # The same workers as compose.yaml's, answering to one DNS name besides their own.
    single = compose("compose.yaml")["services"]
    aliases = []
    for name, worker in workers.items():
        assert {k: v for k, v in worker.items() if k != "networks"} == single[name], name
        aliases.append(set(worker["networks"]["default"]["aliases"]))
    postgres = services["postgres"]
    db = postgres["environment"]
    ids, ports, volumes = set(), set(), set()
    for name, router in routers.items():
        env = router["environment"]
        host, _, port = env["MINERU_ROUTER_HEALTH_UPSTREAM_DNS"].rpartition(":")
        assert all(host in names for names in aliases) and port == "8000", name
        command = router["command"]
        assert "--upstream-url" not in command
        assert command[command.index("--local-gpus") + 1] == "none"
        assert router["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert set(workers) <= set(router["depends_on"])
        url = urlsplit(interpolated(env["MINERU_ROUTER_HEALTH_STORE_URL"]))
        assert (url.scheme, url.hostname, url.port) == ("postgresql", "postgres", 5432)
        assert (url.username, url.password) == (db["POSTGRES_USER"], "<POSTGRES_PASSWORD>")
        assert url.path == f"/{db['POSTGRES_DB']}"
        # A container's host name is its id, new when Compose recreates it: named instead.
        ids.add(env["MINERU_ROUTER_HEALTH_ROUTER_ID"])
        ports.update(mapping.split(":")[0] for mapping in router["ports"])
        state = env["MINERU_HEALTH_STATE_DIR"]
        volumes.update(v.split(":")[0] for v in router["volumes"] if v.split(":")[1] == state)
    assert len(ids) == len(ports) == len(volumes) == len(routers)
    assert interpolated(db["POSTGRES_PASSWORD"]) == "<POSTGRES_PASSWORD>"
    assert any("pg_isready" in part for part in postgres["healthcheck"]["test"])


def test_compose_several_routers_pass_the_start_up_checks() -> None:
    settings = pytest.importorskip(
        "mineru_health.runtime.settings", reason="native extension not built", exc_type=ImportError
    )
    for name, service in compose("several-routers.yaml")["services"].items():
        env = {k: interpolated(str(v)) for k, v in service.get("environment", {}).items()}
        env = {k: v for k, v in env.items() if k.startswith("MINERU_ROUTER_HEALTH_")}
        if not env:
            continue
        checked = settings.HealthSettings.from_env(env)
        assert checked.store_url.startswith("postgresql://"), name
        assert checked.upstream_dns == env["MINERU_ROUTER_HEALTH_UPSTREAM_DNS"], name


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
