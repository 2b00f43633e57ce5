#!/usr/bin/env bash
# Benchmark of the lab bring-up (docs/benchmarks.md, section "Lab bring-up").
#   lab/bench_lab.sh            (or: make -f lab/lab.mk lab-bench)
# For N in $BENCH_NODES (default "2 16"): from a down lab, time
# `make -f lab/lab.mk lab-up LAB_NODES=N` ($RUNS times, default 3), then time
# the no-op second lab-up and lab-down; measure the memory of an idle node
# (sum of RSS and PSS of every process in the node's netns, i.e. its sshd)
# and the PSS of all nodes together. Prints a Markdown table.
# Leaves the lab DOWN.
set -euo pipefail
LAB_DIR=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
MK="make --no-print-directory -f $LAB_DIR/lab.mk"
RUNS=${RUNS:-3}
BENCH_NODES=${BENCH_NODES:-2 16}

[ "$(id -u)" = 0 ] || { echo "bench_lab.sh: must run as root" >&2; exit 1; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# "<rss_kb> <pss_kb> <nprocs>" of the processes in netns $1
node_mem() {
    local rss=0 pss=0 n=0 pid r p
    for pid in $(ip netns pids "$1"); do
        r=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
        p=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
        rss=$((rss + ${r:-0})); pss=$((pss + ${p:-0})); n=$((n + 1))
    done
    echo "$rss $pss $n"
}

echo "# lab bring-up benchmark: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, kernel $(uname -r)"
echo
echo "| nodes | lab-up from down (median of $RUNS) | runs | second lab-up (no-op) | lab-down | idle node RSS | idle node PSS | PSS, all nodes |"
echo "|---|---|---|---|---|---|---|---|"
$MK lab-down >/dev/null
for n in $BENCH_NODES; do
    ups=()
    for r in $(seq "$RUNS"); do
        t0=$(now); $MK lab-up LAB_NODES="$n" >/dev/null; t1=$(now)
        ups+=("$(elapsed "$t0" "$t1")")
        if [ "$r" = "$RUNS" ]; then
            t0=$(now); $MK lab-up LAB_NODES="$n" >/dev/null; t1=$(now); noop=$(elapsed "$t0" "$t1")
            rss_max=0; pss_max=0; pss_all=0
            for i in $(seq "$n"); do
                read -r rss pss _ < <(node_mem "spark$i")
                [ "$rss" -gt "$rss_max" ] && rss_max=$rss
                [ "$pss" -gt "$pss_max" ] && pss_max=$pss
                pss_all=$((pss_all + pss))
            done
        fi
        t0=$(now); $MK lab-down >/dev/null; t1=$(now); down=$(elapsed "$t0" "$t1")
    done
    med=$(echo "${ups[*]}" | median)
    printf '| %s | %s s | %s | %s s | %s s | %.1f MB | %.1f MB | %.1f MB |\n' \
        "$n" "$med" "${ups[*]}" "$noop" "$down" \
        "$(awk -v k="$rss_max" 'BEGIN { print k / 1024 }')" \
        "$(awk -v k="$pss_max" 'BEGIN { print k / 1024 }')" \
        "$(awk -v k="$pss_all" 'BEGIN { print k / 1024 }')"
done
echo
echo "Idle node = its sshd only (largest node reported). Times include make and the lab-deps check."
