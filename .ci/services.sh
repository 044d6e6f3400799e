#!/usr/bin/env bash
# Start (or stop) private RabbitMQ, Redis, PostgreSQL, ZooKeeper, etcd and beanstalkd servers bound
# to 127.0.0.1 for the tests. State lives under $FLOWENGINE_SERVICES_DIR (default
# /tmp/flowengine-services); ports are fixed so the tests can find them: RabbitMQ 5672, Redis 6379,
# PostgreSQL 5432, ZooKeeper 2181, etcd 2379 (peer 2380), beanstalkd 11300.
set -euo pipefail
base="${FLOWENGINE_SERVICES_DIR:-/tmp/flowengine-services}"
mkdir -p "$base"
action="${1:-start}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
    local port=$1 name=$2
    for _ in $(seq 1 120); do
        port_open "$port" && return 0
        sleep 0.5
    done
    echo "$name did not open port $port" >&2
    return 1
}

start_redis() {
    port_open 6379 && return 0
    redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no \
        --dir "$base" --logfile "$base/redis.log"
    wait_port 6379 redis
}

start_postgres() {
    port_open 5432 && return 0
    local bin; bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    local data="$base/pgdata"
    if [ ! -d "$data" ]; then
        mkdir -p "$data"; chown -R postgres:postgres "$base" 2>/dev/null || true
        su postgres -c "$bin/initdb -D '$data' -A trust -U postgres" >/dev/null
    fi
    chown -R postgres:postgres "$data"
    su postgres -c "$bin/pg_ctl -D '$data' -l '$base/postgres.log' -o \"-c listen_addresses=127.0.0.1 -p 5432 -k /tmp\" -w start" >/dev/null
    wait_port 5432 postgres
    su postgres -c "psql -h 127.0.0.1 -U postgres -tc \"SELECT 1 FROM pg_database WHERE datname='flowengine'\"" | grep -q 1 \
        || su postgres -c "psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE flowengine'" >/dev/null
}

start_rabbitmq() {
    port_open 5672 && return 0
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 RABBITMQ_NODENAME=rabbit@localhost
    export RABBITMQ_DIST_PORT=25672 ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_MNESIA_BASE="$base/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$base/rabbitmq/log"
    mkdir -p "$RABBITMQ_MNESIA_BASE" "$RABBITMQ_LOG_BASE"
    # The node runs under `su rabbitmq`, which drops its open-files limit to 1024. A node
    # recovering more durable queues than its file-handle cache holds (the suite leaves about
    # 2,000) can deadlock at start: every handle is held by a queue waiting for one more. The
    # server's own script sources this file after su, so the limit is raised where it counts.
    echo 'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true' \
        >"$base/rabbitmq/rabbitmq-env.conf"
    export RABBITMQ_CONF_ENV_FILE="$base/rabbitmq/rabbitmq-env.conf"
    chown -R rabbitmq:rabbitmq "$base/rabbitmq" 2>/dev/null || true
    # The Debian package may have started a node already listening on all interfaces: stop it.
    (service rabbitmq-server stop || true) >/dev/null 2>&1
    pgrep -x epmd >/dev/null || epmd -address 127.0.0.1 -daemon
    nohup rabbitmq-server >"$base/rabbitmq.out" 2>&1 &
    wait_port 5672 rabbitmq
}

start_zookeeper() {
    port_open 2181 && return 0
    local dir="$base/zookeeper"
    mkdir -p "$dir/data" "$dir/conf"
    cat >"$dir/conf/zoo.cfg" <<CFG
tickTime=500
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=2181
clientPortAddress=127.0.0.1
admin.enableServer=false
maxSessionTimeout=60000
minSessionTimeout=1000
4lw.commands.whitelist=ruok,stat,mntr
CFG
    cp /etc/zookeeper/conf/log4j.properties "$dir/conf/" 2>/dev/null || true
    # Started directly (not through zkServer.sh) so its classpath and log folder are ours.
    nohup java -Xmx256m -Dzookeeper.log.dir="$dir" -Dzookeeper.root.logger=INFO,CONSOLE \
        -cp "$dir/conf:/usr/share/java/zookeeper.jar:/usr/share/java/*" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/conf/zoo.cfg" >"$dir/zookeeper.out" 2>&1 &
    wait_port 2181 zookeeper
}

start_etcd() {
    port_open 2379 && return 0
    local dir="$base/etcd"
    mkdir -p "$dir"
    nohup etcd --name flowengine-test --data-dir "$dir/data" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster flowengine-test=http://127.0.0.1:2380 >"$dir/etcd.out" 2>&1 &
    wait_port 2379 etcd
}

start_beanstalkd() {
    port_open 11300 && return 0
    mkdir -p "$base/beanstalkd"
    nohup beanstalkd -l 127.0.0.1 -p 11300 -b "$base/beanstalkd" >"$base/beanstalkd.out" 2>&1 &
    wait_port 11300 beanstalkd
}

stop_all() {
    redis-cli -h 127.0.0.1 -p 6379 shutdown nosave >/dev/null 2>&1 || true
    local bin; bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$bin" ] && su postgres -c "$bin/pg_ctl -D '$base/pgdata' -m fast stop" >/dev/null 2>&1 || true
    RABBITMQ_NODENAME=rabbit@localhost rabbitmqctl stop >/dev/null 2>&1 || true
    pkill -f 'QuorumPeerMain .*flowengine-services' 2>/dev/null || true
    pkill -x etcd 2>/dev/null || true
    pkill -x beanstalkd 2>/dev/null || true
}

case "$action" in
    start) start_redis; start_postgres; start_rabbitmq; start_zookeeper; start_etcd; start_beanstalkd
           echo "services up: redis 6379, postgres 5432, rabbitmq 5672, zookeeper 2181, etcd 2379, beanstalkd 11300";;
    stop) stop_all;;
    *) echo "usage: $0 start|stop" >&2; exit 2;;
esac
