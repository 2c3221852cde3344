#!/usr/bin/env bash
# One device visit, sections chosen by argument and run in the order given, each under its own time
# limit, everything logged to $OUT/visit.log:
#   bash scripts/gpu_visit.sh tests certify faults baseline small-bh serving
#   (sections used for issues 15-16: truth interrupt healthy host fused host-profile serving-tests fla-tests)
#   bash scripts/gpu_visit.sh certify gate-time   # kdactl gate's wall time, plain and node-signed
# kdactl is installed exactly as the README tells an operator (no wheels beyond the image); the
# carried wheels (.whl: fla and its needs) are visible only to the sections that time fla as a peer.
# fla autotunes ~90 s per new head count, so its head counts are warmed in parallel first (bounded:
# an unbounded wait on these once burned a whole visit).
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.cache/triton KDACTL_DATA_DIR=/tmp/kd \
  KDACTL_CACHE_DIR=$PWD/.cache/kdactl FLA_FLASH_KDA=0
S=/tmp/visit; mkdir -p $S $KDACTL_DATA_DIR
exec > >(tee -a $OUT/visit.log) 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING
chmod -R go-w .cache .wip 2>/dev/null  # kernel caches built here and carried: the cache refuses writable ones
python3 -c "import cupti" 2>/dev/null && echo "NOTE: cupti-python is on this image" || echo "cupti-python: not installed (as on the image)"
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

summary() {  # a certificate: verdict, reason, and each result
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d['verdict'], '|', d['reason'][:400]);[print(' ', r.get('gpu'), r['check'], r.get('status'), r.get('duration_s'), r.get('timer') or '', str(r.get('message',''))[:160]) for r in d['results'] if sys.argv[2:] == [] or r['check'].startswith(tuple(sys.argv[2:]))]" "$@"
}
certify_full() {  # name, then env assignments for the run
  local n=$1; shift
  wait_warm  # no fla warm-up beside certify's perf stage
  (s0=$SECONDS; env "$@" timeout 200 kdactl certify --expect-gpus 1 --expect-sku H200 --out $S/$n.json --json > $S/$n.out 2>$S/$n.err
   echo "certify $n rc=$? ($((SECONDS-s0)) s)"); cp $S/$n.json $OUT/$n.json 2>/dev/null; summary $S/$n.json perf health
}

bench() {  # suite name, then extra args
  local s=$1; shift
  wait_warm
  [ "$s" = host ] && set -- "$@" || set -- --suite $s "$@"
  time peers timeout 200 kdactl bench --peers fla --markdown $OUT/$s.md --json "$@" > $S/$s.json
  echo rc=$?; cat $OUT/$s.md
}
for section in "$@"; do
  echo "== $section ($(date +%T))"
  case $section in
    truth)  # issue 15: healthy, busy (a real co-tenant, then the fault), slow
      certify_full healthy
      python3 -c "import torch,time;a=torch.randn(8192,8192,device='cuda');print('cotenant up',flush=True)
while True: a=(a@a).clamp_(-1,1)" > $S/cotenant.log 2>&1 & ct=$!
      sleep 8; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
      certify_full busy-cotenant; kill $ct; wait $ct 2>/dev/null
      certify_full fault-slow KDACTL_FAULT=slow
      certify_full fault-busy KDACTL_FAULT=busy ;;
    healthy) certify_full healthy ;;
    fused)  # issue 16: the fused transforms, grouped values, state pool and chunk route on the GPU, then certify --quick
      s0=$SECONDS
      timeout 150 python3 -m pytest -q -m gpu tests/test_kda_fused_gpu.py tests/test_kda_chunk_gpu.py -p no:cacheprovider \
        --junitxml=$OUT/gpu.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -25
      echo "tests took $((SECONDS-s0)) s"; python3 scripts/error_ratios.py $OUT/gpu.xml 2>/dev/null | tail -2
      s0=$SECONDS; timeout 90 kdactl certify --quick --expect-gpus 1 --out $S/q.json > $S/q.out 2>&1
      echo "certify --quick rc=$? ($((SECONDS-s0)) s)"; summary $S/q.json suite sanitize ;;
    host-profile) timeout 120 python3 scripts/host_profile.py 2>&1 | grep -v "^$" | head -40 ;;
    host-tests)  # issue 16: kdactl_host on the GPU, and the op tests through it
      time timeout 200 python3 -m pytest -q -m gpu tests/test_kda_serving_gpu.py tests/test_kda_gpu.py -p no:cacheprovider \
        -k "kdactl_host or graph or workspace or compile or stream or varlen or pool" --junitxml=$OUT/host.xml \
        -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -30 ;;
    fla-tests)  # issue 16: fla's own tests/ops/test_kda.py (copied into the ignored .fla_tests) against kdactl.kda.chunk_kda
      cp scripts/fla_tests/conftest.py .fla_tests/conftest.py
      (cd .fla_tests && peers timeout 300 python3 -m pytest -q -k "test_chunk" test_kda.py -p no:cacheprovider -rs \
        --junitxml=$OUT/fla_tests.xml -o junit_logging=system-out 2>&1 | grep -vE "^\s*$" | tail -30) ;;
    serving-tests)  # issue 16: fp16 inputs, V-first states, checkpoints, the drop-in's intermediate states
      time timeout 200 python3 -m pytest -q -m gpu tests/test_kda_serving_gpu.py tests/test_kda_fused_gpu.py -p no:cacheprovider \
        --junitxml=$OUT/serving.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -30
      python3 scripts/error_ratios.py $OUT/serving.xml 2>/dev/null | tail -2 ;;
    interrupt)  # Ctrl-C (SIGINT to kdactl) mid-run: exit 3 "interrupted", the old certificate kept, no worker left
      [ -f $S/healthy.json ] || timeout 120 kdactl certify --quick --out $S/healthy.json > /dev/null 2>&1
      cp $S/healthy.json $S/keep.json; s0=$SECONDS
      timeout --preserve-status -s INT 25 kdactl certify --expect-gpus 1 --out $S/keep.json > $S/int.out 2> $S/int.err
      echo "interrupted certify rc=$? ($((SECONDS-s0)) s)"; tail -1 $S/int.err
      cmp -s $S/keep.json $S/healthy.json && echo "old certificate kept" || echo "CERTIFICATE CHANGED"
      sleep 1; echo "compute processes left: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
      [ "$(python3 -c "import json;print(json.load(open('$S/healthy.json'))['scope'])")" = full ] &&
        { kdactl gate --cert $S/healthy.json; echo "gate on the healthy certificate rc=$?"; } ;;
    bench-tests) time timeout 200 python3 -m pytest -q -m gpu tests/test_bench_gpu.py -p no:cacheprovider 2>&1 | tail -5 ;;
    tests) time timeout 300 python3 -m pytest -q -m gpu tests -p no:cacheprovider --maxfail=25 --junitxml=$OUT/gpu.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -40 ;;
    certify)
      time timeout 180 kdactl certify --expect-gpus 1 --expect-sku H200 --out /tmp/kd/cert.json \
        --junit $OUT/certify.xml --prom $OUT/kdactl.prom --json > $OUT/certify.json; echo certify rc=$?
      cp /tmp/kd/cert.json $OUT/cert.json
      python3 -c "import json;d=json.load(open('$OUT/cert.json'));print(d['verdict'], d['reason']);[print(r.get('gpu'), r['check'], r.get('status'), r.get('duration_s'), str(r.get('message',''))[:150]) for r in d['results']]"
      time kdactl gate; echo gate rc=$?
      kdactl verify /tmp/kd/cert.json; echo verify rc=$?
      python3 -c "p='/tmp/kd/cert.json';b=bytearray(open(p,'rb').read());i=b.index(b'H200');b[i+3]^=1;open('$S/t.json','wb').write(b)"
      kdactl verify $S/t.json; echo "one-byte-changed verify rc=$?"
      ;;
    gate-time)  # kdactl gate's wall time on the H200 (bench_gate.py: fresh process, median of 20): this node's
      # certificate (the certify section's, else a --quick one), the fake 8-GPU one, and both node-signed
      [ -f /tmp/kd/cert.json ] || { timeout 120 kdactl certify --quick --expect-gpus 1 --out /tmp/kd/cert.json > $S/gt.out 2>&1
                                    echo "certify --quick rc=$?"; }
      timeout 120 python3 scripts/bench_gate.py -n 20
      timeout 120 python3 scripts/bench_gate.py --fake -n 20
      if python3 -c "import cryptography" 2>/dev/null; then
        timeout 120 python3 scripts/bench_gate.py --fake --signed -n 20
        rm -rf $S/gs; mkdir -p $S/gs  # a key for this node, a signed --quick certificate in its own data dir
        kdactl keygen --out $S/gs/node.pem > $S/gs/trusted-keys; echo "keygen rc=$?"
        KDACTL_DATA_DIR=$S/gs timeout 120 kdactl certify --quick --expect-gpus 1 --signing-key $S/gs/node.pem \
          --out $S/gs/cert.json > $S/gs/certify.out 2>&1; echo "signed certify --quick rc=$?"
        KDACTL_DATA_DIR=$S/gs KDACTL_TRUSTED_KEYS=$S/gs/trusted-keys timeout 120 python3 scripts/bench_gate.py -n 20
      else
        echo "cryptography is not on this image (pip install 'kdactl[signing]'): the signed gate not timed"
      fi ;;
    faults)
      # wait on these PIDs only: a bare `wait` also waits for the log's tee and never returns
      pids=(); for f in wrong-result:direct wrong-result:chunk wrong-result:small_bh sanitizer hang crash; do
        (s0=$SECONDS; KDACTL_FAULT=$f timeout 120 kdactl certify --quick --out $S/f_${f//:/_}.json --json > $S/f_${f//:/_}.out 2>&1; echo "fault $f rc=$? ($((SECONDS-s0)) s)") &
        pids+=($!)
      done; wait "${pids[@]}"
      for f in $S/f_*.json; do python3 -c "import json;d=json.load(open('$f'));print('$f', d['verdict'], d['reason'][:300])"; done ;;
    warm-fla) ;;  # the warm-ups started above run on beside the next sections
    baseline)
      wait_warm
      timeout 60 kdactl bench --suite smoke --peers none --iters 8 --record-baseline --baseline fleet/baselines/H200.toml > /dev/null; echo record rc=$?
      cp fleet/baselines/H200.toml $OUT/H200.toml
      python3 -c "import re;t=open('fleet/baselines/H200.toml').read();open('$S/fast.toml','w').write(re.sub(r'median_ms = ([0-9.eE+-]+)',lambda m:f'median_ms = {float(m[1])/2!r}',t))"
      timeout 60 kdactl bench --suite smoke --peers none --iters 8 --gate --baseline $S/fast.toml | tail -3; echo "2x-faster gate rc=$?" ;;
    tune) time timeout 150 python3 scripts/tune_chunk.py ;;
    kernel-tests)  # every kernel route's GPU tests (both chunk paths), error ratios kept in the JUnit file
      files=${TESTS:-"tests/test_kda_gpu.py tests/test_kda_chunk_gpu.py tests/test_kda_small_bh_gpu.py tests/test_kda_serving_gpu.py tests/test_kda_fused_gpu.py"}
      time timeout ${TESTS_TIMEOUT:-320} python3 -m pytest -q -m gpu $files -p no:cacheprovider --durations=5 \
        --junitxml=$OUT/kernels.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -25
      python3 scripts/error_ratios.py $OUT/kernels.xml 2>/dev/null | tail -2 ;;
    patch-ab)  # this tree's kernels against the same tree with $PATCH applied, built beside it, arms new/patched x2
      wait_warm
      rm -rf /tmp/old && mkdir /tmp/old && cp -r kdactl csrc checks fleet scripts pyproject.toml /tmp/old/
      (patch -d /tmp/old -p1 -s < ${PATCH:?PATCH=file}) || { echo "$PATCH did not apply"; continue; }
      old() { PYTHONPATH=/tmp/old KDACTL_CACHE_DIR=${OLDCACHE:-/tmp/oldcache} "$@"; }  # OLDCACHE: a carried build
      time old timeout 200 kdactl build | tail -2
      for arm in new patched new patched; do
        [ $arm = new ] && run=() || run=(old)
        [ $arm = new ] && dir=. || dir=/tmp/old
        echo "-- $arm"; "${run[@]}" timeout 100 python3 $dir/scripts/tune_chunk.py --shapes ${SHAPES:-serving} \
          --tunings ${TUNINGS:-auto} --iters 10
      done ;;
    kernels-chunk)  # per-kernel times of route chunk on the fixed-length serving shapes
      for t in ${KTUNINGS:-auto}; do timeout 100 python3 scripts/kernel_times.py chunk:$t 1,8192,64 1,8192,96 2,16384,64 8,4096,12 2>&1 \
        | grep -E "==|kda_chunk|Self CUDA time total"; done ;;
    chunk-tests) time timeout 200 python3 -m pytest -q -m gpu tests/test_kda_chunk_gpu.py -p no:cacheprovider --durations=8 \
        --junitxml=$OUT/chunk.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -30 ;;
    kda-tests)  # every KDA op test against the reference, with the error ratios kept in the JUnit file
      time timeout 300 python3 -m pytest -q -m gpu tests/test_kda_gpu.py tests/test_kda_chunk_gpu.py -p no:cacheprovider \
        --junitxml=$OUT/kda.xml -o junit_logging=system-out 2>&1 | tail -4
      rc=${PIPESTATUS[0]}; python3 scripts/error_ratios.py $OUT/kda.xml | tail -1
      if [ "$rc" != 0 ] && [ -d .fallback ]; then echo "FELL BACK to .fallback"; cp .fallback/* csrc/; kdactl build | tail -2; fi ;;
    quick) time timeout 90 kdactl certify --quick --expect-gpus 1 --out $S/quick.json > /dev/null; echo quick rc=$?; summary $S/quick.json suite sanitize ;;
    chunk-tests-or-fallback)  # a kernel change never measured before: on failure, certify the last good one
      timeout 200 python3 -m pytest -q -m gpu tests/test_kda_chunk_gpu.py -p no:cacheprovider -x --junitxml=$OUT/chunk.xml -o junit_logging=system-out 2>&1 | tail -4
      if [ "${PIPESTATUS[0]}" != 0 ] && [ -d .fallback ]; then
        echo "FELL BACK to .fallback"; cp .fallback/* csrc/; kdactl build | tail -2
      fi ;;
    boundary) time timeout 90 kdactl bench --shape 4,16,8 --shape 4,32,8 --shape 4,64,8 --shape 4,128,8 \
        --shape 4,256,8 --shape 1,64,64 --shape 1,256,64 --routes direct,chunk --peers none --iters 10 --warmup 2 \
        --markdown $OUT/boundary.md > /dev/null; cat $OUT/boundary.md ;;
    op-tests) time timeout 120 python3 -m pytest -q -m gpu tests/test_kda_gpu.py -p no:cacheprovider \
        --junitxml=$OUT/op.xml -o junit_logging=system-out \
        -k "graph or workspace or compile or stream or device or batched or varlen or extreme" 2>&1 | tail -5 ;;
    ncu) time timeout 150 ncu -k regex:kda_chunk --launch-skip ${NCU_SKIP:-2} --launch-count ${NCU_COUNT:-2} --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --metrics smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_no_instructions \
        python3 -c "
from kdactl.kda import prefill; from kdactl.kda.inputs import random_inputs
x,_,_ = random_inputs(1, 8192, 64, device='cuda')
for _ in range(3): prefill(**x, route='chunk')" > $OUT/ncu.txt 2>&1; echo rc=$?; grep -E "^  [a-z_]+|Duration|Stall|stalled|Throughput|Achieved Occ|Registers|Warp Cycles|Eligible|Issued Warp|Pipe|Ipc|Issue Slots|SM Busy|Executed Instructions" $OUT/ncu.txt | head -120 ;;
    ncu-src)  # issue 17: every counter of the two-kernel path's kernels at B1 T8192 H96, with the source view
      timeout 200 ncu --clock-control none --set full --import-source yes -k regex:"kda_chunk_(prepare|recur)" \
        --launch-skip 2 --launch-count 2 -f -o $OUT/chunk python3 -c "
from kdactl.kda import prefill; from kdactl.kda.inputs import random_inputs
x,_,_ = random_inputs(1, 8192, 96, device='cuda')
for _ in range(3): prefill(**x, route='chunk')" > $S/ncu.log 2>&1; echo "ncu rc=$?"; tail -2 $S/ncu.log
      ncu -i $OUT/chunk.ncu-rep --page details > $OUT/ncu_details.txt 2>&1; grep -E "^  [a-z_]+|Duration|Registers|Achieved Occ|Theoretical Occ|Issue Slots Busy|L1/TEX Hit|Mem Busy|Max Bandwidth|DRAM Throughput" $OUT/ncu_details.txt | head -40
      ncu -i $OUT/chunk.ncu-rep --page source --csv --print-source sass > $S/src.csv 2>&1; gzip -c $S/src.csv > $OUT/ncu_src.csv.gz; wc -c $S/src.csv ;;
    small-bh) grep -h warmed $S/warm_*.log; bench small-bh --iters 5 --warmup 1 ;;
    host) grep -h warmed $S/warm_*.log; bench host --host --warmup 3 ;;
    serving) grep -h warmed $S/warm_*.log; bench serving --iters 12 --warmup 2 ;;
    sbh-tests) time timeout 300 python3 -m pytest -q -m gpu tests/test_kda_small_bh_gpu.py tests/test_kda_chunk_gpu.py \
        -p no:cacheprovider --durations=6 --junitxml=$OUT/sbh.xml -o junit_logging=system-out 2>&1 | grep -vE "^(tests|\s)" | tail -30
      python3 scripts/error_ratios.py $OUT/sbh.xml | grep -E "small_bh|^max" ;;
    kernels-sbh) timeout 100 python3 scripts/kernel_times.py small_bh 1,65536,8 1,131072,1 1,1048576,1 2>&1 | grep -E "==|kda|Self CUDA time total" ;;
    boundary-sbh) time timeout 120 kdactl bench --shape 1,8192,16 --shape 1,8192,21 --shape 1,8192,24 --shape 1,8192,32 --shape 1,4096,8 --shape 1,2048,2 \
        --shape 1,1024,1 --shape 2,8192,8 --routes chunk,small_bh --peers none --iters 10 --warmup 2 \
        --markdown $OUT/boundary_sbh.md > /dev/null; cat $OUT/boundary_sbh.md ;;
    gate-ab)  # the serving configurations' kernels: this tree against HEAD's, copied to .old with its build in .old/cache
      for cfg in ${CONFIGS:-plain bound softplus}; do for gates in ${GATES:-test init}; do
        [ $cfg = plain ] && [ $gates = init ] && continue
        for arm in new old; do
          [ $arm = new ] && pre=() || pre=(env PYTHONPATH=$PWD/.old KDACTL_CACHE_DIR=$PWD/.old/cache)
          echo "-- $arm"; "${pre[@]}" timeout 100 python3 scripts/kernel_times.py --config $cfg --gates $gates ${GROUTE:-chunk} \
            ${GSHAPES:-1,8192,64} 2>&1 | grep -E "==|kda_|Self CUDA|Error|error"
        done
      done; done ;;
    *) echo "unknown section $section" ;;
  esac
done
