"""Deploy assets, validated as far as this machine allows (no Docker engine, no cluster):
docker-compose.yml against the Compose Specification's JSON Schema, the Kubernetes manifests against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict), and the wiring between the files — ports, paths,
names, settings — checked in Python. tests/integration/test_deploy_metrics.py checks that every metric the
dashboard and the alerts query exists in a running worker's /metrics."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from worker.config import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.33.0"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _k8s_docs() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


def _kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _k8s_docs() if d["kind"] == kind]
    return doc


def _setting_name(env_key: str) -> str:
    assert env_key.startswith("SENTIMENT_"), env_key
    return env_key.removeprefix("SENTIMENT_").lower()


def _compose() -> dict[str, Any]:
    return dict(_yaml(REPO / "docker-compose.yml"))


def _compose_partitions() -> int:
    command = _compose()["services"]["topics"]["command"]
    return int(command[command.index("--partitions") + 1])


# ----- docker compose -----
def test_compose_file_satisfies_the_compose_specification_schema() -> None:
    import check_jsonschema

    schema_path = Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    compose = _compose()
    assert [e.message for e in validator.iter_errors(compose)] == []
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["healthcheck_typo"] = {}
    assert list(validator.iter_errors(broken)), "the schema must reject unknown keys (else it checks nothing)"


def test_compose_wires_worker_prometheus_grafana_and_the_gpu_profile() -> None:
    services = _compose()["services"]
    assert {"kafka", "topics", "worker", "prometheus", "grafana", "dcgm-exporter", "worker-gpu"} <= set(
        services
    )
    # Default `docker compose up`: broker, worker, monitoring; the GPU services only with --profile gpu.
    assert {name for name, s in services.items() if "profiles" in s} == {"dcgm-exporter", "worker-gpu"}
    assert services["dcgm-exporter"]["profiles"] == ["gpu"] == services["worker-gpu"]["profiles"]
    # CPU services serve what `make model` derives (ONNX Runtime INT8); the GPU worker the shipped model.
    for name, mount in (("worker", "./models/default-int8"), ("worker-gpu", "./models/default")):
        worker = services[name]
        assert worker["read_only"] is True and worker["tmpfs"] == ["/tmp"]
        assert f"{mount}:/models/default:ro" in worker["volumes"]
        for key in worker["environment"]:
            assert _setting_name(key) in WorkerSettings.model_fields, f"{name}: {key} is not a setting"
    gpu = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert services["worker-gpu"]["build"]["dockerfile"] == "deploy/docker/Dockerfile.gpu"

    # Prometheus finds, inside the container, the config it is started with and the rule files that config
    # names (relative paths resolve against the config file's directory), and they are the repository's
    # files; it scrapes the worker on its published port.
    prometheus = services["prometheus"]
    mounts = {
        PurePosixPath(container): host
        for host, container in (v.rsplit(":", 1)[0].split(":", 1) for v in prometheus["volumes"])
    }
    for host in mounts.values():
        assert (REPO / host).exists(), host

    def host_path(container_path: PurePosixPath) -> Path:
        for mount, host in mounts.items():
            if container_path == mount or mount in container_path.parents:
                return (REPO / host / container_path.relative_to(mount)).resolve()
        raise AssertionError(f"{container_path} is not mounted into the prometheus container")

    (config_flag,) = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    config_in_container = PurePosixPath(config_flag.split("=", 1)[1])
    assert host_path(config_in_container) == DEPLOY / "prometheus/prometheus.yml"
    config = _yaml(DEPLOY / "prometheus/prometheus.yml")
    rule_files = [config_in_container.parent / rule for rule in config["rule_files"]]
    assert [host_path(rule) for rule in rule_files] == [DEPLOY / "prometheus/alerts.yml"]
    # Relative, so that `promtool check config` on the repository's own file finds the same rules.
    assert not any(PurePosixPath(rule).is_absolute() for rule in config["rule_files"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    worker_port = services["worker"]["ports"][0].split(":")[-1]
    assert jobs["sentiment-worker"]["static_configs"][0]["targets"] == [f"worker:{worker_port}"]
    assert jobs["sentiment-worker"]["metrics_path"] == "/metrics"
    assert jobs["dcgm-exporter"]["static_configs"][0]["targets"] == ["dcgm-exporter:9400"]

    # Grafana: provisioning and dashboards mounted where the provisioning file looks for them.
    grafana = services["grafana"]
    gmounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    assert gmounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = _yaml(DEPLOY / "grafana/provisioning/dashboards/dashboards.yml")["providers"][0]
    assert gmounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (DEPLOY / "grafana/dashboards" / Path(home).name).is_file()


# ----- Grafana -----
def test_grafana_dashboard_is_valid_and_has_the_panels_operators_need() -> None:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/sentiment-worker.json").read_text(encoding="utf-8"))
    datasource = _yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    titles = " | ".join(p["title"].lower() for p in panels)
    for needed in (
        "lag per partition (messages)",
        "lag per partition (seconds)",
        "throughput",
        "end-to-end latency",
        "batch tokens",
        "padding efficiency",
        "dead letters",
        "gpu memory",
    ):
        assert needed in titles, needed
    latency = next(p for p in panels if p["title"].startswith("End-to-end latency"))
    assert [t["legendFormat"] for t in latency["targets"]] == ["p50", "p95", "p99"]


# ----- Prometheus alerts -----
def test_alert_rules_cover_lag_dead_letters_readiness_and_progress() -> None:
    groups = _yaml(DEPLOY / "prometheus/alerts.yml")["groups"]
    rules = {rule["alert"]: rule for group in groups for rule in group["rules"]}
    for name in (
        "SentimentLagSecondsHigh",
        "SentimentDeadLetterRateHigh",
        "SentimentWorkerNotReady",
        "SentimentNoProgress",
        "SentimentWorkerDown",
    ):
        assert name in rules, name
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
    assert "sentiment_consumer_lag_seconds" in rules["SentimentLagSecondsHigh"]["expr"]
    assert "sentiment_ready == 0" in rules["SentimentWorkerNotReady"]["expr"]


# ----- Kubernetes -----
def test_k8s_manifests_pass_the_kubernetes_schema_strictly() -> None:
    checked = []
    for doc in _k8s_docs():
        if doc["apiVersion"].startswith(("keda.sh/", "kustomize.config.k8s.io/")):
            continue  # custom resources: no OpenAPI schema here; checked structurally below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == [
        "ConfigMap",
        "Deployment",
        "PersistentVolumeClaim",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "Secret",
        "Service",
    ]
    broken = copy.deepcopy(_kind("Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _yaml(DEPLOY / "k8s/kustomization.yaml")
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_k8s_configmap_is_a_valid_worker_configuration() -> None:
    data = _kind("ConfigMap")["data"]
    values = {_setting_name(k): v for k, v in data.items()}
    settings = WorkerSettings(**values, sasl_username="u", sasl_password="p")  # strings coerced as from env
    assert settings.device == "gpu" and settings.http_host == "0.0.0.0"


def test_k8s_deployment_probes_gpu_security_and_read_only_model() -> None:
    deployment, config = _kind("Deployment"), _kind("ConfigMap")["data"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert str(port) == config["SENTIMENT_HTTP_PORT"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (
        mounts["model"]["readOnly"] is True and volumes["model"]["persistentVolumeClaim"]["readOnly"] is True
    )
    assert mounts["model"]["mountPath"] == config["SENTIMENT_MODEL"]
    assert "emptyDir" in volumes[next(n for n, m in mounts.items() if m["mountPath"] == "/tmp")]
    # SIGTERM drain (bounded by the shutdown timeout) must finish before the kubelet kills the pod.
    assert pod["terminationGracePeriodSeconds"] > float(config["SENTIMENT_SHUTDOWN_TIMEOUT_S"])
    # Every variable is a setting; credentials come from the Secret, with keys that exist in it.
    secret = _kind("Secret")
    for env in container["env"]:
        assert _setting_name(env["name"]) in WorkerSettings.model_fields
        ref = env["valueFrom"].get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert {e["name"] for e in container["env"]} >= {"SENTIMENT_SASL_USERNAME", "SENTIMENT_SASL_PASSWORD"}
    assert "SENTIMENT_SASL_PASSWORD" not in config
    assert container["envFrom"] == [{"configMapRef": {"name": _kind("ConfigMap")["metadata"]["name"]}}]


def test_keda_scaledobject_scales_on_the_workers_group_lag_capped_at_the_partition_count() -> None:
    scaled, auth = _kind("ScaledObject"), _kind("TriggerAuthentication")
    config, secret = _kind("ConfigMap")["data"], _kind("Secret")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" == auth["apiVersion"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == _kind("Deployment")["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["bootstrapServers"] == config["SENTIMENT_BOOTSTRAP_SERVERS"]
    assert meta["consumerGroup"] == config["SENTIMENT_GROUP_ID"]
    assert meta["topic"] == config["SENTIMENT_INPUT_TOPIC"]
    assert int(meta["lagThreshold"]) > 0 and meta["offsetResetPolicy"] == "earliest"
    assert meta["allowIdleConsumers"] == "false"
    assert all(isinstance(v, str) for v in meta.values()), "KEDA trigger metadata values are strings"
    # One partition per group member: more replicas than partitions would sit idle.
    assert scaled["spec"]["maxReplicaCount"] == _compose_partitions() == 6
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    text = (DEPLOY / "k8s/scaledobject.yaml").read_text(encoding="utf-8")
    assert "partition count" in text and "maxReplicaCount: 6" in text
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {
        "sasl",
        "username",
        "password",
        "tls",
    }


# ----- images -----
def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_images_run_as_non_root_with_a_health_check(name: str) -> None:
    steps = _instructions(DEPLOY / "docker" / name)
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" and "/healthz" in arg for op, arg in steps)
    assert any(op == "ENTRYPOINT" and "sentiment-worker" in arg for op, arg in steps)


def test_gpu_image_is_the_official_paddle_cuda_image_at_a_pinned_tag() -> None:
    text = (DEPLOY / "docker/Dockerfile.gpu").read_text(encoding="utf-8")
    image = re.search(r"^ARG PADDLE_IMAGE=(\S+)$", text, re.M)
    assert image is not None
    repository, tag = image.group(1).rsplit(":", 1)
    assert repository.endswith("paddlepaddle/paddle") and "latest" not in tag
    assert re.fullmatch(r"\d+\.\d+\.\d+-gpu-cuda\d+\.\d+-cudnn[\d.]+(-trt[\d.]+)?", tag)
    cuda = re.search(r"cuda(\d+\.\d+)", tag)
    assert cuda and f"CUDA {cuda.group(1)}" in text and "driver" in text.lower()  # noted for operators
    assert "paddlepaddle-gpu==3.3.1" in text  # the Paddle version the worker is tested with


# ----- `serve`: compose service and its own Kubernetes kustomization -----
def _serve_docs() -> dict[str, dict[str, Any]]:
    docs = [
        doc
        for path in sorted((DEPLOY / "k8s/serve").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]
    return {doc["kind"]: doc for doc in docs}


def test_serve_manifests_pass_the_kubernetes_schema_and_are_all_listed() -> None:
    docs = _serve_docs()
    for kind, doc in docs.items():
        if kind != "Kustomization":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert sorted(docs) == ["ConfigMap", "Deployment", "Kustomization", "Secret", "Service"]
    files = {p.name for p in (DEPLOY / "k8s/serve").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(docs["Kustomization"]["resources"]) == files


def test_serve_deployment_runs_serve_with_probes_a_service_and_a_secret_token() -> None:
    docs = _serve_docs()
    config = docs["ConfigMap"]["data"]
    settings = WorkerSettings(**{_setting_name(k): v for k, v in config.items()})
    assert settings.http_host == "0.0.0.0" and settings.http_api is False
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["serve"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert (
        str(port)
        == config["SENTIMENT_HTTP_PORT"]
        == docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    )
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] > float(config["SENTIMENT_SHUTDOWN_TIMEOUT_S"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    selector = docs["Service"]["spec"]["selector"]
    assert selector.items() <= docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == "http"
    env = {e["name"]: e for e in container["env"]}
    assert all(_setting_name(name) in WorkerSettings.model_fields for name in env)
    token = env["SENTIMENT_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (
        token["name"] == docs["Secret"]["metadata"]["name"] and token["key"] in docs["Secret"]["stringData"]
    )
    assert "SENTIMENT_API_TOKEN" not in config
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["model"]["readOnly"] is True and mounts["model"]["mountPath"] == config["SENTIMENT_MODEL"]
    claims = {d["metadata"]["name"] for d in _k8s_docs() if d["kind"] == "PersistentVolumeClaim"}
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] in claims


def test_every_replica_mounts_the_live_models_read_only_at_the_same_path() -> None:
    claims = {d["metadata"]["name"]: d for d in _k8s_docs() if d["kind"] == "PersistentVolumeClaim"}
    assert claims["sentiment-models"]["spec"]["accessModes"] == ["ReadOnlyMany"]
    for deployment in (_kind("Deployment"), _serve_docs()["Deployment"]):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volume = {v["name"]: v for v in pod["volumes"]}["models"]["persistentVolumeClaim"]
        assert (mounts["models"]["mountPath"], mounts["models"]["readOnly"]) == ("/models/live", True)
        assert (volume["claimName"], volume["readOnly"]) == ("sentiment-models", True)
    services = _compose()["services"]
    for name in ("worker", "serve", "worker-gpu"):
        assert "./models:/models/live:ro" in services[name]["volumes"], name


def test_compose_serves_the_model_over_http_and_prometheus_scrapes_it() -> None:
    serve = _compose()["services"]["serve"]
    assert serve["command"] == ["serve"] and serve["read_only"] is True and serve["tmpfs"] == ["/tmp"]
    assert "./models/default-int8:/models/default:ro" in serve["volumes"]
    for key in serve["environment"]:
        assert _setting_name(key) in WorkerSettings.model_fields
    host, container = serve["ports"][0].split(":")
    assert container == "9108"  # the image's port and HEALTHCHECK
    jobs = {job["job_name"]: job for job in _yaml(DEPLOY / "prometheus/prometheus.yml")["scrape_configs"]}
    assert jobs["sentiment-serve"]["static_configs"][0]["targets"] == [f"serve:{container}"]
