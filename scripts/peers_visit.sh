#!/usr/bin/env bash
# One device visit that times kdactl against its peers (fla, FlashKDA, cuDNN) in the serving
# configurations: bash scripts/peers_visit.sh, from the repository root, with $OUT set.
# Needs the ignored .peers/ folder beside the sources (wheels, FlashKDA + CUTLASS sources, the build
# script; .peers/README.md says what is there). Everything goes to /tmp and $OUT; no tracked file is
# written. In parallel first: the wheels into /tmp/site, FlashKDA's build (its log kept), kdactl's
# build, and fla's Triton warm-ups per head count and configuration (bounded: each under a timeout);
# then kimi-linear (fla only: needs no FlashKDA), then production and small-bh (lower-bound) with every
# peer. A suite cut by its time limit still writes the shapes it finished (kdactl bench on SIGTERM).
# Env: ITERS (12), WARMUP (2), SUITES ("kimi-linear production small-bh"), GATE_PARAMS (test: fla's
#      draw; flashkda: every channel decays fast, where cuDNN's pieces start warm), WARM_TIMEOUT (180 s),
#      FLASHKDA_TIMEOUT (360 s), BENCH_TIMEOUT (260 s per suite), PEERS ("fla-chunk,flashkda,cudnn": the
#      peers timed in production and small-bh, as docs/reproduce.md gives them; fla-chunk is fla's
#      chunk_kda, fla adds its fused_recurrent_kda; without flashkda its 121 s build is skipped, without
#      fla or fla-chunk the warm-ups and kimi-linear's fla column). On an H100 (2026-12-06) production
#      with the three peers took 150 s to over 200 s at ITERS=3 (one visit stopped at 200 s after 17 of
#      its 20 shapes); on 2026-12-07, with fla's recurrent kernel timed too (16-83 ms a call there), 4
#      shapes in 200 s; kimi-linear with fla about 130 s, small-bh 60 s: one visit of all three at
#      ITERS=3 can pass a call's 600 s, so split it by SUITES. With cuDNN alone, small-bh and production
#      took 121 s.
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0 TRITON_CACHE_DIR=/tmp/triton KDACTL_DATA_DIR=/tmp/kd \
  KDACTL_CACHE_DIR=${KDACTL_CACHE_DIR:-$PWD/.cache/kdactl}
ITERS=${ITERS:-12} WARMUP=${WARMUP:-2} SUITES=${SUITES:-"kimi-linear production small-bh"} GP=${GATE_PARAMS:-test}
PEERS=${PEERS:-fla-chunk,flashkda,cudnn}
has_peer() { [[ ",$PEERS," == *",$1,"* ]]; }
# fla's peer among PEERS (fla, fla-chunk or none), for the warm-ups and kimi-linear's column
fla_peer() { if has_peer fla; then echo fla; elif has_peer fla-chunk; then echo fla-chunk; else echo none; fi; }
S=/tmp/peers_visit SITE=/tmp/site
mkdir -p $S $SITE $KDACTL_DATA_DIR
exec > >(tee -a $OUT/peers_visit.log) 2>&1
t0=$SECONDS; stamp() { echo "== $* (+$((SECONDS - t0)) s)"; }
[ -d .peers/whl ] || { echo "no .peers/ here: copy it beside the sources first"; exit 2; }
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING
chmod -R go-w .cache 2>/dev/null  # a carried kernel cache: the cache refuses writable ones
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .peers/whl/*.whl 2>&1 | grep -v WARNING
peers() { PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} "$@"; }

stamp "background: FlashKDA build, kdactl build, fla warm-ups"
if ! has_peer flashkda; then
  (echo "flashkda: not among PEERS=$PEERS" | tee $OUT/flashkda_build.log) & fk=$!
elif ls $SITE/flash_kda_C*.so > /dev/null 2>&1; then  # a warm machine's earlier visit built it
  (echo "flashkda: the build already in $SITE" | tee $OUT/flashkda_build.log) & fk=$!
else
  (s0=$SECONDS; timeout ${FLASHKDA_TIMEOUT:-360} bash .peers/build_flashkda.sh $SITE > $OUT/flashkda_build.log 2>&1
   echo "flashkda build rc=$? ($((SECONDS - s0)) s)" | tee -a $OUT/flashkda_build.log) & fk=$!
fi
(timeout 200 kdactl build > $S/kdactl_build.log 2>&1; echo "kdactl build rc=$?" >> $S/kdactl_build.log) & kb=$!
warm=()
if [ $(fla_peer) != none ]; then
  for entry in ${WARM:-4:softplus 8:softplus 16:softplus 32:softplus 12:lower-bound 16:lower-bound 24:lower-bound 64:lower-bound 96:lower-bound 8:lower-bound 4:lower-bound 1:lower-bound}; do
    peers timeout ${WARM_TIMEOUT:-180} python3 scripts/warm_fla.py $entry > $S/warm_${entry/:/_}.log 2>&1 & warm+=($!)
  done
fi
wait $kb; tail -3 $S/kdactl_build.log
if [ ${#warm[@]} -gt 0 ]; then  # (a bare wait would also wait for FlashKDA's build)
  wait "${warm[@]}"; stamp "fla warmed"; cat $S/warm_*.log | grep -E "warmed|Error|error" | tail -20
fi

bench() {  # suite, then kdactl bench's extra arguments
  local s=$1; shift
  stamp "bench $s $*"
  peers timeout ${BENCH_TIMEOUT:-260} kdactl bench --suite $s --routes auto --iters $ITERS --warmup $WARMUP \
    --markdown $OUT/$s.md --json "$@" > $OUT/$s.json 2> $S/$s.err
  echo "bench $s rc=$?"; tail -3 $S/$s.err; cat $OUT/$s.md
}
need_flashkda() {  # once: FlashKDA's build ends, and whether each peer imports
  [ -n "${fk_done:-}" ] && return; fk_done=1
  wait $fk; tail -2 $OUT/flashkda_build.log
  peers python3 -c "import torch, flash_kda; print('flash_kda imports')" 2>&1 | tail -1
  peers python3 -c "import cudnn; from cudnn.linear_attention import kimi_delta_attention; print('cudnn', cudnn.__version__ if hasattr(cudnn, '__version__') else '', 'imports')" 2>&1 | tail -1
}
for s in $SUITES; do
  case $s in
    kimi-linear) bench kimi-linear --peers $(fla_peer) ;;
    production) need_flashkda; bench production --gate-params $GP --peers $PEERS ;;
    small-bh) need_flashkda; bench small-bh --config lower-bound --gate-params $GP --peers $PEERS ;;
    *) bench $s --peers all ;;
  esac
done
wait $fk 2>/dev/null
stamp "done"
