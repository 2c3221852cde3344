#!/usr/bin/env bash
# Certify this GPU node with kdactl, for provisioning (cloud-init, Ansible, a boot-time unit).
#
#   certify-node.sh [--force] [--renew-after SECONDS] [extra kdactl certify options, e.g. --expect-gpus 8]
#
# Idempotent: when `kdactl gate` already passes (a valid certificate for this node as it is now),
# nothing runs and the exit code is 0; --force certifies anyway; --renew-after S also certifies when
# the certificate is S seconds old or older (the systemd timer and the Kubernetes DaemonSet renew a
# 7-day certificate after 5 days this way). One run at a time (flock).
# The new certificate is written beside the old one and replaces it (rename) when the run decided
# (0 or 1); an inconclusive renewal (3: e.g. jobs kept the GPUs busy while perf timed) keeps a
# certificate that still passes the gate, so a busy node is not turned away before its certificate
# expires; with no valid certificate to keep, the inconclusive one replaces it.
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
RENEW_AFTER=""
while [ $# -gt 0 ]; do
    case $1 in
        --force) FORCE=1; shift ;;
        --renew-after)
            case ${2:-} in
                ''|*[!0-9]*) echo "certify-node: --renew-after needs a number of seconds, got '${2:-}'" >&2; exit 2 ;;
            esac
            RENEW_AFTER=$2; shift 2 ;;
        *) break ;;
    esac
done
CERT="$KDACTL_DATA_DIR/cert.json"
NEXT="$KDACTL_DATA_DIR/cert-next.json"

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
    age=$(( $(date +%s) - $(stat -c %Y "$CERT" 2>/dev/null || date +%s) ))
    if [ -z "$RENEW_AFTER" ] || [ "$age" -lt "$RENEW_AFTER" ]; then
        log "kdactl gate passes: node already certified, nothing to do (--force to re-certify)"
        exit 0
    fi
    log "kdactl gate passes, but the certificate is ${age}s old (renewing after ${RENEW_AFTER}s): re-certifying"
fi

# The run's certificate replaces the old one (same folder: an atomic rename).
promote() { [ ! -f "$NEXT" ] || mv -f "$NEXT" "$CERT"; }

prom=()
[ -n "${KDACTL_PROM_DIR:-}" ] && prom=(--prom "$KDACTL_PROM_DIR/kdactl.prom")
attempt=0
delay=$BACKOFF
while :; do
    attempt=$((attempt + 1))
    log "attempt $attempt: $KDACTL certify $*"
    rm -f "$NEXT"
    "$KDACTL" certify --out "$NEXT" --junit "$LOG_DIR/certify-junit.xml" "${prom[@]}" "$@" >>"$LOG" 2>&1
    rc=$?
    case $rc in
        0) promote; log "certified (attempt $attempt)"; exit 0 ;;
        1) promote; log "NOT certified: kdactl found evidence against this node (exit 1); see $LOG"; exit 1 ;;
        2) log "usage or configuration error (exit 2); see $LOG"; exit 2 ;;
        3) if [ "$attempt" -gt "$RETRIES" ]; then
               if "$KDACTL" gate >>"$LOG" 2>&1; then
                   rm -f "$NEXT"
                   log "inconclusive after $attempt attempts (exit 3); kept the certificate that still passes the gate; see $LOG"
               else
                   promote
                   log "inconclusive after $attempt attempts (exit 3); see $LOG"
               fi
               exit 3
           fi
           log "inconclusive (exit 3); retrying in ${delay}s"
           sleep "$delay"
           delay=$((delay * 2)) ;;
        *) log "kdactl certify exited $rc (unexpected); see $LOG"; exit "$rc" ;;
    esac
done
