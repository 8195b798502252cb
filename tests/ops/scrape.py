"""Read GET /metrics the way Prometheus does."""

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families


def series_key(name: str, labels: dict | None = None) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    return f"{name}{{{inner}}}"


def scrape(client: Client | None = None, **headers) -> dict[str, float]:
    """Every sample of /metrics as {'name{label="v",...}': value}."""
    response = (client or Client(HTTP_HOST="localhost")).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[series_key(sample.name, sample.labels)] = sample.value
    return samples


def delta(after: dict[str, float], before: dict[str, float], name: str, **labels) -> float:
    key = series_key(name, labels)
    return after.get(key, 0.0) - before.get(key, 0.0)
