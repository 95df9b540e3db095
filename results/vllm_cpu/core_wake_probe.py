"""How late a sleeping task on one core wakes: a loop pinned to CPU that sleeps 1 ms and
records how much longer than 1 ms each sleep took (a stand-in for the benchmark client and
the API server, which wait on sockets). Run it beside a `vllm bench serve` run to see what
the processes on that core get. Usage (any python):
  python results/vllm_cpu/core_wake_probe.py CPU SECONDS OUT.json
OUT.json: the wall-clock start and [seconds since start, lateness in ms] per sleep.
"""
import json
import os
import sys
import time

if __name__ == "__main__":
  cpu, seconds, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
  os.sched_setaffinity(0, {cpu})
  start = time.time()
  late = []
  while time.time() - start < seconds:
    before = time.perf_counter()
    time.sleep(0.001)
    late.append([round(time.time() - start, 4), round(1e3 * (time.perf_counter() - before - 1e-3), 3)])
  with open(out + ".tmp", "w") as f:
    json.dump({"cpu": cpu, "start_wall_s": start, "sleep_s": 0.001, "late_ms": late}, f)
  os.replace(out + ".tmp", out)
