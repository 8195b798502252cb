import json

import pytest

from devtools.bench.profile import parse_collapsed, summarize
from devtools.bench.report import target_results

ROOT = 'process 1:"celery";main (celery/bin/celery.py:10)'
TASK = "execute_batch (payments/tasks.py:5)"
WAIT = "wait (psycopg/connection.py:9)"
COLLAPSED = "\n".join([
    f"{ROOT};{TASK};execute_batch (payments/execution.py:164);{WAIT} 6",
    f"{ROOT};{TASK};ledger_post_batch (ledger/services.py:79);{WAIT} 3",
    f"{ROOT};{TASK} 1",
    f"{ROOT};poll (kombu/asynchronous/hub.py:3) 90",
])


def test_profile_summary_counts_only_samples_inside_the_task_and_names_the_statement_line():
    result = summarize(parse_collapsed(COLLAPSED))
    assert (result["samples"], result["task_samples"]) == (100, 10)
    assert result["lines"][:2] == [
        ("payments/execution.py:164 execute_batch <- execute_batch", 60.0),
        ("ledger/services.py:79 ledger_post_batch <- execute_batch", 30.0),
    ]
    assert ("wait (psycopg/connection.py)", 90.0) in result["inclusive"]
    assert result["self"][0] == ("wait (psycopg/connection.py)", 90.0)


def test_targets_compare_hot_sender_to_burst_through_each_runs_pgbench_rate():
    runs = {
        "burst": {"ratio_vs_pgbench": 1.2},
        "hot-sender": {"ratio_vs_pgbench": 0.6},
        "steady": {"rate": 300, "execution_lateness_s": {"p99": 0.09, "max": 0.3}},
    }
    verdicts = {(t["scenario"], t["what"]): (t["value"], t["met"]) for t in target_results(runs)}
    assert verdicts[("burst", "payments/s vs pgbench (same run)")] == (1.2, False)
    assert verdicts[("hot-sender", "payments/s vs burst")] == (0.5, False)
    assert verdicts[("steady", "execution lateness p99 at 300/s")] == (0.09, True)
    assert verdicts[("steady", "execution lateness max at 300/s")] == (0.3, False)
    assert ("steady", "execution lateness p99 at 1,000/s") not in verdicts
    assert ("backlog", "claim latency at the large backlog vs 100K") not in verdicts


def test_the_steady_targets_follow_the_rate_and_the_burst_beside_it():
    def verdicts(steady):
        return {(t["scenario"], t["what"]): (t["value"], t["met"]) for t in target_results({"steady": steady})}

    fast = verdicts({"rate": 1000, "execution_lateness_s": {"p99": 0.2, "max": 0.4}})
    assert fast[("steady", "execution lateness p99 at 1,000/s")] == (0.2, True)
    assert ("steady", "execution lateness p99 at 300/s") not in fast
    beside = verdicts({"rate": 300, "execution_lateness_s": {"p99": 2.0},
                       "stream_and_burst": {"stream_execution_lateness_s": {"p99": 1.4}}})
    assert beside == {("steady", "the stream's execution lateness p99 beside a burst (--burst)"): (1.4, False)}


def test_the_webhooks_target_is_judged_only_when_the_burst_ran_with_webhooks():
    plain = {(t["scenario"], t["what"]) for t in target_results({"burst": {"ratio_vs_pgbench": 1.2}})}
    assert ("burst", "payments/s with webhooks vs without (--webhooks)") not in plain
    for ratio, met in ((0.93, True), (0.85, False)):
        runs = {"burst": {"ratio_vs_pgbench": 1.2, "webhooks": {"ratio_with_vs_without": ratio}}}
        verdicts = {(t["scenario"], t["what"]): (t["value"], t["met"]) for t in target_results(runs)}
        assert verdicts[("burst", "payments/s with webhooks vs without (--webhooks)")] == (ratio, met)


@pytest.mark.processes
def test_compare_prints_each_run_and_the_means_per_payment(tmp_path):
    from devtools.bench.compare import figures, main

    def run(rate, tps, postgres_s, wal):
        return {"payments": 1000, "executed": 980, "failed": 20, "payments_per_s": rate, "pgbench_tps": tps,
                "ratio_vs_pgbench": round(rate / tps, 2), "cpu_seconds": {"postgres": postgres_s, "worker": 0.1},
                "wal_bytes": wal, "execution_lateness_s": {"p99": 3.5}}

    before, after = run(1000, 1000, 0.3, 5_000_000), run(1500, 1000, 0.2, 4_000_000)
    assert figures(after) == {"payments_per_s": 1500, "pgbench_tps": 1000, "ratio": 1.5, "postgres_us": 200.0,
                              "worker_us": 100.0, "wal_bytes": 4000.0, "lateness_p99_s": 3.5}
    paths = []
    for name, data in (("b.json", before), ("a.json", after)):
        (tmp_path / name).write_text(json.dumps(data))
        paths.append(str(tmp_path / name))
    chart = tmp_path / "ab.png"
    main(["--before", paths[0], "--after", paths[1], "--chart", str(chart), "--target", "1.5"])
    assert chart.stat().st_size > 0
