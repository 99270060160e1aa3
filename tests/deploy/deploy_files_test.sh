#!/usr/bin/env bash
# Checks the deployment files in deploy/ offline:
#   - deploy/prometheus/prometheus.yml passes `promtool check config` and scrapes the metrics port
#     that the systemd unit gives the server;
#   - deploy/systemd/cosmoflow-server.service passes `systemd-analyze verify` (on a copy whose
#     ExecStart names the binary of this build, so the "not executable" check is real), every flag
#     of its ExecStart is one the built server accepts, and TimeoutStopSec covers the drain timeout.
# A missing promtool or systemd-analyze skips that check with a message; both missing: exit 77.
# Usage: deploy_files_test.sh SOURCE_DIR SERVER_BINARY
set -euo pipefail
src=$1; server=$2
prom="$src/deploy/prometheus/prometheus.yml"
unit="$src/deploy/systemd/cosmoflow-server.service"
fail() { echo "deploy_files_test: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
[ -f "$prom" ] || fail "$prom missing"
[ -f "$unit" ] || fail "$unit missing"
[ -x "$server" ] || fail "$server is not an executable (build cosmoflow-server first)"
ran_tool=0

# --- the unit's ExecStart, as words (the unit keeps it on one line, without quotes)
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
[ -n "$exec_line" ] || fail "no ExecStart= in $unit"
read -r -a exec_words <<< "$exec_line"
args=("${exec_words[@]:1}")
flag_value() {  # flag_value NAME: the value after --NAME in ExecStart
  local i
  for ((i = 0; i < ${#args[@]}; i++)); do
    if [ "${args[$i]}" = "--$1" ]; then echo "${args[$((i + 1))]}"; return; fi
  done
}

# Every flag is known to this build's server (an unknown flag exits 2 before --help is honoured).
"$server" "${args[@]}" --help > /dev/null 2> "$work/flags.err" \
  || fail "cosmoflow-server refuses the unit's flags: $(head -1 "$work/flags.err")"
echo "ok: cosmoflow-server accepts the unit's flags: ${args[*]}"

# TimeoutStopSec above the drain timeout (the server's default is 30 s when the flag is absent).
drain=$(flag_value drain-timeout-s); drain=${drain:-30}
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s\{0,1\}$/\1/p' "$unit")
[ -n "$stop" ] || fail "TimeoutStopSec= missing or not in whole seconds in $unit"
awk -v s="$stop" -v d="$drain" 'BEGIN { exit !(s > d) }' \
  || fail "TimeoutStopSec=$stop does not cover --drain-timeout-s $drain"
grep -qx 'KillSignal=SIGTERM' "$unit" || fail "KillSignal=SIGTERM missing (the server drains on SIGTERM)"
grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$unit" || fail "ExecReload does not send SIGHUP"
echo "ok: TimeoutStopSec=$stop > drain timeout $drain s; SIGTERM stops, SIGHUP reloads"

# The metrics port of the unit is a scrape target of the Prometheus config.
metrics=$(flag_value metrics-address); metrics=${metrics:-0.0.0.0:9464}
port=${metrics##*:}
grep -Eq "^[[:space:]]*-[[:space:]]*['\"]?[A-Za-z0-9.-]+:$port['\"]?[[:space:]]*$" "$prom" \
  || fail "$prom has no scrape target on port $port (the unit's --metrics-address $metrics)"
echo "ok: prometheus.yml scrapes port $port"

if command -v promtool > /dev/null; then
  promtool check config "$prom" || fail "promtool check config $prom"
  ran_tool=1
else
  echo "SKIP: promtool not installed (Debian package prometheus): config not checked"
fi

if command -v systemd-analyze > /dev/null; then
  # A copy whose ExecStart is this build's binary; the file name must stay the unit's.
  mkdir "$work/unit" "$work/broken"
  sed "s|^ExecStart=${exec_words[0]} |ExecStart=$(realpath "$server") |" "$unit" > "$work/unit/cosmoflow-server.service"
  verify() {  # verify FILE: systemd-analyze's complaints about this unit, one per line
    systemd-analyze verify "$1" 2>&1 | grep -F "cosmoflow-server.service" || true
  }
  # The check can see a mistake: a misspelt key in a copy is reported.
  sed 's/^TimeoutStopSec=/TimeoutStopSecs=/' "$work/unit/cosmoflow-server.service" > "$work/broken/cosmoflow-server.service"
  [ -n "$(verify "$work/broken/cosmoflow-server.service")" ] \
    || fail "systemd-analyze verify did not report a misspelt key: the check below would prove nothing"
  complaints=$(verify "$work/unit/cosmoflow-server.service")
  [ -z "$complaints" ] || fail "systemd-analyze verify $unit: $complaints"
  echo "ok: systemd-analyze verify: no complaints"
  ran_tool=1
else
  echo "SKIP: systemd-analyze not installed: unit syntax not checked"
fi
[ "$ran_tool" = 1 ] || exit 77
echo "deploy_files_test: ok"
