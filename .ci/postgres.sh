# Sourced by .ci/run: a throwaway PostgreSQL server for tests/test_search_storage.py (several `planner search`
# workers on one PostgreSQL study). Debian's package when no server binaries are present (CI runs as root on a
# fresh Debian-like machine), a new cluster in a temporary directory listening on 127.0.0.1 only, one database,
# PLANNER_TEST_POSTGRES_URL exported; ci_postgres_stop (run on exit) stops it and removes the directory.
# A failure here is reported, not fatal: the test then fails under CI=true, saying the server is missing.

ci_postgres_bindir() {
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return 0; fi
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
    return 1
}

ci_postgres_install() {
    # Debian's postgresql package (apt-get), only as root with apt-get; its own cluster (15/main) is stopped:
    # the tests use the throwaway cluster below
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    echo "CI: installing PostgreSQL (apt-get install -y postgresql)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 \
        && apt-get install -y -q postgresql >/dev/null 2>&1; } || return 1
    if command -v pg_lsclusters >/dev/null 2>&1; then
        pg_lsclusters --no-header 2>/dev/null | while read -r ver name _; do
            pg_ctlcluster "$ver" "$name" stop >/dev/null 2>&1 || true
        done
    fi
}

ci_as_postgres() {
    # initdb and the server refuse to run as root: run them as the package's postgres user
    if [ "$(id -u)" != 0 ]; then "$@"
    elif command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"
    else su -s /bin/sh postgres -c "$(printf '%q ' "$@")"; fi
}

ci_postgres_start() {
    [ -n "${PLANNER_TEST_POSTGRES_URL:-}" ] && return 0  # a server given by the caller
    local bindir port
    bindir="$(ci_postgres_bindir)" || { ci_postgres_install && bindir="$(ci_postgres_bindir)"; } || {
        echo "CI: no PostgreSQL server binaries and none installable; the PostgreSQL study test will fail" >&2
        return 0; }
    CI_PGDIR="$(mktemp -d)"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$CI_PGDIR"; fi
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    if ci_as_postgres "$bindir/initdb" -D "$CI_PGDIR/data" -U planner --auth=trust -E UTF8 >"$CI_PGDIR/initdb.log" 2>&1 \
        && ci_as_postgres "$bindir/pg_ctl" -D "$CI_PGDIR/data" -l "$CI_PGDIR/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $CI_PGDIR -c fsync=off" start >/dev/null \
        && ci_as_postgres "$bindir/createdb" -h 127.0.0.1 -p "$port" -U planner planner_test; then
        export PLANNER_TEST_POSTGRES_URL="postgresql+psycopg://planner@127.0.0.1:$port/planner_test"
        CI_PGBIN="$bindir"
        echo "CI: $("$bindir/postgres" --version) on 127.0.0.1:$port" >&2
    else
        echo "CI: PostgreSQL did not start; the PostgreSQL study test will fail:" >&2
        tail -n 5 "$CI_PGDIR"/*.log >&2 2>/dev/null || true
    fi
}

ci_postgres_stop() {
    [ -n "${CI_PGDIR:-}" ] || return 0
    if [ -n "${CI_PGBIN:-}" ]; then ci_as_postgres "$CI_PGBIN/pg_ctl" -D "$CI_PGDIR/data" -m fast -w stop >/dev/null 2>&1 || true; fi
    rm -rf "$CI_PGDIR"
}
