-- 0001: event log, input log, consumer positions and snapshots, per pool.
-- Applied by gpuquota.adapters.migrate.apply_migrations inside one transaction.

-- Every event the scheduler decided, in decision order per pool. (pool, seq) is the
-- optimistic-concurrency key: seq is assigned by the single writer of the pool.
CREATE TABLE events (
    pool           text        NOT NULL,
    seq            bigint      NOT NULL CHECK (seq >= 0),
    event_id       text        NOT NULL UNIQUE,
    event_type     text        NOT NULL,
    schema_version smallint    NOT NULL DEFAULT 1,
    occurred_at    timestamptz NOT NULL,
    data           jsonb       NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, seq)
);

-- Every input (command / observation) consumed from Kafka, in processing order per pool;
-- input_id makes re-delivery idempotent, the source_* columns record where it came from.
CREATE TABLE inputs (
    pool             text   NOT NULL,
    input_seq        bigint NOT NULL CHECK (input_seq >= 0),
    input_id         text   NOT NULL UNIQUE,
    source_topic     text,
    source_partition int,
    source_offset    bigint,
    data             jsonb  NOT NULL,
    PRIMARY KEY (pool, input_seq)
);

-- Next Kafka offset to consume per pool and partition, written in the same transaction as the
-- events and inputs it produced (DB-owned offsets; Kafka's committed offsets are advisory).
CREATE TABLE consumer_positions (
    pool        text   NOT NULL,
    topic       text   NOT NULL,
    partition   int    NOT NULL CHECK (partition >= 0),
    next_offset bigint NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (pool, topic, partition)
);

-- State of a pool after applying events up to and including seq.
CREATE TABLE snapshots (
    pool           text        NOT NULL,
    seq            bigint      NOT NULL CHECK (seq >= 0),
    schema_version smallint    NOT NULL,
    state          jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, seq)
);
