# A single-node Apache Kafka (KRaft: broker and controller in one JVM) on a free loopback
# port, for scripts/demo and scripts/bench; sourced, not run. The settings are the tests'
# broker's (tests/common/broker.rs). The caller defines `fail MESSAGE` (prints, exits
# non-zero) and sets `kafka_dir` to what scripts/install-kafka printed.
#
#   kafka_start_on_free_port DIR PARTITIONS [JVM_OPTION ...]
#       data, settings and logs in DIR (broker.log there); topics created on first use
#       get PARTITIONS partitions. Sets kafka_pid and kafka_port once the port accepts
#       connections; stop it with `kill $kafka_pid` (SIGTERM: a controlled shutdown).

# A port nothing listens on now (it may be taken before it is used: callers retry).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Formats DIR/kafka and starts the broker with its client listener on port $1 in the
# background: kafka_start PORT DIR PARTITIONS [JVM_OPTION ...]; sets kafka_pid.
kafka_start() {
    local port=$1 dir=$2 partitions=$3 controller data="$2/kafka"
    shift 3
    controller="$(free_port)"
    rm -rf "$data"
    mkdir -p "$data"
    cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
num.partitions=$partitions
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=500
PROPS
    local java_cp=(-Dlog4j2.configurationFile="$kafka_dir/log4j2.properties" -cp "$kafka_dir/libs/*")
    java -Xmx256m "${java_cp[@]}" kafka.tools.StorageTool format --cluster-id YWNrZC10ZXN0LWNsdXN0ZQ \
        --config "$dir/server.properties" >"$dir/format.log" 2>&1 ||
        fail "kafka storage format failed: $(cat "$dir/format.log")"
    java "$@" "${java_cp[@]}" kafka.Kafka "$dir/server.properties" \
        >"$dir/broker.log" 2>&1 </dev/null &
    kafka_pid=$!
}

kafka_start_on_free_port() {
    local dir=$1 partitions=$2 candidate deadline attempt
    shift 2
    kafka_port=""
    for attempt in 1 2 3; do
        candidate="$(free_port)"
        kafka_start "$candidate" "$dir" "$partitions" "$@"
        deadline=$((SECONDS + 60))
        while kill -0 "$kafka_pid" 2>/dev/null && ! port_open "$candidate"; do
            [ "$SECONDS" -lt "$deadline" ] || fail "Kafka did not accept connections within 60 s (log: $dir/broker.log)"
            sleep 0.05
        done
        if kill -0 "$kafka_pid" 2>/dev/null; then
            kafka_port=$candidate
            return 0
        fi
        wait "$kafka_pid" 2>/dev/null || true
        kafka_pid=""
        printf 'attempt %s: Kafka exited at once (port %s taken?)\n' "$attempt" "$candidate" >&2
    done
    fail "Kafka would not start; log: $dir/broker.log"
}
