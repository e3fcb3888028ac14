#!/bin/bash
# The Sia artifact's own simulator, one run per POLICY:FAMILY:N argument (sia, gavel,
# pollux; philly 1-8, saturn 1-10), at the lowest priority, each with run_experiment.sh's
# flags. SIA_SIM: the artifact's sia-simulator/ folder (siasosp23/artifacts), with a venv
# beside it holding its requirements (numpy 1.23, pandas, pymoo 0.4.2.1, cvxpy with CBC
# and ECOS); OUT: where each run's log (POLICY-FAMILY-N.log, for ref_extract.py) and a
# per-round line "t T completed N Average JCT: M" (for pollux_partial.py) go.
set -u
cd "${SIA_SIM:?the artifact's sia-simulator folder}"
OUT=${OUT:-../out}
mkdir -p "$OUT"
for spec in "$@"; do
  pol=${spec%%:*}; rest=${spec#*:}; fam=${rest%%:*}; w=${rest#*:}
  tag=$pol-$fam-$w
  [ -f "$OUT/$tag.done" ] && continue
  case $pol in
    sia) cmd="multi_simulator.py workloads/$fam/workload-$w.csv --policy=sia --policy_p_val=-0.5 --mip_lambda_a=0.01 --mip_lambda_n=1.1 --interval=60 --project_throughput --share_max_replicas --output=$OUT/$tag.log";;
    gavel) cmd="multi_simulator.py workloads/$fam/workload-$w.csv --policy=gavel --interval=360 --output=$OUT/$tag.log";;
    pollux) cmd="multi_simulator_unaware.py workloads/$fam/workload-$w.csv --policy=pollux --interval=60 --policy_p_val=-1 --output=$OUT/$tag.log";;
    *) echo "run_reference: $spec: policy must be sia, gavel or pollux" >&2; exit 2;;
  esac
  start=$(date +%s)
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 ../venv/bin/python -u $cmd 2>&1 | awk '
    /SIMULATOR TIME/ {t=$4}
    /^\{/ {n=gsub(/:/, ":")}
    /Average JCT/ {print "t", t, "completed", n, $0; fflush()}
    /Traceback|Error/ {print; fflush()}' > "$OUT/$tag.txt"
  echo "wall $(( $(date +%s) - start )) s" >> "$OUT/$tag.txt"
  grep "Average JCT" "$OUT/$tag.txt" | tail -1 > "$OUT/$tag.done"
done
