#!/usr/bin/env python3
"""Loads an `iolab trace` file with Perfetto's own trace processor and checks its slices.

Usage:
  check_trace.py --probe                      exit 0 if the check can run here, else
                                              print why not and exit 1
  check_trace.py TRACE.json [--expect-slices N]

The trace processor is the `perfetto` Python package's: it runs the trace_processor_shell
binary, which the package downloads on first use (and caches under
~/.local/share/perfetto/prebuilts). Set TRACE_PROCESSOR_SHELL to use a binary already on
disk instead.

Checks: the processor imported every slice (N of them when given); durations are
non-negative; there is a thread track per virtual CPU with slices named as iolab names
them; on every CPU track the top-level slices do not overlap; nested slices lie within
their parents.
"""

import os
import sys


def processor(trace):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    shell = os.environ.get("TRACE_PROCESSOR_SHELL")
    config = TraceProcessorConfig(bin_path=shell) if shell else TraceProcessorConfig()
    return TraceProcessor(trace=trace, config=config)


def rows(tp, sql):
    return list(tp.query(sql))


def probe():
    try:
        import perfetto  # noqa: F401
    except ImportError as e:
        print(f"the perfetto Python package is not installed ({e}); pip install perfetto")
        return 1
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": [{"ph": "X", "name": "p", "pid": 1, "tid": 1,
                                    "ts": 1.0, "dur": 1.0}]}, f)
        path = f.name
    try:
        tp = processor(path)
        n = rows(tp, "select count(*) as n from slice")[0].n
        tp.close()
        if n != 1:
            print(f"the trace processor read {n} slices from a one-slice probe trace")
            return 1
    except Exception as e:  # the shell could not be downloaded or started
        print("the perfetto package is installed but its trace processor could not run "
              f"(it downloads trace_processor_shell on first use): {type(e).__name__}: {e}")
        return 1
    finally:
        os.unlink(path)
    return 0


def check(trace, expect):
    tp = processor(trace)
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
    cpu_tracks = [r for r in per_track if r.process and r.process.endswith("CPUs")
                  and r.thread and r.thread.startswith("cpu ")]
    for r in per_track[:12]:
        print(f"  {r.process} / {r.thread}: {r.n}")
    if len(per_track) > 12:
        print(f"  ... {len(per_track)} tracks with slices")
    if not cpu_tracks:
        failures.append("no CPU thread track with slices")

    names = {r.name for r in rows(tp, "select distinct name from slice")}
    print(f"names: {sorted(names)}")
    for wanted in ("system",):
        if wanted not in names:
            failures.append(f"no slice named {wanted!r}")

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
    if "--expect-slices" in argv:
        expect = int(argv[argv.index("--expect-slices") + 1])
    return check(argv[1], expect)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
