#!/bin/sh
# The kdactl DaemonSet's container: keeps this node's certificate fresh and its taint truthful, with
# no person in the loop. Every KDACTL_CHECK_EVERY_S (300):
#   1. kdactl-certify-node --renew-after KDACTL_RENEW_AFTER_S (432000: 5 days, under the 7-day
#      lifetime): certifies when there is no valid certificate, or when it is that old; an
#      inconclusive renewal keeps a certificate that still passes. After an attempt that did not
#      certify, the next waits KDACTL_RETRY_AFTER_S (3600).
#   2. kdactl gate: pass -> remove the taint KDACTL_TAINT (kdactl.io/uncertified:NoSchedule);
#      anything else (expired, failed, inconclusive, GPUs or driver changed) -> put it back.
#      kubectl is called when the state changes (and on the first round), not every round.
#   3. kdactl k8s labels: the NFD labels follow the certificate.
# NODE_NAME (spec.nodeName) is required. KDACTL_CERTIFY_ARGS: extra certify options (word-split).
# KDACTL_LOOP_ROUNDS: stop after that many rounds (tests); 0, the default, runs for ever.
set -u
: "${NODE_NAME:?NODE_NAME must name this node (fieldRef spec.nodeName)}"
KDACTL=${KDACTL:-kdactl}
CERTIFY_NODE=${KDACTL_CERTIFY_NODE:-kdactl-certify-node}
KUBECTL=${KUBECTL:-kubectl}
TAINT=${KDACTL_TAINT:-kdactl.io/uncertified}
CHECK_EVERY=${KDACTL_CHECK_EVERY_S:-300}
RENEW_AFTER=${KDACTL_RENEW_AFTER_S:-432000}
RETRY_AFTER=${KDACTL_RETRY_AFTER_S:-3600}
ROUNDS=${KDACTL_LOOP_ROUNDS:-0}
FEATURES_DIR=${FEATURES_DIR:-/etc/kubernetes/node-feature-discovery/features.d}

log() { printf '%s kdactl-node-loop %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NODE_NAME" "$*"; }

set_taint() {  # $1: present | absent
    if [ "$1" = present ]; then
        "$KUBECTL" taint nodes "$NODE_NAME" "$TAINT=true:NoSchedule" --overwrite >/dev/null
    else  # kubectl fails when the taint is not there: that is the state asked for
        "$KUBECTL" taint nodes "$NODE_NAME" "$TAINT:NoSchedule-" >/dev/null 2>&1 || true
    fi
}

round=0
last_try=""
taint=""
while :; do
    now=$(date +%s)
    if [ -n "$last_try" ] && [ $((now - last_try)) -lt "$RETRY_AFTER" ] && ! "$KDACTL" gate >/dev/null 2>&1; then
        log "not certified; next attempt $((last_try + RETRY_AFTER - now))s from now"
    else
        # shellcheck disable=SC2086 # KDACTL_CERTIFY_ARGS is a list of options
        "$CERTIFY_NODE" --renew-after "$RENEW_AFTER" ${KDACTL_CERTIFY_ARGS:-}
        rc=$?
        if [ "$rc" -eq 0 ]; then last_try=""; else last_try=$now; log "certify-node exit $rc"; fi
    fi
    gate_out=$("$KDACTL" gate 2>&1)
    gate_rc=$?
    want=absent
    [ "$gate_rc" -eq 0 ] || want=present
    if [ "$want" != "$taint" ]; then
        if set_taint "$want"; then
            taint=$want
            log "gate exit $gate_rc ($(printf '%s\n' "$gate_out" | head -n 1)): taint $TAINT:NoSchedule $want"
        else
            log "gate exit $gate_rc: could not set taint $TAINT $want (kubectl failed); retrying next round"
        fi
    fi
    "$KDACTL" k8s labels --features-dir "$FEATURES_DIR" >/dev/null || log "kdactl k8s labels failed"
    round=$((round + 1))
    if [ "$ROUNDS" -gt 0 ] && [ "$round" -ge "$ROUNDS" ]; then exit 0; fi
    sleep "$CHECK_EVERY"
done
