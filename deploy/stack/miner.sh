#!/bin/sh
# The stack's miner: wait until the node's bond is on chain (a committee is drawn from the bonds
# when a challenge is issued), train the demo model's ten-step run with commitments and answer its challenge
# until it resolves, then keep serving the run's openings.
set -eu
RUN=/var/lib/pot/run
python - <<'PY'
import json, sys, time, urllib.request

deadline = time.monotonic() + 300
while True:
    try:
        with urllib.request.urlopen("http://node:8700/api/v1/stake", timeout=5) as r:
            stake = json.load(r)
        if stake.get("eligible"):
            print(f"miner: the node's bond {stake['bond']} is on chain", file=sys.stderr)
            break
    except OSError as exc:
        stake = {"error": str(exc)}
    if time.monotonic() > deadline:
        sys.exit(f"miner: the node was not bonded within 300 s (last answer: {stake})")
    time.sleep(1)
PY
test -s /var/lib/pot/corpus.npy || pot data prepare --out /var/lib/pot/corpus.npy --spec /opt/pot/examples/specs/gpt-demo.toml \
  --max-bytes 262144
if [ ! -e "$RUN/.trained" ]; then
  pot miner train --spec /opt/pot/examples/specs/gpt-demo.toml --data /var/lib/pot/corpus.npy --out "$RUN" \
    --chain dev:///srv/chain/chain.db --account miner --params /etc/pot/node.toml \
    --host 0.0.0.0 --port 8760 --endpoint http://miner:8760 --keep-every 2 --timeout 600 --json
  touch "$RUN/.trained"
fi
exec pot miner serve "$RUN" --host 0.0.0.0 --port 8760
