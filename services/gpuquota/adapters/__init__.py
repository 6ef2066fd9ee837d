"""I/O adapters (PostgreSQL, Kafka, ...) around the pure scheduling core."""
