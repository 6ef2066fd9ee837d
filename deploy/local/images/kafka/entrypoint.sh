#!/bin/bash
# The Kafka image's entry point: writes /opt/kafka/config/server.properties from the environment (as
# the apache/kafka image does: KAFKA_FOO_BAR=v becomes foo.bar=v; KAFKA_HEAP_OPTS, KAFKA_JVM_OPTS are
# the JVM's), formats KAFKA_LOG_DIRS with CLUSTER_ID on first start, then runs the broker in the
# foreground (SIGTERM: a controlled shutdown). Defaults: a single-node KRaft broker+controller,
# PLAINTEXT on 9092 advertised as localhost:9092, controller on 9093.
set -euo pipefail
: "${CLUSTER_ID:=kp9CjrQNTeCOu_gWMsgw5Q}"
: "${KAFKA_NODE_ID:=1}"
: "${KAFKA_PROCESS_ROLES:=broker,controller}"
: "${KAFKA_CONTROLLER_QUORUM_VOTERS:=${KAFKA_NODE_ID}@localhost:9093}"
: "${KAFKA_LISTENERS:=PLAINTEXT://:9092,CONTROLLER://:9093}"
: "${KAFKA_ADVERTISED_LISTENERS:=PLAINTEXT://localhost:9092}"
: "${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP:=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT}"
: "${KAFKA_INTER_BROKER_LISTENER_NAME:=PLAINTEXT}"
: "${KAFKA_CONTROLLER_LISTENER_NAMES:=CONTROLLER}"
: "${KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR:=1}"
: "${KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR:=1}"
: "${KAFKA_TRANSACTION_STATE_LOG_MIN_ISR:=1}"
: "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR:=1}"
: "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR:=1}"
: "${KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS:=0}"
: "${KAFKA_LOG_DIRS:=/var/lib/kafka/data}"
export KAFKA_NODE_ID KAFKA_PROCESS_ROLES KAFKA_CONTROLLER_QUORUM_VOTERS KAFKA_LISTENERS \
  KAFKA_ADVERTISED_LISTENERS KAFKA_LISTENER_SECURITY_PROTOCOL_MAP KAFKA_INTER_BROKER_LISTENER_NAME \
  KAFKA_CONTROLLER_LISTENER_NAMES KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR \
  KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR KAFKA_TRANSACTION_STATE_LOG_MIN_ISR \
  KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR \
  KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS KAFKA_LOG_DIRS

config=/opt/kafka/config/server.properties
: >"$config"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS | KAFKA_JVM_OPTS) continue ;; # the JVM's, not the broker's
    KAFKA_*) key="${name#KAFKA_}" ;;
    *) continue ;;
  esac
  key="${key,,}"
  echo "${key//_/.}=$value" >>"$config"
done < <(env)

jvm=(-cp '/opt/kafka/libs/*' -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -Dkafka.logs.dir=/tmp
  -Djava.awt.headless=true -XX:+UseSerialGC -XX:TieredStopAtLevel=1)
if [ ! -f "${KAFKA_LOG_DIRS%%,*}/meta.properties" ]; then
  java -Xmx256m "${jvm[@]}" kafka.tools.StorageTool format --cluster-id="$CLUSTER_ID" -c "$config" \
    --ignore-formatted >/dev/null
fi
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} ${KAFKA_JVM_OPTS:-} "${jvm[@]}" kafka.Kafka "$config"
