#!/bin/bash
# Two versions of the gateway side by side, for CPU per request changes too small for gateway_bench.py's
# noise on this machine: both gateways (one worker each unless W is set) share CPU 1, the stub and two load
# generators (bench/loadgen.py, 32 connections each unless CONNS is set) share CPU 0, and both gateways are
# loaded at once, so the host's speed changes hit both alike. Prints per round each side's requests/s and CPU
# ms per request (utime + stime of the gateway's processes) and B over A. A version is a folder holding a
# `servlane_gateway` package (e.g. `git archive <commit> gateway | tar -x -C /tmp/a`), or `-` for this tree.
# An A/A run (the same folder twice) shows the rig's own spread: within ±4% here.
# Usage: bench/gateway_ab.sh A_DIR B_DIR [ROUNDS]        (S=seconds per round, default 6; BODY=request body)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
A=$1; B=$2; R=${3:-4}; S=${S:-6}; W=${W:-1}
T=$(mktemp -d); GA=""; GB=""
# The gateways are started in $(...) subshells, so they are not this shell's jobs: killed by pid.
trap 'kill $GA $GB $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
PY=.venv/bin/python
BASEPP=$ROOT/api:$ROOT/core:$ROOT/gateway
STUB_PORT=18101; PORT_A=18102; PORT_B=18103
PYTHONPATH=$BASEPP $PY - "$T" "$STUB_PORT" <<'PYEOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "bench")
import gateway_bench as g
tmp, port = Path(sys.argv[1]), sys.argv[2]
(tmp / "routes.json").write_text(json.dumps(g.routes(f"http://127.0.0.1:{port}")))
(tmp / "keys").write_text(f"bench: {g.API_KEY}\n")
(tmp / "key").write_text(g.API_KEY)
PYEOF
KEY=$(cat "$T/key")
PYTHONPATH=$BASEPP taskset -c 0 $PY bench/gateway_bench.py --serve-stub $STUB_PORT >/dev/null 2>&1 &
start() {
  local src=$1 port=$2
  [ "$src" = - ] && src=""
  PYTHONPATH=${src:+$src:}$BASEPP taskset -c 1 $PY -m servlane_gateway --routes-file "$T/routes.json" \
    --keys-file "$T/keys" --host 127.0.0.1 --port "$port" --log-level warning --workers "$W" >"$T/gw$port.log" 2>&1 &
  echo $!
}
GA=$(start "$A" $PORT_A); GB=$(start "$B" $PORT_B)
for port in $PORT_A $PORT_B; do
  for _ in $(seq 150); do curl -sf "localhost:$port/ready" >/dev/null && break; sleep 0.2; done
done
BODY=${BODY:-'{"model":"chat","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'}  # BODY='{..."stream":true}': streams
cpu() {  # a child may end between pgrep and the read: it then counts 0
  local t=0 p; for p in $1 $(pgrep -P "$1"); do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo $t
}
load() {
  taskset -c 0 $PY bench/loadgen.py closed --url "http://127.0.0.1:$1/v1/chat/completions" --body "$BODY" \
    --api-key "$KEY" --connections "${CONNS:-32}" --seconds "$2"
}
load $PORT_A 1 >/dev/null & load $PORT_B 1 >/dev/null; wait %3 2>/dev/null || true  # warm-up
for _ in $(seq "$R"); do
  a0=$(cpu "$GA"); b0=$(cpu "$GB")
  load $PORT_A "$S" >"$T/a.json" & pa=$!
  load $PORT_B "$S" >"$T/b.json"; wait $pa
  a1=$(cpu "$GA"); b1=$(cpu "$GB")
  python3 - "$T" "$((a1 - a0))" "$((b1 - b0))" <<'PYEOF'
import json, os, sys
tmp, ticks_a, ticks_b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
a, b = (json.load(open(os.path.join(tmp, f))) for f in ("a.json", "b.json"))
tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
cpu_a, cpu_b = ticks_a * tick_ms / a["requests"], ticks_b * tick_ms / b["requests"]
print(f"A {a['rps']:.0f} req/s {cpu_a:.3f} ms/req | B {b['rps']:.0f} req/s {cpu_b:.3f} ms/req | "
      f"B/A cpu {cpu_b / cpu_a:.3f} req/s {b['rps'] / a['rps']:.3f}")
PYEOF
done
