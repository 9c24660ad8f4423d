"""What a benchmark run reports: each configuration's result, the report built from them
(machine, layout, ratios), and the report printed as tables; progress lines on the way."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """One configuration measured: a burst of ``items``, then items one at a time."""

    name: str
    items: int
    seconds: float
    throughput: float
    burst_latency_ms: dict[str, float]
    unloaded_latency_ms: dict[str, float]
    peak_rss_mb: dict[str, float]
    commits_per_item: float | None
    publishes_per_item: float | None
    cpu_ms_per_item: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95 and p99 of ``values`` (nearest rank, to 0.01); NaN for none."""
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 2)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


def say(args: Any, line: str) -> None:
    if not args.json:
        print(line, flush=True)


def build_report(
    args: Any, results: dict[str, Result], sweep: dict[str, Any] | None
) -> dict[str, Any]:
    import platform

    import psutil

    def ratio(a: str, b: str) -> float | None:
        if a in results and b in results:
            return round(results[a].throughput / results[b].throughput, 3)
        return None

    def over(a: str, b: str, read: Callable[[Result], float]) -> float | None:
        if a in results and b in results and read(results[b]):
            return round(read(results[a]) / read(results[b]), 3)
        return None

    def unloaded_p50(r: Result) -> float:
        return r.unloaded_latency_ms["p50"]

    def machine_cpu(r: Result) -> float:
        return r.cpu_ms_per_item.get("machine", 0.0)

    equal_work = ratio("saga", "durable_chain8")
    vs_dbos = ratio("saga", "dbos")
    latency = over("saga", "durable_chain8", unloaded_p50)
    cpu = over("saga", "saga_floor", machine_cpu)
    targets = {
        name: {"target": f"{'>=' if low else '<='} {bound}", "measured": measured,
               "met": None if measured is None else (measured >= bound if low else measured <= bound)}
        for name, measured, low, bound in (
            ("ratio_vs_dbos", vs_dbos, True, 1.5),
            ("ratio_vs_equal_work_chain", equal_work, True, 1.0),
            ("unloaded_p50_vs_durable_chain8", latency, False, 1.2),
            ("machine_cpu_vs_saga_floor", cpu, False, 1.5),
        )
    }  # fmt: skip

    return {
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "layout": {
            "pool": args.pool,
            "concurrency": args.concurrency,
            "prefetch_multiplier": args.prefetch,
            "orchestrators": args.orchestrators,
            "task_events": getattr(args, "events", True),
            "starter_threads": args.starters,
            "worker_per_queue": True,
            "analyze_after_warmup": args.analyze_after_warmup,
        },
        "burst": args.sagas,
        "ratio_vs_chain": ratio("saga", "chain"),
        "ratio_vs_durable_chain": ratio("saga", "durable_chain"),
        "ratio_mixed_vs_chain": ratio("saga_mixed", "chain"),
        "ratio_vs_chain_stock": ratio("saga", "chain_stock"),
        "ratio_vs_equal_work_chain": equal_work,
        "ratio_vs_dbos": vs_dbos,
        "ratio_floor_vs_saga": ratio("saga_floor", "saga"),
        "ratio_batched_vs_unbatched": ratio("saga", "saga_unbatched"),
        "targets": targets,
        "configurations": {name: r.__dict__ for name, r in results.items()},
        "sweep": sweep,
    }


def print_report(report: dict[str, Any]) -> None:
    print()
    if not report["configurations"]:
        print_sweep(report)
        print_web(report)
        return
    header = f"{'configuration':<15}{'items/s':>9}{'burst p50':>11}{'p95':>8}{'p99':>8}" \
             f"{'unloaded p50':>14}{'p95':>8}{'p99':>8}{'commits':>9}{'publishes':>11}"  # fmt: skip
    print(header)
    for name, r in report["configurations"].items():
        b, u = r["burst_latency_ms"], r["unloaded_latency_ms"]
        print(
            f"{name:<15}{r['throughput']:>9.1f}{b['p50']:>11.1f}{b['p95']:>8.1f}{b['p99']:>8.1f}"
            f"{u['p50']:>14.1f}{u['p95']:>8.1f}{u['p99']:>8.1f}"
            f"{r['commits_per_item'] if r['commits_per_item'] is not None else '-':>9}"
            f"{r['publishes_per_item'] if r['publishes_per_item'] is not None else '-':>11}"
        )
    print(
        f"\nsaga / dbos: {report['ratio_vs_dbos']}   "
        f"saga / durable_chain8 (equal work): {report['ratio_vs_equal_work_chain']}   "
        f"saga_floor / saga: {report['ratio_floor_vs_saga']}   saga / chain: "
        f"{report['ratio_vs_chain']}   saga / durable chain: {report['ratio_vs_durable_chain']}"
    )
    for target, t in report.get("targets", {}).items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        print(f"target {target} {t['target']}: {t['measured']} ({verdict})")
    print("\nCPU milliseconds per item (burst; other: kernel and short-lived processes):")
    for name, r in report["configurations"].items():
        cpu = dict(r["cpu_ms_per_item"])
        machine = cpu.pop("machine", None)
        line = "  ".join(f"{k} {v}" for k, v in cpu.items())
        if machine is not None:
            line += f"  other {round(machine - sum(cpu.values()), 2)}  machine {machine}"
        print(f"  {name:<15}{line}")
    for name, r in report["configurations"].items():
        print(f"peak RSS {name}: " + ", ".join(f"{k} {v} MB" for k, v in r["peak_rss_mb"].items()))
        if "long" in r["extra"]:
            print(f"RSS growth over the long run: {r['extra']['long']['growth_percent']}")
    for name, r in report["configurations"].items():
        hops = r["extra"].get("unloaded_hops_ms")
        if hops:
            print(f"unloaded {name}, ms per step (decision -> participant -> reply applied): "
                  + ", ".join(f"{s} {h['to_participant']} + {h['to_reply']}"
                              for s, h in hops.items()))  # fmt: skip
    print_sweep(report)
    print_web(report)


def print_web(report: dict[str, Any]) -> None:
    web = report.get("web")
    if not web:
        return
    small, large = (str(n) for n in web["rows"])
    print(f"\nweb, request time in ms (p50 / p95) with {small} and {large} sagas in the table:")
    for label, t in web["pages"].items():
        print(f"  {label:<26}{t[small]['p50']:>8.1f} /{t[small]['p95']:>7.1f}"
              f"{t[large]['p50']:>10.1f} /{t[large]['p95']:>7.1f}   x{t['ratio']}")  # fmt: skip


def print_sweep(report: dict[str, Any]) -> None:
    if report["sweep"]:
        sizes = report["sweep"]["empty_pass_ms_by_rows"]
        print("sweep, an empty pass by table size: "
              + ", ".join(f"{rows} sagas {ms} ms" for rows, ms in sizes.items()))  # fmt: skip
        for due, p in report["sweep"]["passes"].items():
            scan = next((line.strip() for line in p["plan"] if "Scan" in line), "?")
            print(f"sweep, {due} due of {report['sweep']['rows']}: {p['seconds']} s; then an empty pass "
                  f"{p['then_empty_pass_ms_p50']} ms; plan: {scan.split('  (')[0]}")  # fmt: skip
