#!/usr/bin/env bash
# One device visit for timing: sections chosen by argument, run in the order given, each under its own
# time limit, everything logged to $OUT/visit.log. Nothing here writes a tracked file.
#   OUT=/tmp/out bash scripts/gpu_visit.sh serving small-bh host
#   OUT=/tmp/out SHAPES=ab TUNINGS=0,100,200 bash scripts/gpu_visit.sh tune
# The acceptance runs (certify, planted faults, Ctrl-C, the perf gate's control) are tests:
#   python3 -m pytest -q tests/test_acceptance_gpu.py                (docs/testing.md)
# kdactl is installed exactly as the README tells an operator (no wheels beyond the image); the carried
# wheels (.whl: fla and its needs) are visible only to the sections that time fla as a peer. fla
# autotunes ~90 s per new head count, so its head counts are warmed in parallel first (bounded: an
# unbounded wait on these once burned a whole visit). docs/reproduce.md says what each section measured.
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.cache/triton KDACTL_DATA_DIR=/tmp/kd \
  KDACTL_CACHE_DIR=$PWD/.cache/kdactl FLA_FLASH_KDA=0
S=/tmp/visit; mkdir -p $S $KDACTL_DATA_DIR
exec > >(tee -a $OUT/visit.log) 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING
chmod -R go-w .cache 2>/dev/null  # kernel caches built here and carried: the cache refuses writable ones
peers() { PYTHONPATH=/tmp/site "$@"; }  # fla and its wheels, for peer timing only
warm=()  # the fla warm-ups still running: nothing is timed beside them
if [ -d .whl ] && [[ " $* " =~ " small-bh "|" serving "|" host "|" fla-tests "|" warm-fla " ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  heads=""  # the head counts the chosen bench sections time fla at
  [[ " $* " =~ " small-bh " ]] && heads+=" 1 4 8"
  [[ " $* " =~ " serving " ]] && heads+=" 12 64 96"
  [[ " $* " =~ " host " ]] && heads+=" 4"
  [[ " $* " =~ " warm-fla " ]] && heads+=" 1 4 8 12 64 96"  # compiled into .cache/triton for a later call
  for h in $(printf "%s\n" $heads | sort -un); do peers timeout 150 python3 scripts/warm_fla.py $h > $S/warm_$h.log 2>&1 & warm+=($!); done
fi
TIMEFORMAT="wall %R s"
wait_warm() { [ ${#warm[@]} -gt 0 ] && { wait "${warm[@]}"; warm=(); }; return 0; }  # before anything timed
echo "== detect"; kdactl detect
echo "== build"; time timeout 200 kdactl build | tail -4

bench() {  # suite name, then extra args: kdactl against fla, a markdown table in $OUT
  local s=$1; shift
  wait_warm; grep -h warmed $S/warm_*.log 2>/dev/null
  [ "$s" = host ] && set -- "$@" || set -- --suite $s "$@"
  time peers timeout 200 kdactl bench --peers fla --markdown $OUT/$s.md --json "$@" > $S/$s.json
  echo rc=$?; cat $OUT/$s.md
}
for section in "$@"; do
  echo "== $section ($(date +%T))"
  case $section in
    warm-fla) ;;  # the warm-ups started above run on beside the next sections
    serving) bench serving --iters 12 --warmup 2 ;;
    small-bh) bench small-bh --iters 5 --warmup 1 ;;
    host) bench host --host --warmup 3 ;;
    host-profile) timeout 120 python3 tools/host_profile.py 2>&1 | grep -v "^$" | head -40 ;;
    boundary)  # two routes (BROUTES) side by side on shapes (BOUNDARY) across their boundary; default direct / chunk
      time timeout 120 kdactl bench ${BOUNDARY:---shape 4,16,8 --shape 4,32,8 --shape 4,64,8 --shape 4,128,8 --shape 4,256,8 \
        --shape 1,64,64 --shape 1,256,64} --routes ${BROUTES:-direct,chunk} --peers none --iters 10 --warmup 2 --markdown $OUT/boundary.md > /dev/null
      cat $OUT/boundary.md ;;
    tune)  # route chunk's recurrence shapes side by side (tools/tune_chunk.py): SHAPES, TUNINGS
      wait_warm
      time timeout ${TUNE_TIMEOUT:-240} python3 tools/tune_chunk.py --shapes ${SHAPES:-serving} \
        --tunings ${TUNINGS:-auto warps=4,stages=8 warps=8,stages=4} ;;
    kernels)  # time per kernel: KERNELS="ROUTE[:warps=W,stages=S] B,T,H ..." (tools/kernel_times.py)
      timeout 100 python3 tools/kernel_times.py ${KERNELS:-chunk 1,8192,64 1,8192,96 2,16384,64 8,4096,12} 2>&1 \
        | grep -E "==|kda_|Self CUDA time total" ;;
    patch-ab)  # this tree's kernels against the same tree with $PATCH applied, built beside it, arms new/patched x2
      wait_warm
      rm -rf /tmp/old && mkdir /tmp/old && cp -r kdactl csrc checks fleet tools pyproject.toml /tmp/old/
      (patch -d /tmp/old -p1 -s < ${PATCH:?PATCH=file}) || { echo "$PATCH did not apply"; continue; }
      old() { PYTHONPATH=/tmp/old KDACTL_CACHE_DIR=${OLDCACHE:-/tmp/oldcache} "$@"; }  # OLDCACHE: a carried build
      time old timeout 200 kdactl build | tail -2
      for arm in new patched new patched; do
        [ $arm = new ] && run=() || run=(old)
        [ $arm = new ] && dir=. || dir=/tmp/old
        echo "-- $arm"; "${run[@]}" timeout 100 python3 $dir/tools/tune_chunk.py --shapes ${SHAPES:-serving} \
          --tunings ${TUNINGS:-auto} --iters 10
      done ;;
    warm-starts)  # route small_bh's warm starts, varlen units and state pools: their tests, then each gate draw
      time timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/test_kda_small_bh_gpu.py tests/test_kda_fused_gpu.py \
        tests/test_kda_serving_gpu.py checks/test_routes.py -p no:cacheprovider --durations=5 --junitxml=$OUT/warm.xml \
        -o junit_logging=system-out 2>&1 | grep -vE "^(tests|checks|\s)" | tail -25
      python3 tools/error_ratios.py $OUT/warm.xml 2>/dev/null | tail -2
      for draw in flashkda test init; do
        time timeout 150 kdactl bench --suite production --gate-params $draw --routes auto,chunk,small_bh --peers ${WPEERS:-cudnn} \
          --iters 6 --warmup 1 --markdown $OUT/production_$draw.md > /dev/null; cat $OUT/production_$draw.md
      done ;;
    gate-ab)  # the serving configurations' kernels: this tree against HEAD's, copied to .old with its build in .old/cache
      for cfg in ${CONFIGS:-plain bound softplus}; do for gates in ${GATES:-test init}; do
        [ $cfg = plain ] && [ $gates = init ] && continue
        for arm in new old; do
          [ $arm = new ] && pre=() || pre=(env PYTHONPATH=$PWD/.old KDACTL_CACHE_DIR=$PWD/.old/cache)
          echo "-- $arm"; "${pre[@]}" timeout 100 python3 tools/kernel_times.py --config $cfg --gates $gates ${GROUTE:-chunk} \
            ${GSHAPES:-1,8192,64} 2>&1 | grep -E "==|kda_|Self CUDA|Error|error"
        done
      done; done ;;
    ncu)  # every counter of the chunk route's kernels at B1 T8192 H96, with the source view
      timeout 200 ncu --clock-control none --set full --import-source yes -k regex:"${NCU_KERNELS:-kda_chunk_(prepare|recur)}" \
        --launch-skip 2 --launch-count 2 -f -o $OUT/chunk python3 -c "
from kdactl.kda import prefill; from kdactl.kda.inputs import random_inputs
x,_,_ = random_inputs(1, 8192, 96, device='cuda')
for _ in range(3): prefill(**x, route='chunk')" > $S/ncu.log 2>&1; echo "ncu rc=$?"; tail -2 $S/ncu.log
      ncu -i $OUT/chunk.ncu-rep --page details > $OUT/ncu_details.txt 2>&1; grep -E "^  [a-z_]+|Duration|Registers|Achieved Occ|Theoretical Occ|Issue Slots Busy|L1/TEX Hit|Mem Busy|Max Bandwidth|DRAM Throughput" $OUT/ncu_details.txt | head -40 ;;
    error-ratios)  # the kernel tests' error ratios against the fp64 reference (TESTS: the files)
      files=${TESTS:-"tests/test_kda_gpu.py tests/test_kda_chunk_gpu.py tests/test_kda_small_bh_gpu.py tests/test_kda_serving_gpu.py tests/test_kda_fused_gpu.py"}
      time timeout ${TESTS_TIMEOUT:-320} python3 -m pytest -q -m gpu $files -p no:cacheprovider --junitxml=$OUT/kernels.xml \
        -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -25
      python3 tools/error_ratios.py $OUT/kernels.xml 2>/dev/null | tail -2 ;;
    fla-tests)  # fla's own tests/ops/test_kda.py (copied into the ignored .fla_tests) against kdactl.kda.chunk_kda (its decode tests call fla's own kernels: deselected)
      cp scripts/fla_tests/conftest.py .fla_tests/conftest.py
      (cd .fla_tests && peers timeout 300 python3 -m pytest -q -k "(test_chunk or test_fused_recurrent) and not vllm_decode" test_kda.py -p no:cacheprovider -rs \
        --junitxml=$OUT/fla_tests.xml -o junit_logging=system-out 2>&1 | grep -vE "^\s*$" | tail -30) ;;
    baseline)  # a perf baseline for this node's SKU, into $OUT (review it, then commit it to fleet/baselines/)
      wait_warm
      sku=$(kdactl detect --json | python3 -c "import json,sys;print(json.load(sys.stdin)['gpus'][0]['sku'])")
      timeout 60 kdactl bench --suite smoke --peers none --iters 8 --record-baseline --baseline $OUT/$sku.toml > /dev/null
      echo "record rc=$?"; cat $OUT/$sku.toml ;;
    cold-build)  # a cold build of one target on this node's cores (no cache entry): wall time, the slowest units
      cb=$(mktemp -d); chmod 700 $cb; echo "$(nproc) cores"
      time KDACTL_CACHE_DIR=$cb timeout 300 kdactl build --target ${CB_TARGET:-sm_90a} --json > $S/cold_build.json; echo rc=$?
      find $cb -name .ninja_log -exec sort -t$'\t' -k2,2n {} \; | awk -F'\t' 'NR>1 {printf "%6.1f s %s\n", ($2-$1)/1000, $4}' | sort -rn | head -5
      rm -rf $cb ;;
    gate-time)  # kdactl gate's wall time (tools/bench_gate.py: fresh process, median of 20): this node's
      # certificate (a --quick one), the fake 8-GPU one, and both node-signed
      [ -f /tmp/kd/cert.json ] || { timeout 120 kdactl certify --quick --expect-gpus 1 --out /tmp/kd/cert.json > $S/gt.out 2>&1
                                    echo "certify --quick rc=$?"; }
      timeout 120 python3 tools/bench_gate.py -n 20
      timeout 120 python3 tools/bench_gate.py --fake -n 20
      if python3 -c "import cryptography" 2>/dev/null; then
        timeout 120 python3 tools/bench_gate.py --fake --signed -n 20
        rm -rf $S/gs; mkdir -p $S/gs  # a key for this node, a signed --quick certificate in its own data dir
        kdactl keygen --out $S/gs/node.pem > $S/gs/trusted-keys; echo "keygen rc=$?"
        KDACTL_DATA_DIR=$S/gs timeout 120 kdactl certify --quick --expect-gpus 1 --signing-key $S/gs/node.pem \
          --out $S/gs/cert.json > $S/gs/certify.out 2>&1; echo "signed certify --quick rc=$?"
        KDACTL_DATA_DIR=$S/gs KDACTL_TRUSTED_KEYS=$S/gs/trusted-keys timeout 120 python3 tools/bench_gate.py -n 20
      else
        echo "cryptography is not on this image (pip install 'kdactl[signing]'): the signed gate not timed"
      fi ;;
    *) echo "unknown section $section" ;;
  esac
done
