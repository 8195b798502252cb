"""The benchmark's PNG: what a person would rather look at than read.

matplotlib is a development dependency, imported here only (Agg backend, no display).
"""

from pathlib import Path

from .report import _num as _fmt

GREEN, RED, GREY, BLUE, ORANGE, PURPLE = "#2e9d5b", "#d1495b", "#8d99ae", "#2b6cb0", "#e07a1f", "#6b46c1"


def pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--chart needs matplotlib: pip install -r requirements-dev.txt") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "font.size": 10, "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.alpha": 0.25, "axes.titleweight": "bold", "axes.titlesize": 11,
    })
    return plt


def _save(plt, fig, path: Path, rect=(0, 0, 1, 1)) -> Path:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _series(run: dict, key: str) -> list:
    return (run.get("series") or {}).get(key) or []


def _none_to_nan(values):
    return [float("nan") if v is None else v for v in values]


def drain_chart(run: dict, path: Path) -> Path:
    """Throughput per second (with pgbench's and the naive approach's rates) above
    lateness over time."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    executed, failed = _series(run, "executed_per_s"), _series(run, "failed_per_s")
    seconds = list(range(len(executed)))
    top.bar(seconds, executed, width=0.9, color=GREEN, label="executed / s", align="edge")
    top.bar(seconds, failed, width=0.9, bottom=executed, color=RED, label="failed (underfunded) / s", align="edge")
    steady = run.get("scenario") == "steady"
    if steady:
        due = _series(run, "due_per_s")
        top.step(range(len(due)), due, where="post", color=GREY, lw=1.5, label="due / s")
    if run.get("pgbench_tps") and not steady:  # at 300/s the line would only flatten the bars
        top.axhline(run["pgbench_tps"], color=PURPLE, ls="--", lw=1.5,
                    label=f"pgbench, 1 transfer/tx: {run['pgbench_tps']:,.0f} tps")
    naive = run.get("naive") or {}
    naive_done = [a + b for a, b in zip(_series(naive, "executed_per_s"), _series(naive, "failed_per_s"), strict=False)]
    if naive_done:
        top.step(range(len(naive_done)), naive_done, where="post", color=ORANGE, lw=1.8,
                 label=f"naive Celery ETA ({naive.get('payments', 0):,} payments)")
    if run.get("payments_per_s"):
        top.axhline(run["payments_per_s"], color=GREEN, ls=":", lw=1.5,
                    label=f"delaypay average: {run['payments_per_s']:,.0f} payments/s")
    top.set_ylabel("payments finished per second")
    top.legend(loc="upper right", fontsize=9, framealpha=0.9)
    ratio = run.get("ratio_vs_pgbench")
    verdict = "correct" if run.get("correct") else "CHECK FAILED"
    ex, di = run.get("execution_lateness_s") or {}, run.get("dispatch_lateness_s") or {}
    if steady:
        title = (f"delaypay steady: {run.get('payments', 0):,} payments due at {_fmt(run.get('rate'))}/s — "
                 f"lateness p99: dispatch {_fmt(di.get('p99'), '.2f')} s, execution {_fmt(ex.get('p99'), '.2f')} s")
    else:
        title = (f"delaypay {run['scenario']}: {run.get('payments', 0):,} payments due at once: "
                 f"{_fmt(run.get('drain_s'), '.1f')} s, {_fmt(run.get('payments_per_s'))}/s, "
                 f"{_fmt(ratio, '.2f')}x pgbench"
                 + (f", {_fmt(run.get('ratio_vs_naive'), '.0f')}x naive" if run.get("ratio_vs_naive") else ""))
    top.set_title(f"{title}  [{verdict}]", loc="left")
    if not steady and run.get("drain_s"):
        top.axvline(run["drain_s"], color=GREEN, lw=1, alpha=0.6)
        top.annotate(f"drained: {run['drain_s']:.1f} s", (run["drain_s"], top.get_ylim()[1] * 0.93),
                     xytext=(4, 0), textcoords="offset points", color=GREEN, fontsize=9)
    if not steady and naive.get("drain_s"):
        top.annotate(f"naive: {naive.get('payments', 0):,} payments took {naive['drain_s']:.1f} s",
                     (naive["drain_s"], max(naive_done or [0])), xytext=(-4, 8), textcoords="offset points",
                     ha="right", color=ORANGE, fontsize=9)

    if steady:
        _lateness_per_second(bottom, run, naive)
    else:
        _finished_share(bottom, run, naive)
    bottom.set_xlabel("seconds since the first payment was due")
    rss = run.get("peak_rss_mb") or {}
    note = (
        f"execution lateness p50/p99/max {_fmt(ex.get('p50'), '.2f')} / {_fmt(ex.get('p99'), '.2f')} /"
        f" {_fmt(ex.get('max'), '.2f')} s    dispatch p99 {_fmt(di.get('p99'), '.2f')} s    "
        f"peak RSS " + ", ".join(f"{k} {v:,.0f} MB" for k, v in rss.items())
        + f"    {run.get('workers', 1)} worker x {run.get('concurrency', 2)}, batch {run['knobs']['claim_batch']}"
    )
    fig.text(0.01, 0.005, note, fontsize=8.5, color="#444")
    return _save(plt, fig, path, rect=(0, 0.025, 1, 1))


def _lateness_per_second(ax, run: dict, naive: dict) -> None:
    """Steady load: lateness percentiles of the payments finishing in each second."""
    for key, label, color, style in (
        ("execution_lateness_p50_s", "execution lateness p50", BLUE, "-"),
        ("execution_lateness_p99_s", "execution lateness p99", BLUE, "--"),
        ("execution_lateness_max_s", "execution lateness max", BLUE, ":"),
        ("dispatch_lateness_p99_s", "dispatch lateness p99 (claimed)", GREY, "-"),
    ):
        values = _none_to_nan(_series(run, key))
        if values:
            ax.step(range(len(values)), values, where="post", color=color, ls=style, lw=1.6, label=label)
    naive_p99 = _none_to_nan(_series(naive, "execution_lateness_p99_s"))
    if naive_p99:
        ax.step(range(len(naive_p99)), naive_p99, where="post", color=ORANGE, lw=1.4,
                label="naive execution lateness p99")
    ax.axhline(1.5, color=GREY, ls="-.", lw=1, label="target: dispatch p99 1.5 s")
    ax.axhline(2.5, color=BLUE, ls="-.", lw=1, label="target: execution p99 2.5 s")
    ax.set_ylabel("lateness (s) of payments\nfinishing in that second")
    ax.legend(loc="upper left", fontsize=8.5, framealpha=0.9, ncol=2)


def _cumulative_percent(counts: list) -> list[float]:
    total, out, running = sum(counts) or 1, [0.0], 0
    for c in counts:
        running += c
        out.append(100.0 * running / total)
    return out


def _finished_share(ax, run: dict, naive: dict) -> None:
    """Burst: the share of payments claimed and finished after x seconds, which is the
    distribution of their lateness (everything was due at x = 0)."""
    claimed = _cumulative_percent(_series(run, "claimed_per_s"))
    done = _cumulative_percent([a + b for a, b in zip(
        _series(run, "executed_per_s"), _series(run, "failed_per_s"), strict=False)])
    if len(claimed) > 1:
        ax.plot(range(len(claimed)), claimed, color=GREY, lw=1.6, label="delaypay: claimed (dispatch lateness)")
    ax.plot(range(len(done)), done, color=GREEN, lw=2.2, label="delaypay: finished (execution lateness)")
    naive_done = _cumulative_percent([a + b for a, b in zip(
        _series(naive, "executed_per_s"), _series(naive, "failed_per_s"), strict=False)])
    if len(naive_done) > 1:
        ax.plot(range(len(naive_done)), naive_done, color=ORANGE, lw=2.0,
                label=f"naive: finished ({naive.get('payments', 0):,} payments)")
    ex = run.get("execution_lateness_s") or {}
    for q in ("p50", "p99"):
        if ex.get(q) is not None:
            share = 50 if q == "p50" else 99
            ax.plot([ex[q]], [share], "o", color=GREEN, ms=5)
            ax.annotate(f"{q} {ex[q]:.1f} s", (ex[q], share), xytext=(6, -12), textcoords="offset points",
                        color=GREEN, fontsize=9)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of the payments\ndone this late or less")
    ax.legend(loc="lower right", fontsize=8.5, framealpha=0.9)


def backlog_chart(run: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    levels = sorted(run["levels"].items(), key=lambda kv: int(kv[0]))
    names = [f"{int(size):,} future payments pending" for size, _ in levels]
    x = range(len(levels))
    ax.bar([i - 0.2 for i in x], [lv["claim_ms_p50"] for _, lv in levels], width=0.4, color=BLUE,
           label="claim_due(), wall clock p50")
    ax.bar([i + 0.2 for i in x], [lv["explain_ms_p50"] for _, lv in levels], width=0.4, color=GREY,
           label="EXPLAIN ANALYZE of the claim, p50")
    for i, (_, lv) in enumerate(levels):
        ax.text(i - 0.2, lv["claim_ms_p50"], f"{lv['claim_ms_p50']:.2f} ms", ha="center", va="bottom", fontsize=9)
        ax.text(i + 0.2, lv["explain_ms_p50"], f"{lv['explain_ms_p50']:.2f} ms", ha="center", va="bottom",
                fontsize=9)
    ax.set_xticks(list(x), names)
    top = max(max(lv["claim_ms_p50"], lv["explain_ms_p50"]) for _, lv in levels)
    ax.set_ylim(0, top * 1.35)
    ax.set_ylabel(f"ms to claim {run['due_rows']} due rows")
    ax.set_title(f"Claim latency as the schedule grows: {run['claim_latency_ratio']:.2f}x (target <= 1.3x)",
                 loc="left")
    ax.legend(loc="upper center", ncol=2)
    return _save(plt, fig, path)


def memory_chart(run: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    sides = [("delaypay (payments in the table)", run["delaypay"], GREEN),
             ("naive Celery (ETA tasks in the worker)", run["naive"], ORANGE)]
    sizes = sorted({int(k) for side in (run["delaypay"], run["naive"]) for k in side})
    for offset, (label, levels, color) in zip((-0.2, 0.2), sides, strict=True):
        items = sorted(levels.items(), key=lambda kv: int(kv[0]))
        xs = [sizes.index(int(size)) + offset for size, _ in items]
        values = [lv.get("worker", 0) for _, lv in items]
        ax.bar(xs, values, width=0.4, color=color, label=label)
        for xpos, value in zip(xs, values, strict=True):
            ax.text(xpos, value, f"{value:,.0f} MB", ha="center", va="bottom", fontsize=9)
    for size, mb in (run.get("naive_worker_mb_extrapolated") or {}).items():
        if int(size) not in sizes:
            sizes.append(int(size))
        xpos = sizes.index(int(size)) + 0.2
        ax.bar([xpos], [mb], width=0.4, color="white", edgecolor=ORANGE, hatch="//", label="naive, extrapolated")
        ax.text(xpos, mb, f"~{mb:,.0f} MB\n(extrapolated)", ha="center", va="bottom", fontsize=9, color=ORANGE)
    ax.set_xticks(range(len(sizes)), [f"{s:,}" for s in sizes])
    ax.set_xlabel("future payments waiting (delaypay: rows in the table; naive: ETA tasks in the worker)")
    ax.set_ylabel("worker RSS, parent + prefork children (MB)")
    ax.set_title(
        f"Worker memory while payments wait: delaypay x{_fmt(run.get('delaypay_worker_rss_growth'), '.2f')}, "
        f"naive x{_fmt(run.get('naive_worker_rss_growth'), '.1f')} (measured up to {run.get('naive_reached', 0):,})",
        loc="left")
    ax.legend(loc="upper left")
    return _save(plt, fig, path)


def chart(run: dict, path: Path) -> Path:
    """Draw the chart that fits ``run``'s scenario into ``path``."""
    scenario = run["scenario"]
    if scenario == "backlog":
        return backlog_chart(run, path)
    if scenario == "memory":
        return memory_chart(run, path)
    return drain_chart(run, path)
