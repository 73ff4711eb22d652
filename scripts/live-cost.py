#!/usr/bin/env python3
"""Do `serve` and `top` cost the target what `record` does in the same mode?

Runs fixtures/locks.c (CPU-bound: THREADS threads taking g_lock and their
own heap mutex ITERS times each, printing its elapsed time) untraced and
under `record`, `serve` and `top` (stdout a file), in --mode all and
--mode contention, alternating, and prints per configuration the median
throughput (lock calls/s of the fixture), slowdown against untraced, and the
tracer's CPU time. Run as root after `cargo build` (uses target/debug and
target/fixtures/locks-glibc, which the tests build).

usage: scripts/live-cost.py [RUNS] [THREADS] [ITERS] [MODES, default all,contention]
"""
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCKTRACE = os.path.join(ROOT, "target/debug/locktrace")
FIXTURE = os.path.join(ROOT, "target/fixtures/locks-glibc")
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def run_once(tool, mode, threads, iters):
    fixture = subprocess.Popen(
        [FIXTURE, str(threads), str(iters), str(iters)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    while fixture.stdout.readline().strip() != "ready":
        pass
    tracer = None
    if tool != "none":
        args = {"record": ["record", "--json", "/dev/null"],
                "serve": ["serve", "--listen", f"127.0.0.1:{free_port()}"],
                "top": ["top"]}[tool]
        tracer = subprocess.Popen(
            [LOCKTRACE, *args, "--pid", str(fixture.pid), "--mode", mode],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while " live after " not in tracer.stderr.readline():
            if tracer.poll() is not None:
                sys.exit(f"{tool} exited before it was live")
    fixture.stdin.write("go\n")
    fixture.stdin.flush()
    done = fixture.stdout.readline().split()  # done COUNTER elapsed_ns NS
    elapsed = int(done[3]) / 1e9
    cpu = cpu_seconds(tracer.pid) if tracer else 0.0
    fixture.wait()
    if tracer:
        # Only the tracer this script started, by its pid.
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)
        tracer.wait()
    calls = threads * iters * 2
    return calls / elapsed, cpu


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 300_000
    modes = sys.argv[4].split(",") if len(sys.argv) > 4 else ["all", "contention"]
    configs = [("none", "-")] + [(t, m) for m in modes
                                 for t in ("record", "serve", "top")]
    results = {c: [] for c in configs}
    for _ in range(runs):
        for tool, mode in configs:
            results[(tool, mode)].append(run_once(tool, mode, threads, iters))
    base = statistics.median(r[0] for r in results[("none", "-")])
    print(f"fixture: locks {threads} threads x {iters} x 2 lock calls; "
          f"median of {runs} runs")
    print(f"{'tool':<8} {'mode':<11} {'calls/s':>12} {'vs untraced':>12} {'tracer CPU s':>13}")
    for (tool, mode), values in results.items():
        rate = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"{tool:<8} {mode:<11} {rate:>12.0f} {rate / base:>11.2f}x {cpu:>13.2f}")


if __name__ == "__main__":
    main()
