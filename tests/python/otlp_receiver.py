#!/usr/bin/env python3
"""A small OTLP trace receiver for the tracing test: OTLP/HTTP (protobuf, POST /v1/traces) and OTLP/gRPC
(TraceService/Export), decoded with the opentelemetry-proto classes. Every span received is appended to OUT as one
JSON line: trace and span ids in hex, the parent's, name, kind, the resource's service.name, attributes, times.

Usage: otlp_receiver.py OUT  -> prints "ready http=PORT grpc=PORT" once both listen (loopback, free ports).
"""
import gzip
import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

OUT = sys.argv[1]
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return str(getattr(v, kind))
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def record(request, transport):
    lines = []
    for rs in request.resource_spans:
        resource = {a.key: value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append(json.dumps({
                    "transport": transport,
                    "service": resource.get("service.name"),
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "trace_state": s.trace_state,
                    "name": s.name,
                    "kind": s.kind,
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "attributes": {a.key: value(a.value) for a in s.attributes},
                    "events": [e.name for e in s.events],
                }))
    with LOCK, open(OUT, "a") as f:
        for line in lines:
            f.write(line + "\n")


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(400)
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        record(request, "http")
        out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


class Grpc(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        record(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Grpc(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"ready http={http.server_address[1]} grpc={grpc_port}", flush=True)
    http.serve_forever()


if __name__ == "__main__":
    main()
