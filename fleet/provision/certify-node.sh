#!/usr/bin/env bash
# Certify this GPU node with kdactl, for provisioning (cloud-init, Ansible, a boot-time unit).
#
#   certify-node.sh [--force] [extra kdactl certify options, e.g. --expect-gpus 8 --expect-sku H200]
#
# Idempotent: when `kdactl gate` already passes (a valid certificate for this node as it is now),
# nothing runs and the exit code is 0; --force certifies anyway. One run at a time (flock).
# Exit code: kdactl certify's own (0 certified, 1 not certified, 2 usage, 3 inconclusive). Only 3 is
# retried, with exponential backoff: a node with evidence against it (1) is not retried into a pass.
# Logs: every line to /var/log/kdactl/certify.log (KDACTL_LOG_DIR), a summary to syslog
# (`logger -t kdactl`, so `journalctl -t kdactl`), JUnit beside the log.
#
# Environment: KDACTL (kdactl binary), KDACTL_DATA_DIR (/var/lib/kdactl: where kdactl gate, the Slurm
# health check and the Kubernetes labels look), KDACTL_LOG_DIR, KDACTL_RETRIES (2 more attempts),
# KDACTL_BACKOFF_S (30, doubled each retry), KDACTL_PROM_DIR (node_exporter textfile directory, optional).
set -u

KDACTL=${KDACTL:-kdactl}
export KDACTL_DATA_DIR=${KDACTL_DATA_DIR:-/var/lib/kdactl}
LOG_DIR=${KDACTL_LOG_DIR:-/var/log/kdactl}
RETRIES=${KDACTL_RETRIES:-2}
BACKOFF=${KDACTL_BACKOFF_S:-30}
FORCE=0
if [ "${1:-}" = "--force" ]; then FORCE=1; shift; fi

mkdir -p "$LOG_DIR" "$KDACTL_DATA_DIR" || { echo "certify-node: cannot create $LOG_DIR or $KDACTL_DATA_DIR" >&2; exit 2; }
LOG="$LOG_DIR/certify.log"

log() {
    printf '%s certify-node: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" | tee -a "$LOG" >&2
    logger -t kdactl -- "certify-node: $*" 2>/dev/null || true
}

if ! command -v "$KDACTL" >/dev/null 2>&1; then
    log "$KDACTL not found on PATH"
    exit 3
fi

exec 9>"$KDACTL_DATA_DIR/.certify-node.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
    log "another certify-node.sh is running on this node; waiting for it"
    flock 9
fi

if [ "$FORCE" -eq 0 ] && "$KDACTL" gate >>"$LOG" 2>&1; then
    log "kdactl gate passes: node already certified, nothing to do (--force to re-certify)"
    exit 0
fi

prom=()
[ -n "${KDACTL_PROM_DIR:-}" ] && prom=(--prom "$KDACTL_PROM_DIR/kdactl.prom")
attempt=0
delay=$BACKOFF
while :; do
    attempt=$((attempt + 1))
    log "attempt $attempt: $KDACTL certify $*"
    "$KDACTL" certify --junit "$LOG_DIR/certify-junit.xml" "${prom[@]}" "$@" >>"$LOG" 2>&1
    rc=$?
    case $rc in
        0) log "certified (attempt $attempt)"; exit 0 ;;
        1) log "NOT certified: kdactl found evidence against this node (exit 1); see $LOG"; exit 1 ;;
        2) log "usage or configuration error (exit 2); see $LOG"; exit 2 ;;
        3) if [ "$attempt" -gt "$RETRIES" ]; then
               log "inconclusive after $attempt attempts (exit 3); see $LOG"
               exit 3
           fi
           log "inconclusive (exit 3); retrying in ${delay}s"
           sleep "$delay"
           delay=$((delay * 2)) ;;
        *) log "kdactl certify exited $rc (unexpected); see $LOG"; exit "$rc" ;;
    esac
done
