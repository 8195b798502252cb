"""The capacity model (devtools/capacity.py) and the CPU meter its figures come from
(devtools/bench/cpu.py)."""

import json

import pytest
from django.db import connection

from devtools import capacity
from devtools.bench.cpu import CpuMeter, postgres_processes


def bench_json(path, *, workers: int, batch: int, rate: float, pg: float, worker: float, promoter: float,
               payments: int = 10_000, wal: int = 5_000, stored: int = 2_500):
    """A `bench burst --json` body with the figures the model reads (CPU seconds per kind)."""
    drain = payments / rate
    path.write_text(json.dumps({
        "scenario": "burst", "payments": payments, "workers": workers, "concurrency": 4, "cores": 2,
        "knobs": {"claim_batch": batch}, "drain_s": drain, "payments_per_s": rate, "pgbench_tps": 2_000,
        "cpu_seconds": {"postgres": pg * payments / 1000, "postgres_background": 0.0,
                        "worker": worker * payments / 1000, "promoter": promoter * payments / 1000, "beat": 0.0},
        "wal_bytes": wal * payments, "table_bytes": {"payments_scheduledpayment": stored * payments},
    }))
    return path


def test_a_cost_per_payment_and_per_batch_is_fitted_from_two_batch_sizes():
    a, b = capacity.fit([(500, 0.3 + 10 / 500), (100, 0.3 + 10 / 100)])
    assert a == pytest.approx(0.3) and b == pytest.approx(10)
    assert capacity.fit([(500, 0.4)]) == (0.4, 0.0)  # one batch size: no per-batch part


def test_the_model_predicts_the_calibration_run_and_projects_the_target(tmp_path, capsys):
    # Costs a + b/batch: postgres 0.3 + 20/B ms, worker 0.1 + 10/B, promoter 0.02 + 1/B.
    def ms(a, b, batch):
        return a + b / batch

    runs = []
    for workers, batch in ((1, 500), (1, 250), (2, 500)):
        total = ms(0.3, 20, batch) + ms(0.1, 10, batch) + ms(0.02, 1, batch)
        rate = 2 * 0.8 * 1000 / total  # 80 % of 2 cores busy
        runs.append(bench_json(tmp_path / f"w{workers}-b{batch}.json", workers=workers, batch=batch, rate=rate,
                               pg=ms(0.3, 20, batch), worker=ms(0.1, 10, batch), promoter=ms(0.02, 1, batch)))
    model, calibration = capacity.build([capacity.load(p) for p in runs])
    assert [r.batch for r in calibration] == [500, 250]
    assert model.costs["postgres"] == pytest.approx((0.3, 20))
    assert model.busy == pytest.approx(0.8)
    for path in runs:  # the same costs and the same busy share: every run predicted exactly
        run = capacity.load(path)
        assert model.rate_on(run.cores, run.batch) == pytest.approx(run.rate)
    assert capacity.main([str(p) for p in runs]) == 0
    out = capsys.readouterr().out
    assert "primaries" in out and "promoter shards" in out and "worker processes" in out

    class Args:
        rate, pending, batch, headroom, primary_cores, wal_mb_s, primary_disk_tb = 83_000, 500e6, 500, 0.7, 32, 200, 4

    plan = capacity.plan(model, Args)
    # 83,000/s x 0.34 ms of PostgreSQL CPU = 28.2 cores, over 70 % of 32-core primaries: 2.
    assert plan["postgres_cores"] == pytest.approx(83_000 * 0.34 / 1000 / 0.7)
    assert plan["primaries"]["CPU"] == 2
    # 5,000 WAL bytes a payment: 83,000/s is 415 MB/s, over 70 % of 200 MB/s: 3 primaries.
    assert plan["primaries"]["WAL"] == 3 and plan["bound_by"] == "WAL" and plan["next_limit"] == "WAL"
    # The promoter: 0.022 ms a payment, one core at 70 %: 31,818/s each, so 3 shards.
    assert plan["promoter_shards"] == 3


def test_a_run_without_cpu_figures_is_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"scenario": "burst", "payments": 10, "knobs": {"claim_batch": 500}}))
    with pytest.raises(SystemExit, match="no cpu_seconds"):
        capacity.load(path)


@pytest.mark.django_db
def test_the_cpu_meter_counts_this_databases_backend():
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    name = connection.settings_dict["NAME"]
    assert postgres_processes(name).get(backend) == "postgres"
    assert postgres_processes("no_such_database").get(backend) is None
    meter = CpuMeter(lambda: {}, database=name).start()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM generate_series(1, 3000000)")  # some CPU in the backend
    spent = meter.stop()
    assert spent["postgres"] > 0
