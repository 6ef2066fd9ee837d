-- 0002: the log is read from `inputs`; snapshots are opaque bytes.
-- Applied by gpuquota.adapters.migrate.apply_migrations inside one transaction.

-- One row per decided input: the input (data) and the events decided for it, in order. Reading the
-- log is one index range scan over (pool, input_seq); input_seq is the store's `seq`.
ALTER TABLE inputs ADD COLUMN events jsonb NOT NULL DEFAULT '[]'::jsonb;

-- Each event row names the input it was decided for. events.seq stays a per-pool event position.
ALTER TABLE events ADD COLUMN input_seq bigint;
ALTER TABLE events
    ADD CONSTRAINT events_input_fkey FOREIGN KEY (pool, input_seq) REFERENCES inputs (pool, input_seq);

-- Snapshots hold gpuquota.adapters.snapshots' versioned pickle, not JSON. An old JSON snapshot is
-- kept as its bytes, which fail the version check on load (the state is then rebuilt from the log).
ALTER TABLE snapshots ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8');
