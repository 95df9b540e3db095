"""How late a sleeping task on one core wakes: a loop pinned to CPU that sleeps 1 ms and
records how much longer than 1 ms each sleep took (a stand-in for the benchmark client and
the API server, which wait on sockets). Run it beside a `vllm bench serve` run to see what
the processes on that core get. Usage (any python):
  python results/vllm_cpu/core_wake_probe.py CPU SECONDS OUT.json
OUT.json: the wall-clock start and [seconds since start, lateness in ms] per sleep. Then
  python results/vllm_cpu/core_wake_probe.py --summary OUT.json BENCH_RESULT.json [SUMMARY.json]
sets the lateness before the server (the probe's first 5 s: start it before the server)
against during the bench (its window from its result's `date`, to the second, and `duration`).
"""
import datetime
import json
import os
import sys
import time


def probe(cpu: int, seconds: float, out: str) -> None:
  os.sched_setaffinity(0, {cpu})
  start = time.time()
  late = []
  while time.time() - start < seconds:
    before = time.perf_counter()
    time.sleep(0.001)
    late.append(
        [round(time.time() - start, 4),
         round(1e3 * (time.perf_counter() - before - 1e-3), 3)])
  with open(out + ".tmp", "w") as f:
    json.dump({"cpu": cpu, "start_wall_s": start, "sleep_s": 0.001, "late_ms": late}, f)
  os.replace(out + ".tmp", out)


def summary(probe_path: str, bench_path: str) -> dict:
  import numpy as np
  probe_run, bench = json.load(open(probe_path)), json.load(open(bench_path))
  late = np.asarray(probe_run["late_ms"], float).reshape(-1, 2)
  end = datetime.datetime.strptime(bench["date"], "%Y%m%d-%H%M%S").replace(
      tzinfo=datetime.timezone.utc).timestamp() - probe_run["start_wall_s"]
  begin = end - bench["duration"]
  out = {"cpu": probe_run["cpu"], "bench_result": bench_path, "bench_window_s": [begin, end]}
  for name, keep in (("before_the_server", late[:, 0]
                      < 5.0), ("during_the_bench", (late[:, 0] > begin) & (late[:, 0] < end + 1))):
    x = late[keep, 1]
    out[name] = {
        "sleeps": int(len(x)), "p50_ms": float(np.median(x)), "p99_ms": float(np.percentile(x, 99)),
        "max_ms": float(x.max()), "over_20_ms": int((x > 20).sum())
    }
  return out


if __name__ == "__main__":
  if sys.argv[1] == "--summary":
    result = summary(sys.argv[2], sys.argv[3])
    print(json.dumps(result, indent=1))
    if len(sys.argv) > 4:
      from jaxroof import files
      files.write_json(
          sys.argv[4], {
              "kind": "measurement", "what": "lateness of a 1 ms sleep "
                                             "on one core (core_wake_probe.py)", **result
          })
  else:
    probe(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
