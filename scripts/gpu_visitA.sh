#!/usr/bin/env bash
# Device visit A, in priority order, every step under its own time limit: install, detect, build
# (cold, warm, 8 concurrent), GPU tests, small-bh bench with fla, smoke baseline + gates, the
# validation suite, certify --quick + verify.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.cache/triton KDACTL_DATA_DIR=/tmp/kd
S=/tmp/visit; mkdir -p $S $KDACTL_DATA_DIR
exec > >(tee $OUT/visitA.log) 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING
# fla autotunes ~90 s per new head count: warm them in parallel, bounded (an unbounded wait on
# these once burned a whole visit).
for h in 1 4 8; do timeout 150 python3 scripts/warm_fla.py $h > $S/warm_$h.log 2>&1 & done
TIMEFORMAT="wall %R s"
echo "== detect"; kdactl detect
export KDACTL_CACHE_DIR=$PWD/.cache/kdactl-a
echo "== build, cold cache"; time kdactl build
echo "== build, warm cache"; time kdactl build --json > $OUT/build2.json; grep -E '"origin"|load_s|passed' $OUT/build2.json
echo "== 8 concurrent builds, empty cache"
export KDACTL_CACHE_DIR=$PWD/.cache/kdactl-b
time (for i in $(seq 8); do kdactl build --json > $S/conc_$i.json 2>$S/conc_$i.err & done; wait)
python3 -c "
import json,glob
r=[json.load(open(f)) for f in sorted(glob.glob('$S/conc_*.json'))]
print('exit codes', [x['exit_code'] for x in r], 'origins', [l['origin'] for x in r for l in x['libraries']])"
export KDACTL_CACHE_DIR=$PWD/.cache/kdactl-a
echo "== GPU tests"
time timeout 150 python3 -m pytest -q -m gpu tests -p no:cacheprovider --junitxml=$OUT/gpu.xml 2>&1 | tail -15
grep -h warmed $S/warm_*.log
echo "== kdactl bench small-bh"; time timeout 150 kdactl bench --suite small-bh --peers fla --iters 5 --warmup 1 --markdown $OUT/small_bh.md --json > $S/small_bh.json; cat $OUT/small_bh.md
echo "== smoke baseline + gates"
timeout 30 kdactl bench --suite smoke --peers none --iters 8 --record-baseline --baseline fleet/baselines/H200.toml > /dev/null; echo record rc=$?
cp fleet/baselines/H200.toml $OUT/H200.toml
timeout 30 kdactl bench --suite smoke --peers none --iters 8 --gate --baseline fleet/baselines/H200.toml | tail -3; echo gate rc=$?
python3 -c "import re;t=open('fleet/baselines/H200.toml').read();open('/tmp/fast.toml','w').write(re.sub(r'median_ms = ([0-9.eE+-]+)',lambda m:f'median_ms = {float(m[1])/2!r}',t))"
timeout 30 kdactl bench --suite smoke --peers none --iters 8 --gate --baseline /tmp/fast.toml | tail -3; echo "2x-faster gate rc=$?"
echo "== checks suite"; time timeout 70 python3 -m pytest checks -q -p no:cacheprovider 2>&1 | tail -6
echo "== certify --quick"; time timeout 60 kdactl certify --quick --expect-gpus 1 --expect-sku H200 --out /tmp/kd/cert.json --junit $OUT/certify.xml --prom $OUT/kdactl.prom; echo rc=$?
cp /tmp/kd/cert.json $OUT/cert.json
kdactl verify /tmp/kd/cert.json; echo verify rc=$?
python3 -c "p='/tmp/kd/cert.json';b=bytearray(open(p,'rb').read());i=b.index(b'H200');b[i+3]^=1;open('$S/t.json','wb').write(b)"
kdactl verify $S/t.json; echo "tampered verify rc=$?"
