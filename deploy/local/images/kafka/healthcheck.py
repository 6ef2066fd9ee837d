"""The Kafka image's HEALTHCHECK: exit 0 when the broker on 127.0.0.1:9092 (or $1) answers ApiVersions.

A Kafka ApiVersions v0 request in a few bytes (no client library, no JVM: the check runs every few
seconds); a broker answers it once its listener is up, before topics exist.
"""

import socket
import struct
import sys

address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
host, _, port = address.rpartition(":")
client_id = b"healthcheck"
# request header v1: api_key 18 (ApiVersions), api_version 0, correlation id 1, client id
body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
try:
    with socket.create_connection((host, int(port)), timeout=4) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = sock.recv(10)
except OSError as exc:
    print(f"kafka healthcheck: {address}: {exc}", file=sys.stderr)
    sys.exit(1)
# response: length, correlation id 1, error code 0
ok = len(head) >= 10 and struct.unpack(">iih", head[:10])[1:] == (1, 0)
sys.exit(0 if ok else 1)
