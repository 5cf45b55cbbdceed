#!/bin/bash
# Drain this Envoy before it stops, so the requests in flight finish: the Envoy Deployment's preStop runs it, and so
# does the sie-envoy image's entrypoint on SIGTERM (deploy/docker/envoy-entrypoint). Envoy itself closes every
# connection at once on SIGTERM. Needs bash only (its /dev/tcp): the upstream Envoy image has no curl.
#   drain.sh ADMIN_ADDRESS MIN_WAIT_S MAX_WAIT_S
# 1. POST /healthcheck/fail: the listener's /readyz answers 503, so the pod leaves the Service's endpoints.
# 2. POST /drain_listeners?graceful&inboundonly: each connection is told to close after its request (HTTP/1.1
#    `connection: close`, HTTP/2 GOAWAY; all at once with --drain-strategy immediate); the listener still accepts (a client that has not seen the endpoint change
#    yet is served).
# 3. Waits MIN_WAIT_S (for the endpoint change to reach every node), then until no request is in flight (the
#    http.*.downstream_rq_active gauges, the admin's own left out), MAX_WAIT_S at most.
set -u
admin=$1 min_wait_s=$2 max_wait_s=$3
if ! [[ $admin == ?*:[0-9]* && $min_wait_s =~ ^[0-9]+$ && $max_wait_s =~ ^[0-9]+$ ]]; then
  echo "drain.sh ADMIN_ADDRESS MIN_WAIT_S MAX_WAIT_S: got '$admin' '$min_wait_s' '$max_wait_s' (host:port, seconds)" >&2
  exit 2
fi

admin_request() {  # METHOD PATH: Envoy's answer, headers included; nothing when the admin does not answer (each line
  # within 2 s: a wedged Envoy does not hold the drain past MAX_WAIT_S)
  local line
  exec 3<>"/dev/tcp/${admin%:*}/${admin##*:}" || return 0
  printf '%s %s HTTP/1.1\r\nhost: %s\r\nconnection: close\r\n\r\n' "$1" "$2" "$admin" >&3
  while IFS= read -r -t 2 line <&3; do
    printf '%s\n' "$line"
  done
  exec 3<&-
}

in_flight() {  # the requests in flight on Envoy's listeners
  local total=0 name value
  while IFS=': ' read -r name value; do
    value=${value%$'\r'}
    if [[ $name == http.*.downstream_rq_active && $name != http.admin.* && $value =~ ^[0-9]+$ ]]; then
      total=$((total + value))
    fi
  done < <(admin_request GET '/stats?filter=downstream_rq_active' 2>/dev/null)
  echo "$total"
}

admin_request POST /healthcheck/fail >/dev/null 2>&1
admin_request POST '/drain_listeners?graceful&inboundonly' >/dev/null 2>&1
SECONDS=0
while ((SECONDS < max_wait_s)); do
  if ((SECONDS >= min_wait_s)) && [[ $(in_flight) == 0 ]]; then
    break
  fi
  sleep 0.2
done
