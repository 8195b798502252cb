"""deploy/kubernetes/: the example autoscaling manifests (KEDA's ScaledObject, a Kubernetes
HPA on an External metric) scale the worker Deployment of the same directory on a metric
/metrics exports, with bounds that agree with each other and with the gauge's own."""

from pathlib import Path

import pytest
import yaml
from django.conf import settings

from .test_deploy import check_expressions

KUBERNETES = Path(settings.BASE_DIR) / "deploy" / "kubernetes"


def documents(name: str) -> dict[str, dict]:
    """The file's documents by kind."""
    docs = [doc for doc in yaml.safe_load_all((KUBERNETES / name).read_text()) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), f"{name}: two documents of one kind"
    return by_kind


@pytest.fixture(scope="module")
def worker() -> dict:
    deployment = documents("worker-deployment.yaml")["Deployment"]
    assert deployment["apiVersion"] == "apps/v1"
    return deployment


def processes_per_pod(deployment: dict) -> int:
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "worker")
    command = " ".join(container["command"] + container["args"])
    assert "celery -A delaypay worker -Q execute" in command  # the Procfile's worker: the execute queue
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert '-c "$WORKER_CONCURRENCY"' in command
    return int(env["WORKER_CONCURRENCY"])


def check_target(ref: dict, deployment: dict) -> None:
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", deployment["metadata"]["name"])


def test_the_worker_deployment_leaves_its_replica_count_to_the_autoscaler(worker):
    assert "replicas" not in worker["spec"]
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert worker["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert processes_per_pod(worker) >= 1


def test_the_keda_scaled_object_scales_the_workers_on_an_exported_metric(worker, exported):
    scaled = documents("keda-scaledobject.yaml")["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    check_target(spec["scaleTargetRef"], worker)
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"  # replicas = ceil(value / threshold); fallback needs it
    check_expressions([trigger["metadata"]["query"]], exported)
    assert "delaypay_workers_needed" in trigger["metadata"]["query"]
    # The gauge counts processes; a replica runs WORKER_CONCURRENCY of them.
    assert float(trigger["metadata"]["threshold"]) == processes_per_pod(worker)


def test_the_hpa_scales_the_workers_on_the_external_metric_the_adapter_serves(worker, exported):
    docs = documents("hpa.yaml")
    hpa = docs["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    check_target(spec["scaleTargetRef"], worker)
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    [metric] = spec["metrics"]
    assert metric["type"] == "External"
    name = metric["external"]["metric"]["name"]
    assert metric["external"]["target"]["type"] == "AverageValue"
    assert float(metric["external"]["target"]["averageValue"]) == processes_per_pod(worker)

    # prometheus-adapter's rule: serves that name, from a series /metrics exports.
    adapter = docs["ConfigMap"]
    assert adapter["apiVersion"] == "v1"
    [rule] = [r for r in yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"] if r["name"]["as"] == name]
    assert rule["resources"] == {"namespaced": False}  # the web's series carry no pod of the worker's namespace
    series = rule["seriesQuery"]
    query = rule["metricsQuery"].replace("<<.Series>>", series).replace("{<<.LabelMatchers>>}", "")
    assert "<<" not in query
    check_expressions([series, query], exported)
    assert series == "delaypay_workers_needed"


def test_the_bounds_agree_across_manifests_and_with_the_gauge(worker):
    """Both autoscalers allow the same replicas, and the most they allow is the gauge's
    own maximum (DELAYPAY_SCALE_MAX_WORKERS processes): a lower one caps the fleet below
    what the gauge asks for, a higher one is never reached."""
    keda = documents("keda-scaledobject.yaml")["ScaledObject"]["spec"]
    hpa = documents("hpa.yaml")["HorizontalPodAutoscaler"]["spec"]
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    assert keda["maxReplicaCount"] * processes_per_pod(worker) == settings.DELAYPAY_SCALE_MAX_WORKERS
    assert keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
