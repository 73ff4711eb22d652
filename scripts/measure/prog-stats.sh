#!/bin/bash
# Sourced: prog_stats PID prints, for each BPF program the process holds
# (with kernel.bpf_stats_enabled=1 while it ran), its type, id, tag, runs,
# ns per run and total ms, one line per program.
prog_stats() {
  for f in /proc/"$1"/fdinfo/*; do
    if grep -q prog_type "$f" 2>/dev/null; then
      awk '/prog_type|prog_tag|run_time_ns|run_cnt|prog_id/{printf "%s %s ", $1, $2} END{print ""}' "$f"
    fi
  done | awk '{delete v; for(i=1;i<NF;i+=2)v[$i]=$(i+1); if (v["run_cnt:"]>0) printf "type %s id %s tag %s runs %d ns/run %.0f total_ms %.1f\n", v["prog_type:"], v["prog_id:"], v["prog_tag:"], v["run_cnt:"], v["run_time_ns:"]/v["run_cnt:"], v["run_time_ns:"]/1e6}' | sort -u
}
