#!/bin/sh
# First start: a cluster in $PGDATA with the POSTGRES_USER role (password POSTGRES_PASSWORD) and the
# POSTGRES_DB database, then the init scripts; every start: the server on all addresses, password
# (scram-sha-256) logins from the network. A cluster whose setup was cut short is refused, not reused.
set -eu
: "${POSTGRES_USER:?POSTGRES_USER is not set}" "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
DONE="$PGDATA/pot-initialized"

if [ ! -e "$DONE" ]; then
  if [ -n "$(ls -A "$PGDATA")" ]; then
    echo "pot-postgres: $PGDATA holds a cluster whose first setup did not finish; empty the volume" >&2
    exit 1
  fi
  initdb -D "$PGDATA" --username=postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
  psql -v ON_ERROR_STOP=1 -q -U postgres -d postgres -v user="$POSTGRES_USER" -v pw="$POSTGRES_PASSWORD" \
    -v db="$POSTGRES_DB" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'pw';
CREATE DATABASE :"db" OWNER :"user";
SQL
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] || continue
    echo "pot-postgres: running $f" >&2
    psql -v ON_ERROR_STOP=1 -q -U postgres -d postgres -f "$f"
  done
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  touch "$DONE"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
