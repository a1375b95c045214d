#!/bin/sh
# Start chopsticks on the Rococo Asset Hub genesis (the chain spec shipped in npm
# @substrate/connect-known-chains), with the dev accounts of the compose network funded.
set -eu
DIR=/opt/chopsticks
mkdir -p "$DIR"
cd "$DIR"
if [ ! -x node_modules/.bin/chopsticks ]; then
  npm install --no-audit --no-fund --loglevel=error \
    @acala-network/chopsticks@1.5.1 @substrate/connect-known-chains@1.10.3
fi
if [ ! -s genesis.json ]; then
  # A file path: the package's exports map does not expose the specs by subpath.
  node -e 'process.stdout.write(require(process.cwd() + "/node_modules/@substrate/connect-known-chains/dist/commonjs/specs/rococo_v2_2_asset_hub.js").chainSpec)' > genesis.json.tmp
  mv genesis.json.tmp genesis.json
fi
cp /deploy/config.yml config.yml
exec node_modules/.bin/chopsticks --config config.yml --genesis genesis.json --host 0.0.0.0 --port 8000
