#!/bin/bash
# Intake over HTTP when every lead is the same person (one phone, each lead
# a same-person duplicate of the first) against every lead a different
# person, on PostgreSQL and SQLite, with wrk and the shared bench's request
# script (../shared/bench/intake.lua; the same-person variant is made from
# it here by keeping its phone). Binaries are alternated round by round so
# that a before/after comparison shares the machine's state.
#
#   benches/same_person.sh target/release/leadrouter [OTHER_BINARY ...]
#
# Environment: ROUNDS (2), CONNS (64), DUR (10 seconds). Needs wrk and a
# PostgreSQL on 127.0.0.1:5432 (user postgres, trust). Prints one line a
# run, then each binary's same/different ratio per database and round.
set -u
[ $# -ge 1 ] || { echo "usage: $0 BINARY [BINARY ...]"; exit 2; }
here=$(dirname "$(readlink -f "$0")")
distinct_lua=${INTAKE_LUA:-$here/../../shared/bench/intake.lua}
rounds=${ROUNDS:-2}; conns=${CONNS:-64}; dur=${DUR:-10}
work=$(mktemp -d); trap 'kill ${pid:-} 2>/dev/null; rm -rf "$work"' EXIT
# The same person: the phone the script would vary stays the template's.
sed 's/local b = string.gsub(string.gsub(body, "someone@", "u" .. key .. "@"), "5551234567", phone)/local b = string.gsub(body, "someone@", "u" .. key .. "@")/' \
  "$distinct_lua" > "$work/same.lua"
cmp -s "$distinct_lua" "$work/same.lua" && { echo "could not make the same-person script"; exit 1; }

serve_and_load() { # $1 binary, $2 database url, $3 script: prints wrk's rps
  port=$((20000 + RANDOM % 20000))
  printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_token = "bench-admin"\n[database]\nurl = "%s"\nmax_connections = 16\n[[sources]]\nid = "feed"\nkind = "feed"\napi_key = "bench-key"\n' \
    "$port" "$2" > "$work/lr.toml"
  "$1" serve --config "$work/lr.toml" > "$work/lr.log" 2>&1 & pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
  wrk -t2 -c"$conns" -d"${dur}s" -s "$3" "http://127.0.0.1:$port" 2>&1 | sed -n 's/^BENCH rps=\([0-9.]*\).*/\1/p'
  kill $pid; wait $pid 2>/dev/null
}

for round in $(seq "$rounds"); do
  for bin in "$@"; do
    for db in postgres sqlite; do
      declare -A rps=()
      for people in different same; do
        script="$distinct_lua"; [ $people = same ] && script="$work/same.lua"
        if [ $db = postgres ]; then
          name="same_person_$$_${round}_${people}"
          psql -U postgres -h 127.0.0.1 -qc "create database $name" || exit 1
          url="postgres://postgres@127.0.0.1:5432/$name"
        else
          rm -f "$work"/lr.db*; url="sqlite://$work/lr.db?mode=rwc"
        fi
        rps[$people]=$(serve_and_load "$bin" "$url" "$script")
        [ $db = postgres ] && psql -U postgres -h 127.0.0.1 -qc "drop database $name"
        echo "round=$round bin=$bin db=$db people=$people rps=${rps[$people]}"
      done
      python3 -c "print(f'round=$round bin=$bin db=$db same/different={float(\"${rps[same]:-0}\") / (float(\"${rps[different]:-0}\") or 1):.2f}')"
    done
  done
done
