#!/usr/bin/env bash
# Start (or stop) the clustered servers of the cluster test suite, bound to 127.0.0.1, on ports
# apart from the shared single servers of services.sh (which this script never touches):
#
#   RabbitMQ   three nodes fe-c1..3@localhost, AMQP 5681-5683, Erlang distribution 25681-25683
#   Redis      master 6391 (at first), replica 6392, Sentinels 26391-26393, master name fe-cluster
#   ZooKeeper  three members, clients 2191-2193, quorum 2891-2893, election 3891-3893
#   etcd       three members, clients 2391-2393, peers 2491-2493
#   MariaDB    3316, user flowengine / password flowengine-secret (may create databases)
#
# State lives under $FLOWENGINE_CLUSTER_DIR (default /tmp/flowengine-cluster). `start` starts
# whatever is not running (so a test that killed a member runs it again to bring it back), or only
# the services named after it (`start rabbitmq redis zookeeper etcd mariadb`); `stop` stops
# everything and `wipe` removes the state too. Sized small: the machine is shared.
#
# One run of the script at a time (a lock under the state dir): two starts at once would each
# launch the members whose ports are not open yet, and the loser's exit clobbers or deletes the
# winner's pid file, so `stop` could no longer find the member (pytest-xdist workers did this).
# `start` adopts a member whose port answers only if its pid file here names a running process;
# anything else on the port is refused, since `stop` could not stop it and a test that kills a
# member would signal the wrong process.
set -euo pipefail
base="${FLOWENGINE_CLUSTER_DIR:-/tmp/flowengine-cluster}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { [ -f "$1" ] && head -n 1 "$1" || true; }

# /proc rather than `kill -0`, which fails on processes of other users (rabbitmq, mysql) when
# the script is not run as root.
pid_alive() { [ -n "$1" ] && [ -d "/proc/$1" ]; }

# Succeeds when the member on port $1 runs and is ours ($2, its pid file, names a running
# process): leave it be. Fails when the port is free: start it. Ends the script when something
# else holds the port, naming the port, the holder if `ss` can tell, and what to do.
member_running() {
    local port=$1 pidfile=$2 name=$3 pid holder why="is missing"
    port_open "$port" || return 1
    pid=$(pid_of "$pidfile")
    pid_alive "$pid" && return 0
    [ -z "$pid" ] || why="names process $pid, which is not running"
    holder=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 || true)
    {
        echo "cluster.sh: port $port ($name) answers, but $pidfile $why:" \
             "something this script did not start here${holder:+ ($holder)} holds the port."
        echo "Stop that process (\`ss -ltnp 'sport = :$port'\` names it; \`$0 stop\` cannot," \
             "having no pid of it), then run \`$0 start\` again."
    } >&2
    exit 3
}

wait_port() {
    local port=$1 name=$2
    for _ in $(seq 1 240); do
        port_open "$port" && return 0
        sleep 0.5
    done
    echo "$name did not open port $port" >&2
    return 1
}

# ---- RabbitMQ -------------------------------------------------------------------------------
rabbit_env() {
    local n=$1
    export RABBITMQ_NODENAME="fe-c$n@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$((5680 + n)) RABBITMQ_DIST_PORT=$((25680 + n))
    export ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_MNESIA_BASE="$base/rabbitmq/fe-c$n/mnesia"
    export RABBITMQ_LOG_BASE="$base/rabbitmq/fe-c$n/log"
    export RABBITMQ_PID_FILE="$base/rabbitmq/fe-c$n.pid"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$base/rabbitmq/enabled_plugins"
    export RABBITMQ_CONFIG_FILE="$base/rabbitmq/fe-c$n"
    export RABBITMQ_CONF_ENV_FILE="$base/rabbitmq/fe-c$n-env.conf"
    # One scheduler each and no busy waiting: three nodes share two cores with everything else.
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} +S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

start_rabbit_node() {
    local n=$1 port=$((5680 + $1))
    member_running "$port" "$base/rabbitmq/fe-c$n.pid" "rabbitmq fe-c$n" && return 0
    (
        rabbit_env "$n"
        mkdir -p "$RABBITMQ_MNESIA_BASE" "$RABBITMQ_LOG_BASE"
        echo "[]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
        # Raises the node's open-files limit after `su rabbitmq` (see .ci/services.sh).
        echo 'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true' \
            >"$RABBITMQ_CONF_ENV_FILE"
        cat >"$RABBITMQ_CONFIG_FILE.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$port
vm_memory_high_watermark.absolute = 256MiB
disk_free_limit.absolute = 50MB
cluster_partition_handling = pause_minority
log.console = false
log.file.level = warning
CONF
        chown -R rabbitmq:rabbitmq "$base/rabbitmq" 2>/dev/null || true
        pgrep -x epmd >/dev/null || epmd -address 127.0.0.1 -daemon
        nohup rabbitmq-server >"$base/rabbitmq/fe-c$n.out" 2>&1 &
    )
}

rabbitctl() {
    local n=$1; shift
    (rabbit_env "$n"; rabbitmqctl -n "fe-c$n@localhost" "$@")
}

start_rabbitmq() {
    local fresh=0
    [ -d "$base/rabbitmq/fe-c1/mnesia" ] || fresh=1
    for n in 1 2 3; do start_rabbit_node "$n"; done
    for n in 1 2 3; do
        wait_port $((5680 + n)) "rabbitmq fe-c$n"
        rabbitctl "$n" await_startup >/dev/null
    done
    if [ "$fresh" = 1 ]; then
        for n in 2 3; do
            rabbitctl "$n" stop_app >/dev/null
            rabbitctl "$n" join_cluster fe-c1@localhost >/dev/null
            rabbitctl "$n" start_app >/dev/null
        done
    fi
}

# ---- Redis with a replica and three Sentinels ------------------------------------------------
start_redis() {
    local dir="$base/redis"
    mkdir -p "$dir"
    local fresh=0
    [ -f "$dir/sentinel-1.conf" ] || fresh=1
    for port in 6391 6392; do
        member_running "$port" "$dir/redis-$port.pid" "redis $port" && continue
        local conf="$dir/redis-$port.conf"
        if [ "$fresh" = 1 ] || [ ! -f "$conf" ]; then
            {
                echo "bind 127.0.0.1"; echo "port $port"; echo "dir $dir"
                echo "dbfilename dump-$port.rdb"; echo 'save ""'; echo "appendonly no"
                echo "logfile $dir/redis-$port.log"; echo "daemonize yes"
                [ "$port" = 6392 ] && echo "replicaof 127.0.0.1 6391"
            } >"$conf"
        fi
        # A server that comes back after a failover is made a replica of the new master by the
        # Sentinels (they rewrite its configuration file).
        redis-server "$conf" --pidfile "$dir/redis-$port.pid"
        wait_port "$port" "redis $port"
    done
    for n in 1 2 3; do
        local port=$((26390 + n)) conf="$dir/sentinel-$n.conf"
        member_running "$port" "$dir/sentinel-$n.pid" "redis-sentinel $n" && continue
        if [ ! -f "$conf" ]; then
            cat >"$conf" <<CONF
bind 127.0.0.1
port $port
dir $dir
logfile $dir/sentinel-$n.log
daemonize yes
sentinel monitor fe-cluster 127.0.0.1 6391 2
sentinel down-after-milliseconds fe-cluster 1000
sentinel failover-timeout fe-cluster 10000
sentinel parallel-syncs fe-cluster 1
CONF
        fi
        redis-sentinel "$conf" --pidfile "$dir/sentinel-$n.pid"
        wait_port "$port" "redis-sentinel $port"
    done
}

# ---- ZooKeeper ensemble ----------------------------------------------------------------------
start_zookeeper() {
    local dir="$base/zookeeper"
    for n in 1 2 3; do
        local port=$((2190 + n)) member="$dir/zk$n"
        member_running "$port" "$member/pid" "zookeeper zk$n" && continue
        mkdir -p "$member/data"
        echo "$n" >"$member/data/myid"
        cat >"$member/zoo.cfg" <<CFG
tickTime=500
initLimit=20
syncLimit=5
dataDir=$member/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
maxSessionTimeout=60000
minSessionTimeout=1000
4lw.commands.whitelist=ruok,srvr,stat,mntr
server.1=127.0.0.1:2891:3891
server.2=127.0.0.1:2892:3892
server.3=127.0.0.1:2893:3893
CFG
        cp /etc/zookeeper/conf/log4j.properties "$member/" 2>/dev/null || true
        nohup java -Xmx96m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            -Dzookeeper.log.dir="$member" -Dzookeeper.root.logger=WARN,CONSOLE \
            -cp "$member:/usr/share/java/zookeeper.jar:/usr/share/java/*" \
            org.apache.zookeeper.server.quorum.QuorumPeerMain "$member/zoo.cfg" \
            >"$member/zookeeper.out" 2>&1 &
        echo $! >"$member/pid"
    done
    for n in 1 2 3; do wait_port $((2190 + n)) "zookeeper zk$n"; done
}

# ---- etcd cluster ----------------------------------------------------------------------------
start_etcd() {
    local dir="$base/etcd" cluster=""
    for n in 1 2 3; do cluster="$cluster${cluster:+,}fe-e$n=http://127.0.0.1:$((2490 + n))"; done
    for n in 1 2 3; do
        local port=$((2390 + n)) peer=$((2490 + n)) state=new
        member_running "$port" "$dir/fe-e$n.pid" "etcd fe-e$n" && continue
        mkdir -p "$dir"
        [ -d "$dir/fe-e$n" ] && state=existing
        nohup etcd --name "fe-e$n" --data-dir "$dir/fe-e$n" \
            --listen-client-urls "http://127.0.0.1:$port" \
            --advertise-client-urls "http://127.0.0.1:$port" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "$cluster" --initial-cluster-state "$state" \
            --initial-cluster-token fe-cluster --quota-backend-bytes 67108864 \
            >"$dir/fe-e$n.out" 2>&1 &
        echo $! >"$dir/fe-e$n.pid"
    done
    for n in 1 2 3; do wait_port $((2390 + n)) "etcd fe-e$n"; done
}

# ---- MariaDB ---------------------------------------------------------------------------------
start_mariadb() {
    local dir="$base/mariadb"
    member_running 3316 "$dir/mariadb.pid" mariadb && return 0
    mkdir -p "$dir"
    chown mysql:mysql "$dir" 2>/dev/null || true
    if [ ! -d "$dir/data/mysql" ]; then
        mariadb-install-db --user=mysql --datadir="$dir/data" --skip-test-db \
            --auth-root-authentication-method=socket >"$dir/install.log" 2>&1
    fi
    nohup mariadbd --user=mysql --datadir="$dir/data" --bind-address=127.0.0.1 --port=3316 \
        --socket="$dir/mariadb.sock" --pid-file="$dir/mariadb.pid" --skip-name-resolve \
        --innodb-buffer-pool-size=32M --performance-schema=OFF --max-connections=200 \
        --log-error="$dir/error.log" >"$dir/mariadb.out" 2>&1 &
    wait_port 3316 mariadb
    mariadb --socket="$dir/mariadb.sock" -uroot -e "
        CREATE USER IF NOT EXISTS 'flowengine'@'127.0.0.1' IDENTIFIED BY 'flowengine-secret';
        GRANT ALL PRIVILEGES ON *.* TO 'flowengine'@'127.0.0.1';"
}

# Ends process $1 (SIGTERM, then SIGKILL after 30 s) and returns once it is gone, so its ports
# and data folder are free for the next start.
end_pid() {
    local pid=$1
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
}

stop_all() {
    local pids=()
    for n in 1 2 3; do
        pids+=("$(pid_of "$base/rabbitmq/fe-c$n.pid")" "$(pid_of "$base/zookeeper/zk$n/pid")"
               "$(pid_of "$base/etcd/fe-e$n.pid")")
    done
    pids+=("$(pid_of "$base/mariadb/mariadb.pid")")
    for port in 26391 26392 26393 6391 6392; do
        # A server that is down (a test killed it) answers nothing: that is no error here.
        pids+=("$( (redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null || true) \
                  | sed -n 's/^process_id:\([0-9]*\).*/\1/p')")
    done
    for pid in "${pids[@]}"; do [ -n "$pid" ] && end_pid "$pid" & done
    wait
    # A pid file left behind would name some later, unrelated process of the same number.
    rm -f "$base"/rabbitmq/*.pid "$base"/zookeeper/zk*/pid "$base"/etcd/*.pid \
          "$base"/mariadb/mariadb.pid "$base"/redis/*.pid
}

# Sourced (tests/unit/test_cluster_harness.py), the script only defines the functions above.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

mkdir -p "$base"
if [ -z "${FLOWENGINE_CLUSTER_LOCKED:-}" ]; then
    # -o: the lock stays with flock itself, not with the servers the script leaves running.
    FLOWENGINE_CLUSTER_LOCKED=1 exec flock -o "$base/.lock" bash "$0" "$@"
fi
action="${1:-start}"
case "$action" in
    start) shift || true
           services=("$@")
           [ ${#services[@]} -gt 0 ] || services=(mariadb redis etcd zookeeper rabbitmq)
           for service in "${services[@]}"; do
               case "$service" in
                   mariadb|redis|etcd|zookeeper|rabbitmq) "start_$service";;
                   *) echo "unknown service: $service" >&2; exit 2;;
               esac
           done
           echo "cluster up: rabbitmq 5681-5683, redis 6391/6392 + sentinels 26391-26393," \
                "zookeeper 2191-2193, etcd 2391-2393, mariadb 3316";;
    stop) stop_all;;
    wipe) stop_all; rm -rf "$base";;
    *) echo "usage: $0 start|stop|wipe" >&2; exit 2;;
esac
