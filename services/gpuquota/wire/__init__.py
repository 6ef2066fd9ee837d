"""The wire contract: every message gpuquota's services exchange, as frozen pydantic models."""
