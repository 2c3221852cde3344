#!/usr/bin/env bash
# Device visit B (machine still warm): serving bench, certify quick + verify + gate, faults, sanitize.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.cache/triton KDACTL_CACHE_DIR=$PWD/.cache/kdactl-a KDACTL_DATA_DIR=/tmp/kd
S=/tmp/visit; mkdir -p $S $KDACTL_DATA_DIR
exec > >(tee $OUT/visitB.log) 2>&1
python3 -c "import fla" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; }
export PYTHONPATH=/tmp/site
python3 -c "import kdactl" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING
TIMEFORMAT="wall %R s"
echo "== certify --quick"; time timeout 60 kdactl certify --quick --expect-gpus 1 --expect-sku H200 --out /tmp/kd/cert.json --junit $OUT/certify.xml --prom $OUT/kdactl.prom; echo rc=$?
cp /tmp/kd/cert.json $OUT/cert.json
kdactl verify /tmp/kd/cert.json; echo verify rc=$?
python3 -c "p='/tmp/kd/cert.json';b=bytearray(open(p,'rb').read());i=b.index(b'H200');b[i+3]^=1;open('$S/t.json','wb').write(b)"
kdactl verify $S/t.json; echo "tampered verify rc=$?"
timeout 60 kdactl certify --quick --expect-gpus 2 --out $S/x.json > /dev/null 2>&1; echo "expect-gpus 2 rc=$?"
for f in wrong-result:direct sanitizer; do KDACTL_FAULT=$f timeout 60 kdactl certify --quick --out $S/f.json > /dev/null 2>&1; echo "fault $f rc=$?"; done
echo "== serving bench"; time timeout 110 kdactl bench --suite serving --peers fla --iters 8 --markdown $OUT/serving.md --json > $S/serving.json; cat $OUT/serving.md
echo "== sanitize"; time timeout 150 kdactl sanitize --json --timeout 140 > $S/san.json; echo rc=$?
python3 -c "import json;d=json.load(open('$S/san.json'));print(json.dumps(d.get('tools',d))[:2500])"
